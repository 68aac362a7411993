"""Compile gate: every Triton kernel of ``nsa/ops/triton`` through Triton's real compiler, no GPU needed.

    python -m bench.compile_check [--arch 80 90] [--list] [--extra-module MODULE ...]
    python -m bench.compile_check --triton 3.1.0 [--record]    # under another Triton

``--triton VERSION`` runs the gate under that Triton in its own virtual environment
(``~/.cache/nsa-tui/triton-venvs/VERSION``, or under ``$NSA_TRITON_VENVS``), created on
first use with the system site packages (this machine's torch is reused: the gate drives
the ops on ``meta`` tensors, so any torch in the declared range will do) and
``pip install triton==VERSION``; Triton's compile cache (``~/.triton/cache``) is keyed by
its version, so the environments share it. ``--record`` writes the verdict, every line
and the hash of the kernels' source files to ``bench/results/compile-triton-VERSION.json``:
CI compiles the newest Triton on every run, the older ones in ``RECORDED_TRITONS`` are
checked by those committed records, and a test fails when the kernels change after them.

Why: the CPU test suite runs the kernels in Triton's interpreter, which accepts programs
the compiler rejects (a module global read inside ``@triton.jit`` code) and says nothing
about registers or spills. This gate compiles each kernel for sm_80 (A100) and sm_90
(H100) exactly as a launch on such a GPU would, and runs the wheel's ``ptxas -v`` on the
PTX.

Signatures are not written by hand: the gate drives the public ops of
``nsa.ops.triton`` (forward and backward, bf16) on ``meta`` tensors of every shipped
config's shapes and of extra layouts (head dim 64 and 128, each heads-per-group tiling
the launch wrappers choose), intercepts every kernel launch, and hands the launch's
arguments to Triton's own binder, which yields the signature, constexprs and
specialisation attributes a real launch would compile. A ``@triton.jit`` function in
``nsa/ops/triton`` that no launch reaches (directly or as a helper called from a launched
kernel) fails the gate: "kernel X not covered".

Exit status: 0 when everything compiles with no spill and fits the arch's shared memory;
1 on any compile error, spill, shared-memory overflow or uncovered kernel; 2 on misuse.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.compile_launches import (
    PACKAGE,
    Launch,
    config_shapes,
    discover,
    drive_ops,
    layout_shapes,
    package_modules,
    uncovered,
)
from bench.compile_records import (
    KERNEL_PACKAGE,
    Recorder,
    Verdict,
    file_hashes,
    flags_of,
    record_path,
    recorded_verdicts,
    reusable_record,
    run_under,
    sources_hash,
    work_hash,
)

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Arch:
    """A compile target: its capability, the GPU we size launches for, and its limits."""

    capability: int
    gpu: str
    sms: int  # sizes the compressed dK/dV split exactly as on that GPU
    max_shared: int  # bytes of shared memory one block may use (opt-in maximum)


ARCHS = {
    80: Arch(80, "A100", 108, 163 * 1024),
    90: Arch(90, "H100 SXM", 132, 227 * 1024),
}


@dataclasses.dataclass
class Result:
    """The compile of one launch for one arch; ``error`` is set when it failed."""

    error: str | None = None
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    shared: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.error is not None or bool(self.problems)


# ----------------------------------------------------------------------------- compiling


def binder_api() -> bool:
    """True on Tritons whose launch specialisation is callable without a driver
    (``JITFunction._pack_args`` and ``triton.knobs``: 3.6 and 3.9 have them); older ones
    (3.1-3.4) only specialise inside ``JITFunction.run``, which the gate drives with a
    stand-in driver (``_CompileOnlyDriver``)."""
    import triton
    from triton.runtime.jit import JITFunction

    return hasattr(JITFunction, "_pack_args") and hasattr(triton, "knobs")


def specialise(launch: Launch, capability: int) -> tuple[Any, dict, dict, dict, Any]:
    """Triton's own view of a launch on ``capability``: (target, signature, constexprs,
    attrs, options), computed by the kernel's binder as ``JITFunction.run`` does."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    # the options this Triton's JITFunction.run adds from its knobs (3.6 has the first only)
    for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        if hasattr(knobs.compilation, knob):
            kwargs[knob] = getattr(knobs.compilation, knob)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return target, signature, constexprs, attrs, options


