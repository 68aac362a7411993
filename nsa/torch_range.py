"""The torch releases the training side is tested with, and what a run says outside them.

pyproject's ``host`` extra declares exactly this range, and every minor release in it has a
passing record of the tests that lean on torch internals (``bench/results/torch-*.json``,
made by ``python -m bench.torch_compat``; ``tests/test_torch_records.py`` holds the three
together). A torch outside it is not refused: nsa-train says so at start, and the start-up
checkpoint probe still proves the one thing that lost runs before.
"""

from __future__ import annotations

import re

OLDEST = (2, 11)  # the oldest minor release with a passing record
BELOW = (2, 15)  # the first minor release without one
TESTED = f">={OLDEST[0]}.{OLDEST[1]},<{BELOW[0]}.{BELOW[1]}"  # as pyproject writes it


def minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string (``2.11.0+cu130`` -> (2, 11)); None if unreadable."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def outside_tested(version: str) -> str | None:
    """A warning for a torch outside the tested range, or None inside it."""
    got = minor(version)
    if got is not None and OLDEST <= got < BELOW:
        return None
    where = ("older than" if got is not None and got < OLDEST else
             "newer than" if got is not None else "not comparable with")
    return (f"torch {version} is {where} the tested range torch{TESTED} (docs/install.md): the run goes on, "
            "and its checkpoints are proven before the first step, but nothing else is tested with it")
