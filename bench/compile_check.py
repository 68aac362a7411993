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
import ast
import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "nsa.ops.triton"
KERNEL_DIR = ROOT / "nsa" / "ops" / "triton"
RESULTS_DIR = ROOT / "bench" / "results"
# Checked through committed records (--triton V --record): the oldest Triton of the
# declared range (torch 2.5's) and the one of the lent GPU machines (torch 2.11's).
RECORDED_TRITONS = ("3.1.0", "3.6.0")


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


@dataclasses.dataclass(frozen=True)
class Shape:
    """One model layout the kernels must compile for (NSA hyperparameters included)."""

    label: str
    B: int
    T: int
    H: int
    G: int
    D: int
    block: int  # l
    stride: int  # d
    select_block: int  # l'
    n: int
    window: int

    def describe(self) -> str:
        return f"B{self.B} T{self.T} H{self.H} G{self.G} D{self.D}"


@dataclasses.dataclass
class Launch:
    """One intercepted kernel launch: the kernel and the exact arguments the wrapper passed."""

    kernel: Any  # triton.runtime.jit.JITFunction
    args: tuple
    kwargs: dict
    case: str = ""
    config: str = ""  # the autotune config (tiles, warps), for an autotuned kernel

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


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


# ----------------------------------------------------------------------------- shapes


def config_shapes(config_dir: Path = ROOT / "configs") -> tuple[list[Shape], list[str]]:
    """A shape per shipped NSA config (its batch, sequence, heads and NSA settings);
    the names of dense configs (no Triton kernel runs for them)."""
    from nsa.config import load_config

    shapes, dense = [], []
    for path in sorted(config_dir.glob("*.yaml")):
        cfg = load_config(path)
        m, a, t = cfg.model, cfg.model.attention, cfg.train
        if a.kind != "nsa":
            dense.append(cfg.name)
            continue
        shapes.append(Shape(cfg.name, t.batch_size, t.seq_len, m.n_heads, m.n_kv_heads, m.head_dim,
                            a.compress_block, a.compress_stride, a.select_block, a.num_selected, a.window))
    return shapes, dense


def layout_shapes() -> list[Shape]:
    """Head dims 64 and 128 at every heads-per-group count whose tiling differs in the
    selected kernels (``selected._sizes``: positions per tile for < 16 heads, padded rows
    above), 4 KV groups, the paper's NSA settings (the config defaults), T = 2048."""
    from nsa.config import AttentionConfig

    a = AttentionConfig(kind="nsa")
    return [Shape(f"D{d}-hpg{hpg}", 1, 2048, 4 * hpg, 4, d, a.compress_block, a.compress_stride,
                  a.select_block, a.num_selected, a.window)
            for d in (64, 128) for hpg in (1, 2, 4, 8, 16, 32, 64)]


# ----------------------------------------------------------------------------- kernels and coverage


def _is_jit(obj: Any) -> bool:
    from triton.runtime.jit import JITFunction

    return isinstance(obj, JITFunction)


def _unwrap(obj: Any) -> Any:
    """The function under tunable / ``triton.autotune`` / ``triton.heuristics`` wrappers."""
    from triton.runtime.autotuner import KernelInterface

    while isinstance(obj, KernelInterface) and not _is_jit(obj) and hasattr(obj, "fn"):
        obj = obj.fn
    return obj


def discover(module_names: list[str]) -> dict[str, Any]:
    """Every ``@triton.jit`` function defined (not imported) in the given modules, by
    qualified name (autotuned ones by the function they tune)."""
    from triton.runtime.interpreter import InterpretedFunction

    found = {}
    for name in module_names:
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            obj = _unwrap(obj)
            if isinstance(obj, InterpretedFunction):
                raise RuntimeError(f"{name}.{attr} was built for the interpreter (TRITON_INTERPRET=1 was set "
                                   f"when {name} was imported): the compile gate needs the real compiler")
            if _is_jit(obj) and obj.fn.__module__ == name:
                found[f"{name}.{attr}"] = obj
    return found


def package_modules(package: str = PACKAGE) -> list[str]:
    pkg = importlib.import_module(package)
    return [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]