class _CompileOnlyDriver:
    """The GPU driver as an old Triton's ``JITFunction.run`` asks it, on a machine with
    none: device 0 of ``capability``. Only warmup runs (compile, no launch) go through it."""

    def __init__(self, capability: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


@contextlib.contextmanager
def _compile_only(kernel: Any, capability: int) -> Iterator[None]:
    """Old Tritons: the stand-in driver for ``capability`` while the block runs, and no
    kernel compiled for another arch left in ``kernel``'s in-process cache (keyed by
    device, not arch)."""
    from triton.runtime.driver import driver

    def forget() -> None:
        for name in ("cache", "device_caches"):
            cache = getattr(kernel, name, None)
            if cache is not None:
                cache.clear()

    driver.set_active(_CompileOnlyDriver(capability))
    forget()
    try:
        yield
    finally:
        forget()
        driver.reset_active()


def _warmup(launch: Launch, capability: int) -> Any:
    """Old Tritons: ``JITFunction.run`` in warmup mode (specialise and compile, no launch)."""
    with _compile_only(launch.kernel, capability):
        return launch.kernel.run(*launch.args, grid=(1,), warmup=True, **launch.kwargs)


def spec_key(launch: Launch, capability: int) -> str:
    """Identical keys compile to identical code: compile once."""
    if not binder_api():
        return _legacy_spec_key(launch, capability)
    _, signature, constexprs, attrs, options = specialise(launch, capability)
    return repr((launch.kernel.fn.__module__, launch.name, capability, signature, sorted(constexprs.items()),
                 sorted(attrs.items()), sorted(options.__dict__.items())))


def _legacy_spec_key(launch: Launch, capability: int) -> str:
    """Old Tritons: the key ``JITFunction.run`` caches the compile under (signature,
    specialisation, constexprs, options), read from its cache hook, which also stops the
    run before it compiles."""
    from triton.runtime.jit import JITFunction

    seen: list[str] = []

    def hook(*, key: Any, repr: str, **_: Any) -> bool:
        seen.append(f"{key} {repr}")
        return True  # skip the compile

    import triton

    # where this Triton looks for the hook: a knob from 3.4, a class attribute before
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if hasattr(runtime, "jit_cache_hook"):
        owner, attr = runtime, "jit_cache_hook"
    else:
        owner, attr = JITFunction, "cache_hook"
    saved = getattr(owner, attr)
    setattr(owner, attr, hook)
    try:
        _warmup(launch, capability)
    finally:
        setattr(owner, attr, saved)
    if len(seen) != 1:
        raise RuntimeError(f"{launch.name}: Triton's cache hook ran {len(seen)} times, expected once")
    return repr((launch.kernel.fn.__module__, launch.name, capability, seen[0]))


PTXAS_INFO = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}


def ptxas_command(capability: int, fp_fusion: bool) -> list[str]:
    """The wheel's ptxas and the flags this Triton's own ``make_cubin`` passes it (they
    differ between versions: 3.9 adds ``--regAllocOptLevel=2``, 3.1 and 3.2 name the arch
    themselves)."""
    import inspect

    from triton.backends.nvidia import compiler as nv

    if hasattr(nv, "get_ptxas"):  # by arch in 3.3 and 3.6+ (a Blackwell ptxas), one binary in 3.4-3.5
        found = nv.get_ptxas(capability) if inspect.signature(nv.get_ptxas).parameters else nv.get_ptxas()
        ptxas = found.path if hasattr(found, "path") else found[0]
    else:
        ptxas = nv._path_to_binary("ptxas")[0]
    if hasattr(nv, "sm_arch_from_capability"):
        arch = nv.sm_arch_from_capability(capability)
    else:
        arch = f"sm_{capability}{'a' if capability == 90 else ''}"
    reg_alloc = "--regAllocOptLevel=2" in inspect.getsource(nv.CUDABackend.make_cubin)
    return [ptxas, "-lineinfo", "-v", *(["--regAllocOptLevel=2"] if reg_alloc else []),
            *([] if fp_fusion else ["--fmad=false"]), f"--gpu-name={arch}"]


