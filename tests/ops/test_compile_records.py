"""The committed compile-gate records of the older Tritons (bench/results/compile-triton-*.json).

CI compiles the kernels with the newest Triton on every run (test_compile_gate.py); the
older Tritons of the declared range are checked by records of
``python -m bench.compile_check --triton VERSION --record``. A record says something
only about the kernel sources it was made from: once a kernel file changes, these tests
fail until the command is run again and its record committed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.compile_records import KERNEL_DIR, RECORDED_TRITONS, kernels_hash, record_path
from nsa.ops.self_check import triton_too_old


def test_the_kernels_hash_follows_every_kernel_source(tmp_path: Path) -> None:
    for path in KERNEL_DIR.glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    before = kernels_hash(tmp_path)
    assert before == kernels_hash(KERNEL_DIR)
    (tmp_path / "notes.txt").write_text("not a kernel source")
    assert kernels_hash(tmp_path) == before
    band = tmp_path / "band.py"
    band.write_text(band.read_text() + "\n")  # even a blank line: line numbers are in the compiled code
    assert kernels_hash(tmp_path) != before
    band.unlink()
    assert kernels_hash(tmp_path) != before
    (tmp_path / "new_kernels.py").write_text("")
    assert kernels_hash(tmp_path) != before


@pytest.mark.parametrize("version", RECORDED_TRITONS)
def test_each_older_triton_has_a_complete_record_of_these_kernels(version: str) -> None:
    rerun = f"run `python -m bench.compile_check --triton {version} --record` and commit its record"
    path = record_path(version)
    assert path.exists(), f"no record of the gate under Triton {version}: {rerun}"
    record = json.loads(path.read_text())
    assert record["triton"] == version
    changed = f"the kernels changed since {path.name} was made: {rerun}"
    assert record["kernels_sha256"] == kernels_hash(), changed
    assert record["archs"] == [80, 90]
    assert record["complete"], (f"{path.name} is partial ({record['compiled']} of {record['compiles']} "
                                f"compiles): {rerun}")
    assert record["compiled"] == record["compiles"] > 0
    assert record["uncovered"] == []
    # the declared range is what these records prove: a Triton at or above the self-check's
    # floor (MIN_TRITON) compiles every kernel with no error, spill or shared-memory
    # overflow; one below it fails somewhere (else the floor is higher than needed)
    bad = [line for line in record["lines"] if line.startswith("FAIL")]
    assert bool(bad) == bool(record["errors"] or record["spills"] or record["smem_over"])
    if triton_too_old(version) is None:
        shown = "\n".join(bad[:10])
        assert record["passed"] and not bad, f"Triton {version} is at or above MIN_TRITON but:\n{shown}"
    else:
        lower = "no spill: lower MIN_TRITON in nsa/ops/self_check.py (and docs/install.md)"
        assert not record["passed"] and bad, f"Triton {version} now compiles every kernel with {lower}"


def test_a_record_is_reused_only_for_the_same_compiles_of_the_same_kernels_passed(tmp_path: Path) -> None:
    """``--reuse-record``: the installed Triton's record stands for the gate only when it holds
    exactly the compiles the gate would run now, of these kernels, complete and passed."""
    triton = pytest.importorskip("triton")
    from bench.compile_records import reusable_record, work_hash

    keys = ["('nsa.ops.triton.band', '_band_fwd', 90, ...)['nsa-125m fwd']", "('...', '_sel_fwd', 80, ...)[]"]
    fingerprint = work_hash(keys)
    assert work_hash(list(reversed(keys))) == fingerprint  # the gate's order of work is not the point
    assert work_hash(keys[:1]) != fingerprint and work_hash([*keys, "another compile"]) != fingerprint
    good = {"triton": triton.__version__, "kernels_sha256": kernels_hash(), "work_sha256": fingerprint,
            "complete": True, "passed": True, "compiles": 2, "started": "2026-11-27T00:00:00Z"}
    path = record_path(triton.__version__, tmp_path)
    assert reusable_record(fingerprint, tmp_path) is None  # no record
    for change, reused in [({}, True), ({"passed": False}, False), ({"complete": False}, False),
                           ({"kernels_sha256": "0" * 64}, False), ({"triton": "3.1.0"}, False),
                           ({"work_sha256": work_hash(keys[:1])}, False)]:
        path.write_text(json.dumps({**good, **change}))
        assert (reusable_record(fingerprint, tmp_path) is not None) == reused, change
    path.write_text("{not json")
    assert reusable_record(fingerprint, tmp_path) is None
