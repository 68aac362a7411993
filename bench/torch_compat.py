"""The training-side tests that lean on torch internals, under another torch: its record.

``python -m bench.torch_compat --torch 2.11.0 [--record]`` runs ``SUITE`` (DCP save and resume
at another world size, the legacy checkpoint format, the start-up checkpoint probe, DDP,
FSDP2, activation checkpointing, decoding, sampling and evaluation, the self-check's reference
path, flat gradients, the data loader's process) with that torch, and with ``--record``
writes ``bench/results/torch-VERSION.json``: the versions, every test's outcome, the time, the
commit. ``tests/test_torch_records.py`` fails when
the torch range that pyproject declares admits a release with no passing record.

A torch other than the running one is installed into a virtual environment of its own,
``~/.cache/nsa-tui/torch-venvs/VERSION`` (or under ``$NSA_TORCH_VENVS``), made with the system
site packages so that pip adds only torch and what torch pins (PyPI's wheels are CUDA builds:
about 4.5 GB, once; they import and run on a CPU). The running python's own torch is never
replaced. Each test runs as the suite does in CI: ``TRITON_INTERPRET=1``, this checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
SUITE = (
    "tests/train/test_train_dcp.py",  # DCP: async, resharding 2 -> 1, 2 -> 3, FSDP2, legacy, tampered
    "tests/train/test_checkpoint_probe.py",  # the start-up save, commit and load
    "tests/train/test_train_distributed.py",  # DDP and FSDP2: train, stop and resume exactly
    "tests/train/test_train_checkpointing.py",  # activation checkpointing under DDP, pg timeouts
    "tests/model/test_decode.py",  # the decode path against the full forward
    "tests/model/test_generate.py",
    "tests/test_sample.py",  # sample and eval from a real run's checkpoint
    "tests/test_eval.py",
    "tests/ops/test_self_check.py",  # the self-check and the reference path it falls back to
    "tests/ops/test_flex_window.py",  # FlexAttention's window branch: block mask, forward, its check
    "tests/train/test_gradsync.py",  # flat gradients; a load DCP would leave without optimizer state
    "tests/train/test_loader_process.py",  # batches from a spawned process through shared memory
)
# the code that leans on torch internals: a record says which version of it was tested
TORCH_FACING = ("nsa/train/checkpoint.py", "nsa/train/checkpoint_index.py", "nsa/train/checkpoint_probe.py",
                "nsa/train/checkpoint_legacy.py", "nsa/train/distributed.py", "nsa/train/loader_process.py")


def record_path(version: str, results_dir: Path = RESULTS_DIR) -> Path:
    return results_dir / f"torch-{version}.json"


def venv_dir(version: str) -> Path:
    base = os.environ.get("NSA_TORCH_VENVS") or Path.home() / ".cache" / "nsa-tui" / "torch-venvs"
    return Path(base) / version


def installed_torch(python: str) -> str | None:
    """The torch version ``python`` imports, or None."""
    res = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                         text=True)
    return res.stdout.strip() or None if res.returncode == 0 else None


def base_version(version: str) -> str:
    return version.split("+", 1)[0]


def torch_python(version: str) -> str:
    """A python whose torch is ``version``: this one where it already is, else the venv (made
    and filled on first use)."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise SystemExit(f"torch_compat: --torch wants a release like 2.11.0, not {version!r}")
    here = installed_torch(sys.executable)
    if here and base_version(here) == version:
        return sys.executable
    venv = venv_dir(version)
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"torch_compat: creating {venv} (system site packages)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    have = installed_torch(str(python))
    if not have or base_version(have) != version:
        print(f"torch_compat: pip install torch=={version} into {venv} (had {have or 'none'}; "
              "a CUDA build, about 4.5 GB)", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={version}"], check=True)
    _interpreter_numpy(str(python))
    return str(python)


def _interpreter_numpy(python: str) -> None:
    """The kernels' tests run in Triton's interpreter (``TRITON_INTERPRET=1``), which before
    Triton 3.9 turns one-element arrays into Python ints in a way NumPy 2.4 refuses ("only
    0-dimensional arrays can be converted to Python scalars"): such a venv gets a NumPy before
    2.4. A CPU-only matter: on a GPU the kernels are compiled, and the interpreter never runs."""
    code = ("import numpy, triton; t = tuple(int(x) for x in triton.__version__.split('.')[:2]); "
            "n = tuple(int(x) for x in numpy.__version__.split('.')[:2]); print(t < (3, 9) and n >= (2, 4))")
    res = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if res.stdout.strip() == "True":
        print("torch_compat: pip install 'numpy<2.4' (the interpreter of this Triton)", flush=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "numpy<2.4"], check=True)