def callees(fn: Any) -> set[Any]:
    """The ``@triton.jit`` functions that ``fn``'s body calls, transitively."""
    seen: set[Any] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        scope = f.fn.__globals__
        for node in ast.walk(f.parse()):
            if not isinstance(node, ast.Call):
                continue
            target = None
            if isinstance(node.func, ast.Name):
                target = scope.get(node.func.id)
            elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                target = getattr(scope.get(node.func.value.id), node.func.attr, None)
            if _is_jit(target) and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def uncovered(kernels: dict[str, Any], launched: list[Any]) -> list[str]:
    """Names of kernels neither launched nor called from a launched kernel."""
    reached = set(launched)
    for k in launched:
        reached |= callees(k)
    return [name for name, k in kernels.items() if k not in reached]


# ----------------------------------------------------------------------------- capturing launches


@contextlib.contextmanager
def capture(case: Callable[[], str] = lambda: "") -> Iterator[list[Launch]]:
    """Record every ``kernel[grid](...)`` made inside the block instead of launching it;
    an autotuned kernel's launch is recorded once per config its prune keeps (any of them
    may be the one the autotuner picks on a GPU)."""
    from triton.runtime.jit import JITFunction

    from nsa.ops.triton import tuning

    launches: list[Launch] = []
    tuned = {"config": ""}

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append(Launch(self, args, kwargs, case(), tuned["config"]))

    def record_configs(self: Any, *args: Any, **kwargs: Any) -> None:
        for i, config in enumerate(tuning.candidates(self, args, kwargs)):
            tiles = " ".join(f"{k}={v}" for k, v in config.kwargs.items())
            role = "default" if i == 0 else "alt"
            tuned["config"] = f"{role}: {tiles} warps {config.num_warps}".replace(":  ", ": ")
            try:
                self.fn.run(*args, **kwargs, **config.all_kwargs())
            finally:
                tuned["config"] = ""

    saved = JITFunction.run, tuning.Tunable.run, tuning.AUTOTUNE
    JITFunction.run, tuning.Tunable.run, tuning.AUTOTUNE = record, record_configs, True
    try:
        yield launches
    finally:
        JITFunction.run, tuning.Tunable.run, tuning.AUTOTUNE = saved