def ptxas_report(ptx: str, capability: int, fp_fusion: bool) -> dict[str, int]:
    """Registers, stack and spill bytes from the wheel's ptxas for this arch (the binary and
    flags Triton's own ``make_cubin`` uses; its log is gone once Triton caches the kernel)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        cmd = [*ptxas_command(capability, fp_fusion), str(src), "-o", str(Path(tmp) / "kernel.o")]
        done = subprocess.run(cmd, capture_output=True, text=True)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed ({done.returncode}): {log.strip()[-500:]}")
    info = {}
    for key, pattern in PTXAS_INFO.items():
        found = pattern.search(log)
        if found is None:
            raise RuntimeError(f"ptxas -v printed no '{key}': {log.strip()[-500:]}")
        info[key] = int(found.group(1))
    return info


def describe_error(exc: Exception, kernel: Any) -> str:
    """One line: for a compile error the kernel's file:line and the compiler's message,
    without the source excerpt."""
    from triton.compiler.errors import CompilationError

    if isinstance(exc, CompilationError):
        code = kernel.fn.__code__
        line = getattr(exc.node, "lineno", None)
        where = f"{Path(code.co_filename).name}:{code.co_firstlineno + line - 1}" if line else "?"
        text = exc.error_message or (repr(exc.__cause__) if exc.__cause__ else "")
        return f"CompilationError at {where}: {' '.join(str(text).split())}"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _compile(launch: Launch, capability: int) -> tuple[Any, bool]:
    """The compiled kernel (AST -> PTX -> cubin) and whether FP fusion was on."""
    import triton

    if not binder_api():
        kernel = _warmup(launch, capability)
        return kernel, getattr(kernel.metadata, "enable_fp_fusion", True)
    from triton import knobs
    from triton.compiler import ASTSource

    allow = knobs.compilation.allow_non_constexpr_globals
    knobs.compilation.allow_non_constexpr_globals = False  # a GPU host need not set the escape hatch
    try:
        target, signature, constexprs, attrs, options = specialise(launch, capability)
        kernel = triton.compile(ASTSource(launch.kernel, signature, constexprs, attrs), target=target,
                                options=options.__dict__)
    finally:
        knobs.compilation.allow_non_constexpr_globals = allow
    return kernel, options.enable_fp_fusion


def compile_launch(launch: Launch, capability: int) -> Result:
    """Compile ``launch`` for ``capability`` and read ptxas's report."""
    res = Result()
    start = time.perf_counter()
    try:
        kernel, fp_fusion = _compile(launch, capability)
        md = kernel.metadata
        res.shared, res.num_warps, res.num_stages = md.shared, md.num_warps, md.num_stages
        info = ptxas_report(kernel.asm["ptx"], capability, fp_fusion)
        res.registers, res.stack = info["registers"], info["stack"]
        res.spill_stores, res.spill_loads = info["spill_stores"], info["spill_loads"]
        if res.spill_stores or res.spill_loads:
            res.problems.append(f"spills {res.spill_stores} B stores / {res.spill_loads} B loads")
        limit = ARCHS[capability].max_shared if capability in ARCHS else None
        if limit is not None and res.shared > limit:
            res.problems.append(f"shared memory {res.shared} B > {limit} B")
    except Exception as exc:  # noqa: BLE001 - every compile failure is a gate result, not a crash
        res.error = describe_error(exc, launch.kernel)
    res.seconds = time.perf_counter() - start
    return res


_WORK: list[tuple[int, Launch, list[str]]] = []  # what forked workers compile, by index


