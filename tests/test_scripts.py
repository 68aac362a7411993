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


def test_ci_lints_and_type_checks_before_the_tests() -> None:
    """CI fails on a ruff or mypy error before the long suite runs, and setup installs both."""
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    assert ci.index("bash scripts/lint.sh") < ci.index("bash scripts/test.sh")
    lint = (REPO / "scripts" / "lint.sh").read_text().splitlines()
    steps = [next(i for i, ln in enumerate(lint) if needle in ln and not ln.startswith(("#", "echo")))
             for needle in ("scripts/setup.sh --test", "ruff check .", "-m mypy")]
    assert steps == sorted(steps)
    pyproject = (REPO / "pyproject.toml").read_text()
    test_extra = pyproject[pyproject.index("test = ["):].split("]", 1)[0]
    assert '"mypy' in test_extra and '"ruff' in test_extra
    assert "[tool.mypy]" in pyproject
