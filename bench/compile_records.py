"""The compile gate under other Tritons, and its records: ``--triton VERSION [--record]``.

Each version runs in its own virtual environment (``~/.cache/nsa-tui/triton-venvs/VERSION``
or under ``$NSA_TRITON_VENVS``, with the system site packages for torch); a record
(``bench/results/compile-triton-VERSION.json``) holds the verdict, every line and the hash
of the kernels' source, so a test can tell when the kernels changed after it.

A record also keeps, for each compile, what it depended on (``Verdict``): the compile's key
(the kernel, its signature, constexprs and options under that Triton), the kernel sources it
can reach and the gate's own code. A later ``--record`` compiles only the compiles whose
inputs changed and takes the rest from the record: after a change to one kernel file, the
kernels of the files that do not import it are not compiled again (a change to ``topn.py``
recompiles the scores and decode kernels, not the band or selected ones), and a record that
was stopped part-way goes on from where it stopped. Compiling is deterministic, so a
recorded verdict of the same inputs is the verdict.
"""

from __future__ import annotations

import ast
import dataclasses
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
KERNEL_PACKAGE = "nsa.ops.triton"
GATE_SOURCE = ROOT / "bench" / "compile_check.py"
RESULTS_DIR = ROOT / "bench" / "results"
# Checked through committed records (--triton V --record): the oldest Triton of the
# declared range (torch 2.5's) and the one of the lent GPU machines (torch 2.11's).
RECORDED_TRITONS = ("3.1.0", "3.6.0")


# ----------------------------------------------------------------------------- other Tritons, records