# Seconds one compile may take before its child is killed and the compile fails. The gate's
# compiles take seconds; Triton 3.1 never finished some at sm_90 (the selected forward and dQ
# on 64-row tiles at 4 and 8 heads per group, in its TTGIR passes), which held the gate.
COMPILE_TIMEOUT_S = 300
# Under a Triton below the kernels' floor (``nsa.ops.self_check.MIN_TRITON``) a record only
# has to show how it fails, and a compile still running after two minutes is a failure
# for anyone who would launch it: 3.1 never finishes 24 compiles, and at 300 s each they
# were most of its record's hour.
OLD_TRITON_TIMEOUT_S = 120


def compile_timeout() -> float:
    """Seconds a compile may take before it is killed and counted failed."""
    import triton

    from nsa.ops.self_check import triton_too_old

    return OLD_TRITON_TIMEOUT_S if triton_too_old(triton.__version__) else COMPILE_TIMEOUT_S


def compile_isolated(launch: Launch, capability: int, timeout_s: float | None = None) -> Result:
    """``compile_launch`` in a forked child: a compiler that aborts (Triton 3.1 fails a C++
    assertion on some sm_90 layouts, which kills the process) or runs past ``timeout_s``
    (default ``compile_timeout()``; the child is killed) becomes a failed result naming
    the signal and the compiler's last words, instead of taking the gate down."""
    import faulthandler
    import pickle
    import select
    import signal

    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: compile, send the result, exit without cleanup
            code = 1
            try:
                os.close(read)
                sys.stderr.flush()
                os.dup2(err.fileno(), 2)
                faulthandler.disable()  # an abort's words are the compiler's, not our Python stack
                data = pickle.dumps(compile_launch(launch, capability))
                with os.fdopen(write, "wb") as out:
                    out.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        limit = compile_timeout() if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        chunks: list[bytes] = []
        timed_out = False
        with os.fdopen(read, "rb", buffering=0) as inp:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([inp], [], [], left)[0]:
                    timed_out = True
                    os.kill(pid, signal.SIGKILL)
                    break
                chunk = inp.read(1 << 16)
                if not chunk:  # the child closed its end: done or dead
                    break
                chunks.append(chunk)
        data = b"".join(chunks)
        _, status = os.waitpid(pid, 0)
        if data and status == 0 and not timed_out:
            return pickle.loads(data)
        err.seek(0)
        words = [line for line in err.read().decode(errors="replace").splitlines() if line.strip()]
    if timed_out:
        how = f"killed after {limit:g} s without finishing"
    elif os.WIFSIGNALED(status):
        how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        how = f"exited with status {os.WEXITSTATUS(status)}"
    telling = [w for w in words if re.search(r"Assertion|[Ee]rror", w)] or words  # not a traceback's tail
    last = " ".join(telling[-1].split())[-400:] if telling else "no message"
    return Result(error=f"compiler process {how}: {last}", seconds=time.perf_counter() - start)


def _compile_item(i: int) -> Result:
    cap, launch, _ = _WORK[i]
    return compile_isolated(launch, cap)


def compile_all(work: list[tuple[int, Launch, list[str]]], jobs: int) -> Iterator[Result]:
    """Results in order, from ``jobs`` forked processes (launches hold meta tensors and
    kernel objects: workers inherit them by fork instead of pickling them), each compile
    in a child of its own (``compile_isolated``)."""
    if jobs <= 1 or len(work) < 2:
        for cap, launch, _ in work:
            yield compile_isolated(launch, cap)
        return
    import multiprocessing

    _WORK[:] = work
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(_compile_item, range(len(work)))
    _WORK.clear()


def _source_file(launch: Launch) -> str:
    """The kernel source file that defines a launch's kernel."""
    module = launch.kernel.fn.__module__
    return "__init__.py" if module == KERNEL_PACKAGE else module.rsplit(".", 1)[-1] + ".py"


