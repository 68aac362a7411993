"""The README's test command shows its progress per test file (a 20-minute run must not look hung)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_test_script_prints_a_line_per_test_file() -> None:
    script = (REPO / "scripts" / "test.sh").read_text().splitlines()
    words = shlex.split(next(ln for ln in script if ln.startswith("exec ")))
    args = [a for a in words[words.index("pytest") + 1:] if a != "$@"]
    out = subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider",
                          "tests/test_contract_docs.py", "tests/test_cli_runs.py", "-k", "drift or prefix"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    for name in ("tests/test_contract_docs.py", "tests/test_cli_runs.py"):
        assert re.search(rf"^{re.escape(name)} \.+\s+\[\s*\d+%\]$", out.stdout, re.M), out.stdout
