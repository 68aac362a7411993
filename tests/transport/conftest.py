"""Fixtures: the real sshd (tests/sshd.py) and helpers shared by the host-side tests."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `tests` is not installed; make tests.sshd importable under any runner
    sys.path.insert(0, ROOT)

from tests.sshd import machines, sshd, sshd_nodes  # noqa: E402,F401