def format_line(name: str, capability: int, res: Result, cases: list[str], config: str = "") -> str:
    where = f"{'(' + config + ') ' if config else ''}[{', '.join(cases)}]"
    if res.error is not None:
        return f"FAIL sm_{capability} {name:16s} compile error: {res.error[:600]}  {where}"
    status = "FAIL" if res.failed else "OK  "
    line = (f"{status} sm_{capability} {name:16s} regs {res.registers:3d}  spill {res.spill_stores}/"
            f"{res.spill_loads} B  stack {res.stack} B  smem {res.shared:6d} B  warps {res.num_warps}  "
            f"stages {res.num_stages}  {where}")
    return line + "".join(f"  <- {p}" for p in res.problems)


# ----------------------------------------------------------------------------- the gate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compile_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, nargs="+", default=sorted(ARCHS), choices=sorted(ARCHS),
                    help="compute capabilities to compile for (default: 80 90)")
    ap.add_argument("--list", action="store_true",
                    help="list the launches and check coverage; compile nothing")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="compile in this many processes (default: one per CPU)")
    ap.add_argument("--extra-module", action="append", default=[], metavar="MODULE",
                    help="also require coverage of the @triton.jit functions defined in MODULE (tests)")
    ap.add_argument("--triton", metavar="VERSION",
                    help="run the gate under this Triton release, in its own virtual environment")
    ap.add_argument("--record", action="store_true",
                    help="write bench/results/compile-triton-<this Triton>.json (verdict, lines, "
                         "kernels' hash, the compiles' fingerprint)")
    ap.add_argument("--reuse-record", action="store_true",
                    help="pass without compiling when this Triton's record passed these exact compiles "
                         "(the same kernels' source and the same signatures, constexprs and options); "
                         "else compile only the compiles the record holds no verdict of")
    ap.add_argument("--fresh", action="store_true",
                    help="with --record: compile everything, taking no verdict from the existing record")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    if args.triton:
        rest = [a for a in argv if a != "--triton" and a != args.triton and not a.startswith("--triton=")]
        try:
            return run_under(args.triton, rest)
        except (ValueError, subprocess.CalledProcessError) as exc:
            print(f"compile_check: {exc}", file=sys.stderr)
            return 2
    if args.record and (args.list or args.extra_module):
        print("compile_check: --record is for the whole gate (no --list, no --extra-module)", file=sys.stderr)
        return 2
    # Triton 3.9 warns that its FP-fusion default changes in 3.10; the gate compiles with
    # the default a GPU host gets, and the warning would only clutter the table.
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")

    if os.environ.pop("TRITON_INTERPRET", None) not in (None, "", "0"):
        print("compile_check: ignoring TRITON_INTERPRET (this gate needs Triton's real compiler, "
              "not the interpreter)", flush=True)
    t0 = time.perf_counter()
    try:
        kernels = discover(package_modules() + args.extra_module)
    except RuntimeError as exc:  # imported under the interpreter earlier in this process
        print(f"compile_check: {exc}; run the gate in a fresh process", file=sys.stderr)
        return 2
    shapes, dense = config_shapes()
    shapes += layout_shapes()
    print(f"compile_check: {len(kernels)} @triton.jit functions in {PACKAGE}"
          f"{' + ' + ', '.join(args.extra_module) if args.extra_module else ''}; {len(shapes)} shapes: "
          + "; ".join(f"{s.label} ({s.describe()})" for s in shapes), flush=True)
    if dense:
        print(f"compile_check: dense configs (SDPA, no Triton kernel): {', '.join(dense)}")

    # launches per arch: the split of the compressed dK/dV depends on the GPU's SM count
    launches = {cap: [x for s in shapes for x in drive_ops(s, ARCHS[cap].sms, cap)] for cap in args.arch}
    failed = False
    missing = uncovered(kernels, [x.kernel for xs in launches.values() for x in xs])
    for name in missing:
        print(f"FAIL kernel {name} not covered: no launch of the gate's shapes reaches it (launch it from "
              f"an op that drive_ops runs, or extend drive_ops)")
        failed = True

    n_cases = 0
    items: list[tuple[int, Launch, list[str], str]] = []  # one per distinct compile, with its key
    for cap in args.arch:
        groups: dict[str, list[Launch]] = {}
        for x in launches[cap]:
            groups.setdefault(spec_key(x, cap), []).append(x)
        n_cases += len(launches[cap])
        for key, members in groups.items():
            cases = [m.case for m in members]
            items.append((cap, members[0], cases, key + repr(cases)))
    # the configs launches use by default first, then the ones only autotuning may pick:
    # a run stopped early has checked what a host runs unless it autotunes
    items.sort(key=lambda w: w[1].config.startswith("alt"))
    work = [(cap, first, cases) for cap, first, cases, _ in items]
    fingerprint = work_hash([key for *_, key in items])
    if args.reuse_record and not args.list and not args.extra_module and not failed:
        reused = reusable_record(fingerprint)
        if reused is not None:
            print(f"compile_check: passed: {n_cases} launch cases, {reused['compiles']} distinct compiles, "
                  f"archs {', '.join(f'sm_{c}' for c in args.arch)}: the same compiles (kernels, "
                  f"signatures, options, this Triton {reused['triton']}) passed in bench/results/"
                  f"{record_path(reused['triton']).name} ({reused['started']}); nothing compiled, "
                  f"{time.perf_counter() - t0:.0f} s")
            return 0
        print("compile_check: no record of these exact compiles under this Triton: compiling what it "
              "holds no verdict of", flush=True)
    # each compile's verdict as a record keeps it, and the record's verdicts that still hold
    takes_verdicts = not args.list and not args.extra_module and (args.reuse_record or args.record)
    made = [("", "")] * len(items)
    recorded: dict[str, Verdict] = {}
    recorded_at = ""
    if takes_verdicts:
        import triton

        hashes = file_hashes()
        made = [(Verdict.id_of(key), sources_hash(_source_file(first), hashes)) for _, first, _, key in items]
        if not args.fresh:
            recorded, recorded_at = recorded_verdicts(triton.__version__)
    keep: list[Verdict | None] = []
    for cid, src in made:
        old = recorded.get(cid)
        keep.append(old if old is not None and old.sources == src else None)
    recorder = None if args.list or not args.record else Recorder(args.arch, args.jobs, len(work), n_cases,
                                                                  fingerprint)
    if recorder is not None:
        recorder.data["uncovered"] = missing
        print(f"compile_check: recording to {recorder.path}", flush=True)
    if args.list:
        for cap, first, cases in work:
            print(f"LIST sm_{cap} {first.name:16s} {'(' + first.config + ') ' if first.config else ''}"
                  f"[{', '.join(cases)}]")
    else:
        n_kept = sum(v is not None for v in keep)
        if n_kept:
            print(f"compile_check: {n_kept} of {len(work)} compiles have a verdict in the record begun "
                  f"{recorded_at} (the same compile of the same kernel sources, by this gate's code): "
                  f"taken from it; compiling {len(work) - n_kept}", flush=True)
        for kept in keep:
            if kept is not None:
                failed |= kept.failed
                print(kept.line, flush=True)
                if recorder is not None:
                    recorder.add(kept.line, kept, recorded_at)
        todo = [(w, m) for w, m, v in zip(work, made, keep) if v is None]
        for ((cap, first, cases), (cid, src)), res in zip(todo, compile_all([w for w, _ in todo], args.jobs)):
            failed |= res.failed
            line = format_line(first.name, cap, res, cases, first.config)
            print(line, flush=True)
            if recorder is not None:
                recorder.add(line, Verdict(cid, src, flags_of(res), line))
    n_compiles = 0 if args.list else len(work)
    taken = sum(v is not None for v in keep)
    verdict = "FAILED" if failed else "passed"
    summary = (f"compile_check: {verdict}: {n_cases} launch cases, {n_compiles} distinct compiles"
               f"{f' ({taken} verdicts from the record)' if taken else ''}, "
               f"archs {', '.join(f'sm_{c}' for c in args.arch)}, {time.perf_counter() - t0:.0f} s")
    print(summary)
    if recorder is not None:
        recorder.add(summary)
        recorder.finish(not failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
