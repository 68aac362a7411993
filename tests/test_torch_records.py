"""The declared torch range is the proven one: pyproject's ``host`` extra, ``nsa.torch_range``,
the records of ``python -m bench.torch_compat`` and docs/install.md's table agree, and every
minor release the range admits has a record in which every test of the suite ran and none failed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from bench.torch_compat import SUITE, record_path
from nsa.torch_range import BELOW, OLDEST, TESTED, minor, outside_tested

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def declared() -> Requirement:
    tomllib = pytest.importorskip("tomllib")
    host = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["host"]
    (torch,) = [Requirement(d) for d in host if Requirement(d).name == "torch"]
    return torch


def admitted_minors(req: Requirement) -> list[tuple[int, int]]:
    """Every (2, minor) release line with a release (x.y.0 to x.y.9) that ``req`` admits; a range
    with no upper bound admits lines no record can cover."""
    return [(2, m) for m in range(0, 100) if any(Version(f"2.{m}.{p}") in req.specifier for p in range(10))]


def records() -> dict[tuple[int, int], dict]:
    out = {}
    for path in sorted(RESULTS.glob("torch-*.json")):
        rec = json.loads(path.read_text())
        line = minor(rec["torch"])
        assert line is not None and path == record_path(rec["torch"].split("+")[0]), path
        out[line] = rec
    return out


def test_pyproject_declares_the_tested_range() -> None:
    assert declared().specifier == SpecifierSet(TESTED), (str(declared()), TESTED)


def test_every_release_line_the_range_admits_has_a_passing_record() -> None:
    have = records()
    admitted = admitted_minors(declared())
    assert admitted and admitted[0] == OLDEST and admitted[-1] < BELOW, admitted
    missing = [f"{a}.{b}" for a, b in admitted if (a, b) not in have]
    assert not missing, f"torch {', '.join(missing)} admitted by pyproject with no record: run " \
                        "python -m bench.torch_compat --torch VERSION --record (or narrow the range)"
    for line in admitted:
        rec = have[line]
        assert rec["suite"] == list(SUITE), f"torch {rec['torch']}: recorded on another suite"
        assert rec["failed"] == rec["error"] == 0 and rec["pytest_exit"] == 0, \
            (rec["torch"], {k: v for k, v in rec["tests"].items() if v in ("failed", "error")})
        for path in SUITE:  # every file of the suite really ran
            module = path.removesuffix(".py").replace("/", ".")
            ran = [k for k, v in rec["tests"].items() if k.startswith(module + "::") and v == "passed"]
            assert ran, f"torch {rec['torch']}: no test of {path} passed"


def test_no_record_lies_outside_the_range_unless_it_failed() -> None:
    """A passing record outside the range means the range could be wider: say it in the range."""
    req = declared()
    for rec in records().values():
        if Version(rec["torch"].split("+")[0]) not in req.specifier:
            assert rec["failed"] or rec["error"], f"torch {rec['torch']} passes: widen the range to it"


def test_docs_table_lists_every_record() -> None:
    text = (REPO / "docs" / "install.md").read_text()
    assert f"`torch{TESTED}`" in text
    for rec in records().values():
        row = [line for line in text.splitlines() if line.startswith(f"| {rec['torch']} ")]
        assert row, f"docs/install.md has no row for torch {rec['torch']}"
        assert re.search(rf"\b{rec['passed']} passed\b", row[0]), (row[0], rec["passed"])


@pytest.mark.parametrize(("version", "inside"), [("2.10.0", False), ("2.11.0+cu130", True),
                                                 ("2.13.0+cpu", True), ("2.14.1", True), ("2.15.0", False),
                                                 ("3.0.0", False)])
def test_a_torch_outside_the_range_is_named(version: str, inside: bool) -> None:
    warning = outside_tested(version)
    assert (warning is None) == inside, warning
    if warning:
        assert f"torch {version}" in warning and f"torch{TESTED}" in warning
