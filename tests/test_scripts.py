"""The README's test command shows its progress as it goes (a 20-minute run must not look hung)."""

from __future__ import annotations

import functools
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_args(workers: str) -> list[str]:
    """The arguments scripts/test.sh gives pytest with NSA_TEST_WORKERS=``workers``."""
    script = (REPO / "scripts" / "test.sh").read_text().splitlines()
    start = next(i for i, ln in enumerate(script) if ln.startswith("workers="))
    end = next(i for i, ln in enumerate(script) if ln.startswith("exec "))
    snippet = "\n".join(script[start:end] + ['printf "%s\\n" "${args[@]}"'])
    out = subprocess.run(["bash", "-c", snippet], env={**os.environ, "NSA_TEST_WORKERS": workers},
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_test_script_shows_each_test_file_as_it_goes(workers: str) -> None:
    """One process: a line per test file with its progress; two workers: a line per test."""
    args = pytest_args(workers)
    assert ("-n" in args) == (workers != "1"), args
    out = subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider",
                          "tests/test_contract_docs.py", "tests/test_cli_runs.py", "-k", "drift or prefix"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    for name in ("tests/test_contract_docs.py", "tests/test_cli_runs.py"):
        line = (rf"^{re.escape(name)} \.+\s+\[\s*\d+%\]$" if workers == "1"
                else rf"^\[gw\d\] \[\s*\d+%\] PASSED {re.escape(name)}::")
        assert re.search(line, out.stdout, re.M), out.stdout


def test_gpu_tests_refuse_the_interpreter_and_say_how_to_run_them() -> None:
    """Under TRITON_INTERPRET=1 a ``gpu`` test would pass on the interpreted kernels even on
    a GPU host: it skips, naming the setting, and runs only with the interpreter off."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "gpu",
                          "tests/ops/test_triton_band.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0 and "run it with TRITON_INTERPRET=0" in out.stdout, out.stdout[-2000:]
    assert re.search(r"\b2 skipped\b", out.stdout), out.stdout[-2000:]


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


def _setup_plan(tmp_path: Path, index: str) -> str:
    """scripts/setup.sh's plan (NSA_SETUP_PLAN=1: nothing installed) for a python without torch."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    env = {**os.environ, "PYTHON": str(venv / "bin" / "python"), "NSA_TORCH_CPU_INDEX": index,
           "NSA_SETUP_PLAN": "1"}
    out = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_setup_takes_the_cpu_build_from_the_cpu_index_where_it_is_reachable(tmp_path: Path) -> None:
    if Path("/dev/nvidia0").exists():
        pytest.skip("this machine has an NVIDIA GPU: setup takes a CUDA build there")
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html></html>\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}"
        said = _setup_plan(tmp_path, index)
    finally:
        server.shutdown()
    assert f"no torch found, no GPU: installing the CPU build torch==2.13.0 from {index}" in said, said


def test_setup_says_so_when_the_cpu_index_cannot_be_reached(tmp_path: Path) -> None:
    if Path("/dev/nvidia0").exists():
        pytest.skip("this machine has an NVIDIA GPU: setup takes a CUDA build there")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    said = _setup_plan(tmp_path, f"http://127.0.0.1:{port}")
    assert f"http://127.0.0.1:{port} cannot be reached: installing torch==2.13.0 from the configured index " \
           "(on PyPI a CUDA build, several GB; it runs on the CPU)" in said, said