def drive_ops(shape: Shape, sms: int) -> list[Launch]:
    """Run the ops of ``nsa.ops.triton`` (the model's attention ops, the contract's scores
    and ``select_blocks``, the gated combine and RoPE), forward and backward, in bf16 on
    meta tensors of ``shape`` (nothing is computed or allocated) and return their kernel
    launches."""
    import torch

    import nsa.ops.triton as T
    from nsa.ops.reference import num_compressed

    s = shape
    step = {"op": ""}

    def bf16(*size: int) -> torch.Tensor:
        return torch.empty(*size, device="meta", dtype=torch.bfloat16, requires_grad=True)

    def run(op: str, fn: Callable[[], torch.Tensor]) -> None:
        step["op"] = f"{op} fwd"
        out = fn()
        step["op"] = f"{op} bwd"
        out.backward(torch.empty_like(out))

    nc = num_compressed(s.T, s.block, s.stride)
    q = bf16(s.B, s.T, s.H, s.D)
    k, v = bf16(s.B, s.T, s.G, s.D), bf16(s.B, s.T, s.G, s.D)
    kc, vc = bf16(s.B, nc, s.G, s.D), bf16(s.B, nc, s.G, s.D)
    idx = torch.empty(s.B, s.T, s.G, s.n, device="meta", dtype=torch.int64)
    saved = T._sm_count
    T._sm_count = lambda device: sms
    try:
        with capture(lambda: f"{shape.label} {step['op']}") as launches:
            run("compressed+scores", lambda: T.compressed_attention_and_scores(
                q, kc, vc, s.block, s.stride, s.select_block, s.G)[0])
            run("compressed+selection", lambda: T.compressed_attention_and_selection(
                q, kc, vc, s.block, s.stride, s.select_block, s.G, s.n, 1, 2)[0])
            step["op"] = "select_blocks"
            T.select_blocks(torch.empty(s.B, s.T, s.G, -(-s.T // s.select_block), device="meta"),
                            s.select_block, s.n, 1, 2)
            gates = torch.empty(s.B, s.T, s.H, 3, device="meta", requires_grad=True)
            run("gated combine", lambda: T.gated_combine(gates, q, q, q))
            angles = torch.empty(s.T, s.D // 2, device="meta")
            run("rope", lambda: T.apply_rope(q, angles, angles))
            run("selected", lambda: T.selected_attention(q, k, v, idx, s.select_block))
            run("window", lambda: T.window_attention(q, k, v, s.window))
    finally:
        T._sm_count = saved
    return launches


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


def compile_isolated(launch: Launch, capability: int) -> Result:
    """``compile_launch`` in a forked child: a compiler that aborts (Triton 3.1 fails a C++
    assertion on some sm_90 layouts, which kills the process) becomes a failed result
    naming the signal and the compiler's last words, instead of taking the gate down."""
    import pickle
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
                data = pickle.dumps(compile_launch(launch, capability))
                with os.fdopen(write, "wb") as out:
                    out.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as inp:
            data = inp.read()
        _, status = os.waitpid(pid, 0)
        if data and status == 0:
            return pickle.loads(data)
        err.seek(0)
        words = [line for line in err.read().decode(errors="replace").splitlines() if line.strip()]
    if os.WIFSIGNALED(status):
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


def format_line(name: str, capability: int, res: Result, cases: list[str], config: str = "") -> str:
    where = f"{'(' + config + ') ' if config else ''}[{', '.join(cases)}]"
    if res.error is not None:
        return f"FAIL sm_{capability} {name:16s} compile error: {res.error[:600]}  {where}"
    status = "FAIL" if res.failed else "OK  "
    line = (f"{status} sm_{capability} {name:16s} regs {res.registers:3d}  spill {res.spill_stores}/"
            f"{res.spill_loads} B  stack {res.stack} B  smem {res.shared:6d} B  warps {res.num_warps}  "
            f"stages {res.num_stages}  {where}")
    return line + "".join(f"  <- {p}" for p in res.problems)


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

    def __init__(self, archs: list[int], jobs: int, total: int, launch_cases: int) -> None:
        import platform

        import torch
        import triton

        self.path = record_path(triton.__version__)
        self.start = time.time()
        self.data: dict[str, Any] = {
            "triton": triton.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "kernels_sha256": kernels_hash(), "archs": archs, "command":
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
                         "kernels' hash)")
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
    launches = {cap: [x for s in shapes for x in drive_ops(s, ARCHS[cap].sms)] for cap in args.arch}
    failed = False
    missing = uncovered(kernels, [x.kernel for xs in launches.values() for x in xs])
    for name in missing:
        print(f"FAIL kernel {name} not covered: no launch of the gate's shapes reaches it (launch it from "
              f"an op that drive_ops runs, or extend drive_ops)")
        failed = True

    n_cases = 0
    work: list[tuple[int, Launch, list[str]]] = []  # one per distinct compile
    for cap in args.arch:
        groups: dict[str, list[Launch]] = {}
        for x in launches[cap]:
            groups.setdefault(spec_key(x, cap), []).append(x)
        n_cases += len(launches[cap])
        for members in groups.values():
            work.append((cap, members[0], [m.case for m in members]))
    # the configs launches use by default first, then the ones only autotuning may pick:
    # a run stopped early has checked what a host runs unless it autotunes
    work.sort(key=lambda w: w[1].config.startswith("alt"))
    recorder = None if args.list or not args.record else Recorder(args.arch, args.jobs, len(work), n_cases)
    if recorder is not None:
        recorder.data["uncovered"] = missing
        print(f"compile_check: recording to {recorder.path}", flush=True)
    if args.list:
        for cap, first, cases in work:
            print(f"LIST sm_{cap} {first.name:16s} {'(' + first.config + ') ' if first.config else ''}"
                  f"[{', '.join(cases)}]")
    else:
        for (cap, first, cases), res in zip(work, compile_all(work, args.jobs)):
            failed |= res.failed
            line = format_line(first.name, cap, res, cases, first.config)
            print(line, flush=True)
            if recorder is not None:
                recorder.add(line, res)
    n_compiles = 0 if args.list else len(work)
    verdict = "FAILED" if failed else "passed"
    summary = (f"compile_check: {verdict}: {n_cases} launch cases, {n_compiles} distinct compiles, "
               f"archs {', '.join(f'sm_{c}' for c in args.arch)}, {time.perf_counter() - t0:.0f} s")
    print(summary)
    if recorder is not None:
        recorder.add(summary)
        recorder.finish(not failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