def versions(python: str) -> dict[str, Any]:
    code = ("import json, platform, torch\n"
            "try:\n import triton; tv = triton.__version__\nexcept Exception: tv = None\n"
            "import numpy\n"
            "print(json.dumps({'torch': torch.__version__, 'triton': tv, 'python': platform.python_version(),"
            " 'cuda_build': torch.version.cuda, 'numpy': numpy.__version__}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out))


def commit() -> str:
    res = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


def torch_facing_hash() -> str:
    h = hashlib.sha256()
    for rel in TORCH_FACING:
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes() + b"\0")
    return h.hexdigest()


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: passed | failed | error | skipped}`` from pytest's JUnit XML."""
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        out[test_id] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                        else "skipped" if "skipped" in kinds else "passed")
    return out


def run_suite(python: str, extra: list[str]) -> tuple[int, dict[str, str], float]:
    env = dict(os.environ)
    env.update({"TRITON_INTERPRET": "1", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)})
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={junit}",
               *SUITE, *extra]
        print("torch_compat: " + " ".join(cmd), flush=True)
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        seconds = time.monotonic() - t0
        return rc, outcomes(junit) if junit.exists() else {}, seconds


def table(results_dir: Path = RESULTS_DIR) -> str:
    """docs/install.md's rows, one per record."""
    rows = ["| torch | Triton beside it | recorded | result |", "| --- | --- | --- | --- |"]
    for path in sorted(results_dir.glob("torch-*.json"), key=lambda p: [int(x) for x in
                                                                       p.stem.split("-")[1].split(".")]):
        r = json.loads(path.read_text())
        rows.append(f"| {r['torch']} | {r['triton']} | {r['date']}, commit {r['commit']}, "
                    f"`{path.relative_to(ROOT)}` | {r['passed']} passed, {r['failed']} failed, {r['error']} "
                    f"errors, {r['skipped']} skipped in {r['seconds']:.0f} s |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.torch_compat", description=__doc__.split("\n\n")[0])
    p.add_argument("--torch", metavar="VERSION", help="a torch release, e.g. 2.11.0")
    p.add_argument("--record", action="store_true", help="write bench/results/torch-VERSION.json")
    p.add_argument("--table", action="store_true", help="print docs/install.md's table of the records")
    p.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    args = p.parse_args(argv)
    if args.table:
        print(table())
        return 0
    if not args.torch:
        p.error("--torch VERSION (or --table) is required")
    python = torch_python(args.torch)
    found = versions(python)
    if base_version(found["torch"]) != args.torch:
        raise SystemExit(f"torch_compat: {python} imports torch {found['torch']}, not {args.torch}")
    rc, tests, seconds = run_suite(python, args.pytest_args)
    counts = {k: sum(1 for v in tests.values() if v == k) for k in ("passed", "failed", "error", "skipped")}
    print(f"torch_compat: torch {found['torch']}: {counts} in {seconds:.0f} s (pytest exit {rc})", flush=True)
    if args.record:
        if args.pytest_args:
            raise SystemExit("torch_compat: a record runs the whole suite: no extra pytest arguments")
        record = {"torch": found["torch"], "triton": found["triton"], "numpy": found["numpy"],
                  "python": found["python"],
                  "cuda_build": found["cuda_build"], "machine": f"{platform.machine()} {platform.system()}, "
                  f"{os.cpu_count()} CPUs, no GPU used (TRITON_INTERPRET=1)", "commit": commit(),
                  "torch_facing_sha256": torch_facing_hash(), "date": time.strftime("%Y-%m-%d"),
                  "command": f"python -m bench.torch_compat --torch {args.torch} --record",
                  "suite": list(SUITE), "seconds": round(seconds, 1), "pytest_exit": rc, **counts,
                  "tests": tests}
        path = record_path(args.torch)
        path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
        print(f"torch_compat: wrote {path.relative_to(ROOT)}", flush=True)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
