"""The compile gate under other Tritons, and its records: ``--triton VERSION [--record]``.

Each version runs in its own virtual environment (``~/.cache/nsa-tui/triton-venvs/VERSION``
or under ``$NSA_TRITON_VENVS``, with the system site packages for torch); a record
(``bench/results/compile-triton-VERSION.json``) holds the verdict, every line and the hash
of the kernels' source, so a test can tell when the kernels changed after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.compile_check import Result

ROOT = Path(__file__).resolve().parents[1]


KERNEL_DIR = ROOT / "nsa" / "ops" / "triton"
RESULTS_DIR = ROOT / "bench" / "results"
# Checked through committed records (--triton V --record): the oldest Triton of the
# declared range (torch 2.5's) and the one of the lent GPU machines (torch 2.11's).
RECORDED_TRITONS = ("3.1.0", "3.6.0")


# ----------------------------------------------------------------------------- other Tritons, records


def kernels_hash(kernel_dir: Path = KERNEL_DIR) -> str:
    """sha256 of the kernels' source files (names and bytes): a record made before a
    change to any of them no longer says anything about them."""
    h = hashlib.sha256()
    for path in sorted(kernel_dir.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def record_path(version: str, results_dir: Path = RESULTS_DIR) -> Path:
    return results_dir / f"compile-triton-{version}.json"


def work_hash(keys: list[str]) -> str:
    """sha256 of what the gate would compile (each distinct compile's key: kernel, signature,
    constexprs, attributes, options, and its launch cases) and of the gate's own code (how a
    compile is judged): equal hashes under one Triton mean the same compiles, the same verdicts."""
    h = hashlib.sha256((ROOT / "bench" / "compile_check.py").read_bytes())
    for key in sorted(keys):
        h.update(b"\0" + key.encode())
    return h.hexdigest()


def reusable_record(fingerprint: str, results_dir: Path = RESULTS_DIR) -> dict[str, Any] | None:
    """The installed Triton's record when it is complete, passed and made of exactly these
    compiles (``work_hash``) of exactly these kernels (``kernels_hash``); else None. Compiling
    is deterministic: the same inputs under the same Triton give the same code and the same
    registers and spills, so such a record is the gate's result without its 5-25 minutes."""
    import triton

    path = record_path(triton.__version__, results_dir)
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = (rec.get("triton") == triton.__version__ and rec.get("work_sha256") == fingerprint
            and rec.get("kernels_sha256") == kernels_hash())
    return rec if same and rec.get("complete") and rec.get("passed") else None


def venv_dir(version: str) -> Path:
    base = os.environ.get("NSA_TRITON_VENVS") or Path.home() / ".cache" / "nsa-tui" / "triton-venvs"
    return Path(base) / version


def triton_venv(version: str) -> Path:
    """The python of a virtual environment with Triton ``version`` (created on first use,
    with the system site packages for torch; pip installs only Triton)."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ValueError(f"--triton wants a release like 3.1.0, not {version!r}")
    venv = venv_dir(version)
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"compile_check: creating {venv} (system site packages)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    probe = [str(python), "-c", "import triton; print(triton.__version__)"]
    have = subprocess.run(probe, capture_output=True, text=True).stdout.strip()
    if have != version:
        print(f"compile_check: pip install triton=={version} into {venv} (had {have or 'none'})", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"triton=={version}"], check=True)
    return python


def run_under(version: str, argv: list[str]) -> int:
    """This gate, with ``argv``, in Triton ``version``'s environment, on this checkout."""
    python = triton_venv(version)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([str(python), "-m", "bench.compile_check", *argv], cwd=ROOT, env=env).returncode


class Recorder:
    """Builds ``bench/results/compile-triton-VERSION.json`` as the gate runs (rewritten after
    every compile, so a run that is stopped leaves a record that says it is partial)."""

    def __init__(self, archs: list[int], jobs: int, total: int, launch_cases: int,
                 work_sha256: str = "") -> None:
        import platform

        import torch
        import triton

        self.path = record_path(triton.__version__)
        self.start = time.time()
        self.data: dict[str, Any] = {
            "triton": triton.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "kernels_sha256": kernels_hash(), "work_sha256": work_sha256, "archs": archs, "command":
                f"python -m bench.compile_check --triton {triton.__version__} --record",
            "machine": f"compiled on {platform.machine()} CPUs, never run on a GPU; {os.cpu_count()} cores, "
                       f"{jobs} compile jobs, load average {os.getloadavg()[0]:.1f} at start",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.start)),
            "complete": False, "passed": False, "launch_cases": launch_cases, "compiles": total,
            "compiled": 0, "errors": 0, "spills": 0, "smem_over": 0, "uncovered": [], "seconds": 0.0,
            "lines": [],
        }

    def add(self, line: str, res: Result | None = None) -> None:
        d = self.data
        d["lines"].append(line)
        if res is not None:
            d["compiled"] += 1
            d["errors"] += res.error is not None
            d["spills"] += bool(res.spill_stores or res.spill_loads)
            d["smem_over"] += any(p.startswith("shared memory") for p in res.problems)
        self.write()

    def finish(self, passed: bool) -> None:
        self.data["complete"] = self.data["compiled"] == self.data["compiles"]
        self.data["passed"] = passed and self.data["complete"]
        self.data["load_at_end"] = round(os.getloadavg()[0], 1)
        self.write()

    def write(self) -> None:
        self.data["seconds"] = round(time.time() - self.start)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)
