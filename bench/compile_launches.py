"""The compile gate's launches: every kernel launch of ``nsa.ops.triton``'s public ops, intercepted.

The gate (bench/compile_check.py) never writes a signature by hand: it drives the ops
(forward and backward, bf16) on ``meta`` tensors of every shipped config's shapes and of
extra layouts, records each kernel launch with its exact arguments, and checks that every
``@triton.jit`` function of the package is reached by one (directly or as a callee).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


PACKAGE = "nsa.ops.triton"


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
    """Names of kernels neither launched nor called from a launched kernel. ``launched`` holds
    one kernel per launch case (thousands, a few dozen distinct): each kernel's body is walked once."""
    reached = set(launched)
    for k in set(launched):
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


def drive_ops(shape: Shape, sms: int, capability: int) -> list[Launch]:
    """Run the ops of ``nsa.ops.triton`` (the model's attention ops, the contract's scores
    and ``select_blocks``, the gated combine and RoPE), forward and backward, in bf16 on
    meta tensors of ``shape`` (nothing is computed or allocated) and return their kernel
    launches, with the configs and splits the wrappers choose on a GPU of ``sms`` SMs and
    that compute ``capability`` (80, 90)."""
    import torch

    import nsa.ops.triton as T
    from nsa.ops.reference import num_compressed
    from nsa.ops.triton import tuning

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
        case = lambda: f"{shape.label} {step['op']}"  # noqa: E731
        with tuning.assumed_capability(capability), capture(case) as launches:
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
            from nsa.ops.triton.decode import DecodeSplits
            from nsa.ops.triton.decode_flash import MAX_FUSED_SLOTS

            q1 = torch.empty(s.B, 1, s.H, s.D, device="meta", dtype=torch.bfloat16)
            ring = torch.empty(s.B, min(s.window, s.T), s.G, s.D, device="meta", dtype=torch.bfloat16)
            pos = torch.empty(s.B, device="meta", dtype=torch.int64)
            # one program per group; split; split as at batch 1 and 64k on an H100 or H200
            # (the widest merge of partials and of candidate lists, MAX_SCORE_SPLITS)
            width = s.H * s.D + 6 * s.G * s.D + 3 * s.H  # a decode step's joint projection
            joint = torch.empty(s.B, 1, width, device="meta", dtype=torch.bfloat16)
            gate_logits = joint[..., -3 * s.H:].view(s.B, 1, s.H, 3)
            # many: the selected branch split past what its launch merges itself (the merge launch);
            # split: the branches' partials merged per branch, as at a large batch (else per head)
            for name, splits in (("whole", DecodeSplits()),
                                 ("split", DecodeSplits(2, 2, 2, 2, head_merges=False)),
                                 ("wide", DecodeSplits(33, 4, 64, 8)),
                                 ("many", DecodeSplits(2, 2, 2, MAX_FUSED_SLOTS + 1)),
                                 # every phase in one launch (decode_fused.py): unsplit, split, and
                                 # as at batch 1 and 64k on an H100 or H200
                                 ("one launch", DecodeSplits(one_launch=True)),
                                 ("one launch split", DecodeSplits(2, 2, 2, 2, one_launch=True)),
                                 ("one launch wide", DecodeSplits(16, 4, 32, 8, one_launch=True))):
                step["op"] = f"decode {name}"
                T.nsa_decode_branches(q1, kc, vc, k, v, ring, ring, pos, s.block, s.stride, s.select_block,
                                      s.n, 1, 2, splits=splits)
                step["op"] = f"decode gated {name}"
                T.nsa_decode_gated(q1, kc, vc, k, v, ring, ring, pos, gate_logits, s.block, s.stride,
                                   s.select_block, s.n, 1, 2, splits=splits)
            # a cache of 64 selection blocks scored by one program: the widest score tiles
            # (decode.MAX_SCORE_TILE blocks a merge), what any context past 2k tokens compiles
            long_t = 64 * s.select_block
            nc_long = num_compressed(long_t, s.block, s.stride)
            kc_long = torch.empty(s.B, nc_long, s.G, s.D, device="meta", dtype=torch.bfloat16)
            k_long = torch.empty(s.B, long_t, s.G, s.D, device="meta", dtype=torch.bfloat16)
            step["op"] = "decode long"
            T.nsa_decode_branches(q1, kc_long, kc_long, k_long, k_long, ring, ring, pos, s.block, s.stride,
                                  s.select_block, s.n, 1, 2, splits=DecodeSplits())
            step["op"] = "decode write"
            kv1 = torch.empty(s.B, 1, 6, s.G, s.D, device="meta", dtype=torch.bfloat16)
            raw = torch.empty(s.B, s.block, s.G, s.D, device="meta", dtype=torch.bfloat16)
            cos1 = torch.empty(s.T, s.D // 2, device="meta")  # RoPE's tables, a row per position
            nsa_pairs = [(raw, raw, False), (k, v, True), (ring, ring, True)]
            T.decode_write(q1, kv1, cos1, cos1, pos, nsa_pairs)
            T.decode_write(q1, kv1[:, :, :2], cos1, cos1, pos, [(k, v, True)])  # dense attention's
            # the block's RMSNorm folded into the joint GEMM: the views of its raw output, the
            # norm's input (the model's dim), the gates' logits finished in place with their bias
            dim_x = torch.empty(s.B, 1, s.H * s.D, device="meta", dtype=torch.bfloat16)
            q_in = joint[..., :s.H * s.D].view(s.B, 1, s.H, s.D)
            kv_in = joint[..., s.H * s.D:s.H * s.D + 6 * s.G * s.D].view(s.B, 1, 6, s.G, s.D)
            gate_bias = torch.empty(3 * s.H, device="meta", dtype=torch.bfloat16)
            T.decode_write(q_in, kv_in, cos1, cos1, pos, nsa_pairs, norm=(dim_x, 1e-5),
                           gates=(gate_logits, gate_bias))
            T.decode_write(q_in, kv_in[:, :, :2], cos1, cos1, pos, [(k, v, True)], norm=(dim_x, 1e-5))
            step["op"] = "decode combine"
            logits = torch.empty(s.B, 1, s.H, 3, device="meta", dtype=torch.bfloat16)
            T.gated_combine_logits(logits, q1, q1, q1)
            T.gated_combine_logits(gate_logits, q1, q1, q1)  # a slice of the joint projection, in place
            # split: merged by the launch's last program; wide: batch 1 at 64k, by a merge launch
            for name, n in (("whole", 1), ("split", 2), ("wide", 256)):
                step["op"] = f"dense decode {name}"
                T.dense_decode(q1, k, v, pos, splits=n)
            raw = torch.empty(s.B, s.block, s.G, s.D, device="meta", dtype=torch.bfloat16)
            hid = 4 * s.D  # phi's MLP, K's and V's stacked: pos, fc1, its bias, fc2, its bias
            sizes = ((2, s.block, s.D), (2, hid, s.block * s.D), (2, hid), (2, s.D, hid), (2, s.D))
            phi = [torch.empty(*size, device="meta", dtype=torch.bfloat16) for size in sizes]
            for name, weights in (("mlp", phi), ("avgpool", [])):
                step["op"] = f"decode compress {name}"
                T.decode_compress(raw, raw, pos, cos1, cos1, kc, vc, s.stride, *weights)
            step["op"] = "silu_mul"
            gate_up = torch.empty(s.B, 1, 2 * 4 * s.H * s.D, device="meta", dtype=torch.bfloat16)
            T.silu_mul(gate_up)
            T.silu_mul(gate_up, norm=(dim_x, 1e-5))  # the feed-forward's norm folded into its GEMM
    finally:
        T._sm_count = saved
    return launches
