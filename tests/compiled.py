"""Children that run the compiled kernels' code: the suite sets ``TRITON_INTERPRET=1`` before
any import (tests/conftest.py), under which ``@triton.jit`` gives interpreted functions that
Triton's compiler, the compile gate and the launch capture cannot use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compiled_env(*extra: Path) -> dict[str, str]:
    """This environment without ``TRITON_INTERPRET``, the repository (and ``extra``) importable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def run_compiled(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the repository's root under ``compiled_env()``, output captured."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=compiled_env(), capture_output=True,
                          text=True, timeout=timeout)