def kernels_hash(kernel_dir: Path | None = None) -> str:
    """sha256 of the kernels' source files (names and bytes): a record made before a
    change to any of them no longer says anything about them."""
    h = hashlib.sha256()
    for path in sorted((kernel_dir or KERNEL_DIR).glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def file_hashes(kernel_dir: Path | None = None) -> dict[str, str]:
    """sha256 of each kernel source file, by file name."""
    files = sorted((kernel_dir or KERNEL_DIR).glob("*.py"))
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _imported(tree: ast.Module, kernel_dir: Path) -> set[str]:
    """The kernel sources a module's imports name (the package itself is its ``__init__``)."""
    names: set[str] = set()

    def add(module: str, members: list[str]) -> None:
        if module:
            names.add(module.split(".")[0] + ".py")
        else:  # ``from . import x``: a module of the package, or a name its __init__ defines
            names.update(m + ".py" if (kernel_dir / f"{m}.py").exists() else "__init__.py" for m in members)

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            add(node.module or "", [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == KERNEL_PACKAGE:
                add("", [a.name for a in node.names])
            elif node.module.startswith(KERNEL_PACKAGE + "."):
                add(node.module[len(KERNEL_PACKAGE) + 1:], [])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(KERNEL_PACKAGE + "."):
                    add(a.name[len(KERNEL_PACKAGE) + 1:], [])
    return {n for n in names if (kernel_dir / n).exists()}


def reachable_sources(name: str, kernel_dir: Path | None = None) -> list[str]:
    """The kernel source file ``name`` and every kernel source it imports, directly or through
    another: all that a kernel defined in it can reach (the ``@triton.jit`` helpers it calls,
    the constants it reads). A file that imports nothing of the package reaches itself only."""
    kernel_dir = kernel_dir or KERNEL_DIR
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(_imported(ast.parse((kernel_dir / current).read_text()), kernel_dir) - seen)
    return sorted(seen)


def sources_hash(name: str, hashes: dict[str, str], kernel_dir: Path | None = None) -> str:
    """What a compile of a kernel defined in kernel source ``name`` depends on, of the kernel
    sources: their names and bytes (``hashes``, from ``file_hashes``), shortened."""
    h = hashlib.sha256()
    for f in reachable_sources(name, kernel_dir):
        h.update(f.encode() + b"\0" + hashes[f].encode() + b"\0")
    return h.hexdigest()[:20]


def gate_hash() -> str:
    """sha256 of the gate's own code, which decides how a compile is judged: a verdict made
    by other gate code is not reused."""
    return hashlib.sha256(GATE_SOURCE.read_bytes()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One compile's verdict as a record keeps it: the compile (``compile_id``: its key
    under this Triton, shortened), the kernel sources it depended on (``sources_hash``), how
    it failed, if it did (``flags``: e an error, s a spill, m shared memory over the limit,
    - none) and its line of the table."""

    compile_id: str
    sources: str
    flags: str
    line: str

    @staticmethod
    def id_of(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()[:20]

    def entry(self) -> str:
        return f"{self.compile_id} {self.sources} {self.flags}"

    @property
    def failed(self) -> bool:
        return self.flags != "-"


def flags_of(res: Result) -> str:
    """``Verdict.flags`` of a compile's result."""
    flags = ("e" if res.error is not None else "") + ("s" if res.spill_stores or res.spill_loads else "")
    flags += "m" if any(p.startswith("shared memory") for p in res.problems) else ""
    if res.failed and not flags:  # a problem of another kind: still a failure
        flags = "f"
    return flags or "-"


def recorded_verdicts(version: str, results_dir: Path | None = None) -> tuple[dict[str, Verdict], str]:
    """The verdicts that Triton ``version``'s record holds, by compile id, when the record was
    made by this gate code (``gate_hash``), complete or not; and when that record was begun.
    Empty for a record of other gate code or with no verdicts (made before they were kept)."""
    try:
        rec = json.loads(record_path(version, results_dir).read_text())
    except (OSError, ValueError):
        return {}, ""
    if rec.get("triton") != version or rec.get("gate_sha256") != gate_hash():
        return {}, ""
    found = {}
    for entry, line in zip(rec.get("entries", []), rec.get("lines", [])):
        compile_id, sources, flags = entry.split()
        found[compile_id] = Verdict(compile_id, sources, flags, line)
    return found, str(rec.get("started", ""))


def record_path(version: str, results_dir: Path | None = None) -> Path:
    return (results_dir or RESULTS_DIR) / f"compile-triton-{version}.json"


def work_hash(keys: list[str]) -> str:
    """sha256 of what the gate would compile (each distinct compile's key: kernel, signature,
    constexprs, attributes, options, and its launch cases) and of the gate's own code (how a
    compile is judged): equal hashes under one Triton mean the same compiles, the same verdicts."""
    h = hashlib.sha256((ROOT / "bench" / "compile_check.py").read_bytes())
    for key in sorted(keys):
        h.update(b"\0" + key.encode())
    return h.hexdigest()


def reusable_record(fingerprint: str, results_dir: Path | None = None) -> dict[str, Any] | None:
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
    every compile, so a run that is stopped leaves a record that says it is partial, and
    whose verdicts the next ``--record`` takes up)."""

    def __init__(self, archs: list[int], jobs: int, total: int, launch_cases: int,
                 work_sha256: str = "", results_dir: Path | None = None) -> None:
        import platform

        import torch
        import triton

        self.path = record_path(triton.__version__, results_dir)
        self.start = time.time()
        self.data: dict[str, Any] = {
            "triton": triton.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "kernels_sha256": kernels_hash(), "work_sha256": work_sha256, "gate_sha256": gate_hash(),
            "archs": archs,
            "command": f"python -m bench.compile_check --triton {triton.__version__} --record",
            "machine": f"compiled on {platform.machine()} CPUs, never run on a GPU; {os.cpu_count()} cores, "
                       f"{jobs} compile jobs, load average {os.getloadavg()[0]:.1f} at start",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.start)),
            "complete": False, "passed": False, "launch_cases": launch_cases, "compiles": total,
            "compiled": 0, "reused": 0, "reused_from": [], "errors": 0, "spills": 0, "smem_over": 0,
            "uncovered": [], "seconds": 0.0, "lines": [], "entries": [],
        }

    def add(self, line: str, verdict: Verdict | None = None, reused_from: str = "") -> None:
        """A line of the table; with ``verdict``, a compile's (``reused_from``: the start of the
        record it was taken from, when it was not compiled in this run)."""
        d = self.data
        if verdict is not None and len(d["entries"]) != len(d["lines"]):
            raise ValueError("a compile's verdict after the summary line")
        d["lines"].append(line)
        if verdict is not None:
            d["entries"].append(verdict.entry())
            d["compiled"] += 1
            d["errors"] += "e" in verdict.flags
            d["spills"] += "s" in verdict.flags
            d["smem_over"] += "m" in verdict.flags
            if reused_from:
                d["reused"] += 1
                if reused_from not in d["reused_from"]:
                    d["reused_from"].append(reused_from)
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
