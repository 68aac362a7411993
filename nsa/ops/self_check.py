"""Run every attention op of a backend once on tiny inputs and compare with the reference.

Why: a Triton kernel that the compiler rejects on this GPU (or that computes wrong numbers
there) would otherwise fail at the first training step, or worse, train silently wrong.
``choose_ops`` runs this check before training and decides which ops the run uses:
``backend: auto`` falls back to the reference ops when the check fails, and says so;
``backend: triton`` makes the failure an error.

The check uses the model's head layout and NSA settings (so the kernels compile with the
same tile sizes as in training), a short sequence, the training compute dtype, and a
private random generator (the global RNG, which seeds the model's weights, is untouched).
The kernels run with their output buffers poisoned (``nsa.ops.poison``): what a kernel
leaves unwritten cannot hold the right answer by chance (memory the reference's result
was freed from), and the report names it ("out not written").
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from nsa.ops import flex, poison, reference

# Relative error (Frobenius) allowed against the fp32 reference on the same inputs.
# 16-bit kernels round their inputs of every dot and P/dS to 8 (bf16) or 11 (fp16) bits;
# a broken kernel is off by O(1), not by 1e-2.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6, torch.bfloat16: 3e-2, torch.float16: 1e-2}

# The oldest Triton that compiles every kernel for sm_80 and sm_90 without a compiler
# error or a spill (bench/results/compile-triton-*.json, docs/install.md): Triton 3.1,
# torch 2.5's, aborts compiling some of them for sm_90 and spills in others, and 3.2 to
# 3.5 are not checked. On an older Triton the kernels are not tried at all (a compiler
# that aborts takes the process down with it, before any fallback): the reference ops
# run instead.
MIN_TRITON = (3, 6)

# The checks of FlexAttention's window branch, by name.
FLEX_WINDOW = "window_attention (FlexAttention)"
FLEX_WINDOW_CHECKPOINTED = "window_attention (FlexAttention, activation checkpointing)"


def triton_too_old(version: str) -> str | None:
    """Why the kernels must not run on Triton ``version`` (None when they may)."""
    release = []
    for part in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit()) or "0"
        release.append(int(digits))
    if tuple(release) >= MIN_TRITON:
        return None
    oldest = ".".join(map(str, MIN_TRITON))
    return (f"Triton {version} is older than {oldest}, the oldest Triton that compiles every kernel without "
            f"a compiler error or a register spill (3.1 aborts on some sm_90 kernels and spills in others; "
            f"3.2 to 3.5 are not checked); a torch that brings Triton >= {oldest} runs the kernels")


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """What the kernels are specialised on: head layout and NSA block sizes."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    compress_block: int = 32
    compress_stride: int = 16
    select_block: int = 64
    num_selected: int = 16
    num_initial: int = 1
    num_local: int = 2
    window: int = 512

    @classmethod
    def of_model(cls, model_cfg: Any) -> AttentionShape:
        a = model_cfg.attention
        return cls(model_cfg.n_heads, model_cfg.n_kv_heads, model_cfg.head_dim, a.compress_block,
                   a.compress_stride, a.select_block, a.num_selected, a.num_initial, a.num_local, a.window)


@dataclasses.dataclass
class CheckReport:
    """Which ops were run and what failed (``op: reason`` per failure)."""

    device: str
    dtype: str
    checked: list[str] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    # FlexAttention's window branch (nsa/ops/flex.py) is checked too where a run would
    # train on it; its failure turns that path off, not the kernels, so it is kept apart
    flex_failure: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def reason(self) -> str:
        return "; ".join(self.failures) if self.failures else "all ops agree with the reference"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _unwritten(name: str, val: torch.Tensor) -> str | None:
    """``name not written`` (at how many elements, when not all) where ``val`` still holds
    the poison its buffer was filled with, else None."""
    n = poison.unwritten(val)
    if n == 0:
        return None
    total = val.numel()
    return f"{name} not written" if n == total else f"{name} not written at {n} of {total} elements"


def _compare(report: CheckReport, op: str, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
             tol: float) -> None:
    bad = []
    for name, ref in want.items():
        val = got[name]
        if val is None or val.shape != ref.shape:
            got_shape = None if val is None else tuple(val.shape)
            bad.append(f"{name} has shape {got_shape}, expected {tuple(ref.shape)}")
        elif problem := _unwritten(name, val):
            bad.append(problem)
        elif not torch.isfinite(val).all():
            bad.append(f"{name} is not finite")
        else:
            err = _rel_err(val, ref)
            if not err <= tol:
                bad.append(f"{name} differs from the reference by {err:.2e} (tolerance {tol:.0e})")
    if bad:
        report.failures.append(f"{op}: " + ", ".join(bad))


def selection_mismatch(idx: torch.Tensor, ref_scores: torch.Tensor, select_block: int, num_selected: int,
                       num_initial: int, num_local: int, tol: float) -> str | None:
    """None when ``idx [B,T,G,n]`` is a choice the reference could make on ``ref_scores``
    up to near-ties, else what is wrong with the first bad row.

    A kernel ranks its own scores, which differ from the reference's by rounding (bf16:
    ~1e-2), so two blocks whose scores are that close may come out in either order. Each
    row must list distinct eligible blocks in ascending order with -1 after, as many as
    the reference, and the reference's keys of its blocks (forced blocks +inf, the
    others their score), sorted, must equal the keys of the reference's own choice within
    ``tol`` times the row's largest score.
    """
    want = reference.select_blocks(ref_scores, select_block, num_selected, num_initial, num_local)
    if idx.shape == want.shape and torch.equal(idx.cpu(), want.cpu()):
        return None
    if idx.shape != want.shape:
        return f"shape {tuple(idx.shape)}, expected {tuple(want.shape)}"
    idx, want, sc = idx.cpu(), want.cpu(), ref_scores.detach().double().cpu()
    B, T, G, ns = sc.shape
    t = torch.arange(T)[:, None]
    j = torch.arange(ns)[None, :]
    own = t // select_block
    eligible = (j <= own)[None, :, None, :]
    forced = eligible & ((j < num_initial) | (j > own - num_local))[None, :, None, :]
    key = torch.where(forced, torch.inf, torch.where(eligible, sc, -torch.inf))

    def keys(choice: torch.Tensor) -> torch.Tensor:
        k = torch.gather(key, -1, choice.clamp(0, ns - 1))
        return torch.where(choice >= 0, k, -torch.inf).sort(-1, descending=True).values

    used = idx >= 0
    ascending = (idx[..., 1:] > idx[..., :-1]) | ~used[..., 1:]
    ok = (used.sum(-1) == (want >= 0).sum(-1)) & ascending.all(-1) & (used[..., 1:] <= used[..., :-1]).all(-1)
    ok &= (idx < ns).all(-1) & (idx >= -1).all(-1)
    mine, theirs = keys(idx), keys(want)
    ok &= (~used | (torch.gather(key, -1, idx.clamp(0, ns - 1)) > -torch.inf)).all(-1)
    finite = torch.isfinite(theirs) & torch.isfinite(mine)
    scale = sc.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    close = torch.where(finite, (mine - theirs).abs() <= tol * scale, mine == theirs)
    ok &= close.all(-1)
    if bool(ok.all()):
        return None
    b, tt, g = (int(x) for x in (~ok).nonzero()[0])
    return (f"selection at b={b} t={tt} g={g}: {idx[b, tt, g].tolist()}, the reference chose "
            f"{want[b, tt, g].tolist()} (scores {[round(float(x), 6) for x in sc[b, tt, g]][:64]})")


def self_check(device: torch.device | str, dtype: torch.dtype, shape: AttentionShape,
               ops: ModuleType | None = None, seq_len: int | None = None, rope_only: bool = False
               ) -> CheckReport:
    """Run ``ops`` (default: the Triton kernels) forward and backward on ``device`` in
    ``dtype`` and compare every output and gradient with ``nsa.ops.reference`` in fp32 on
    the same (``dtype``-rounded) inputs. Never raises for a failing op: the report says.
    ``rope_only``: RoPE alone, the one kernel a dense model runs."""
    device = torch.device(device)
    s = shape
    report = CheckReport(str(device), str(dtype).replace("torch.", ""))
    start = time.perf_counter()
    try:
        if ops is None:
            import triton

            too_old = triton_too_old(triton.__version__)
            if too_old is not None:
                report.failures.append(f"triton: {too_old}")
                report.seconds = time.perf_counter() - start
                return report
        ops = ops or importlib.import_module("nsa.ops.triton")
    except Exception as exc:  # noqa: BLE001 - a failing import is a failing check
        report.failures.append(f"import nsa.ops.triton: {_one_line(exc)}")
        report.seconds = time.perf_counter() - start
        return report
    T = seq_len or 2 * s.select_block + s.compress_block + 16  # several selection blocks, partial tail
    H, G, D = s.n_heads, s.n_kv_heads, s.head_dim
    nc = reference.num_compressed(T, s.compress_block, s.compress_stride)
    gen = torch.Generator().manual_seed(0)

    def rand(*size: int) -> torch.Tensor:  # values exactly representable in ``dtype``
        return torch.randn(*size, generator=gen).to(dtype).float().to(device)

    q, dout = rand(1, T, H, D), rand(1, T, H, D)
    k, v = rand(1, T, G, D), rand(1, T, G, D)
    kc, vc = rand(1, nc, G, D), rand(1, nc, G, D)
    tol = TOLERANCE.get(dtype, 3e-2)

    def run(op: str, fn: Callable[[Any, list[torch.Tensor]], Any], inputs: list[torch.Tensor]) -> Any:
        """fn(ops, inputs) -> out or (out, extra); returns the reference's extra."""
        report.checked.append(op)
        mine = [x.detach().clone().to(dtype).requires_grad_() for x in inputs]
        theirs = [x.detach().clone().requires_grad_() for x in inputs]
        ref = fn(reference, theirs)
        ref_out, ref_extra = ref if isinstance(ref, tuple) else (ref, None)
        ref_out.backward(dout)
        want = {"out": ref_out, **{f"d{i}": x.grad for i, x in enumerate(theirs)}}
        if ref_extra is not None:
            want["extra"] = ref_extra
        try:
            with poison.poisoned():
                got_all = fn(ops, mine)
                got_out, got_extra = got_all if isinstance(got_all, tuple) else (got_all, None)
                got_out.backward(dout.to(got_out.dtype))
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # kernel errors surface here, inside the try
            got = {"out": got_out, **{f"d{i}": x.grad for i, x in enumerate(mine)}}
            if ref_extra is not None:
                got["extra"] = got_extra
            _compare(report, op, got, want, tol)
        except Exception as exc:  # noqa: BLE001 - compile errors, launch failures, anything
            report.failures.append(f"{op}: {_one_line(exc)}")
        return ref_extra

    if not rope_only:
        _check_branches(report, run, ops, device, dtype, s, q, k, v, kc, vc, tol)
    # the glue the model runs through ``ops`` where it has a kernel for it (the reference: torch)
    import nsa.ops as dispatch
    from nsa.ops.rope import rope_angles

    if hasattr(ops, "gated_combine") and not rope_only:
        gates = torch.rand(1, T, H, 3, generator=gen).to(dtype).float().to(device)
        o_slc, o_win = rand(1, T, H, D), rand(1, T, H, D)
        run("gated_combine", lambda m, x: dispatch.gated_combine(m, x[0], x[1], x[2], x[3]),
            [gates, q, o_slc, o_win])
    if hasattr(ops, "apply_rope"):
        cos, sin = rope_angles(torch.arange(T, device=device), D, 10000.0)
        run("apply_rope", lambda m, x: dispatch.apply_rope(m, x[0], cos, sin), [q])
    report.seconds = time.perf_counter() - start
    return report


def _check_branches(report: CheckReport, run: Callable[..., Any], ops: ModuleType, device: torch.device,
                    dtype: torch.dtype, s: AttentionShape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    kc: torch.Tensor, vc: torch.Tensor, tol: float) -> None:
    """``self_check``'s NSA branches: the compressed scores, the block choice, the fused
    compressed attention and selection, the selected and window branches (and FlexAttention's
    window, which a failure turns off, not the kernels)."""
    G = s.n_kv_heads
    scores = run("compressed_attention_and_scores", lambda m, x: m.compressed_attention_and_scores(
        x[0], x[1], x[2], s.compress_block, s.compress_stride, s.select_block, G), [q, kc, vc])
    idx = reference.select_blocks(scores.detach(), s.select_block, s.num_selected, s.num_initial, s.num_local)
    report.checked.append("select_blocks")
    try:
        with poison.poisoned():
            mine_idx = ops.select_blocks(scores.detach(), s.select_block, s.num_selected, s.num_initial,
                                         s.num_local)
        if problem := _unwritten("idx", mine_idx):
            report.failures.append(f"select_blocks: {problem}")
        elif not torch.equal(mine_idx.cpu(), idx.cpu()):
            report.failures.append("select_blocks: not the reference's block choice on the same scores")
    except Exception as exc:  # noqa: BLE001
        report.failures.append(f"select_blocks: {_one_line(exc)}")
    if hasattr(ops, "compressed_attention_and_selection"):
        chosen: dict[str, torch.Tensor] = {}

        def fused(m: Any, x: list[torch.Tensor]) -> torch.Tensor:
            if m is reference:  # no fused op: its output is the compressed branch's
                return m.compressed_attention_and_scores(x[0], x[1], x[2], s.compress_block,
                                                         s.compress_stride, s.select_block, G)[0]
            out, chosen["idx"] = m.compressed_attention_and_selection(
                x[0], x[1], x[2], s.compress_block, s.compress_stride, s.select_block, G, s.num_selected,
                s.num_initial, s.num_local)
            return out

        run("compressed_attention_and_selection", fused, [q, kc, vc])
        if "idx" in chosen:
            problem = _unwritten("idx", chosen["idx"]) or selection_mismatch(
                chosen["idx"], scores, s.select_block, s.num_selected, s.num_initial, s.num_local, tol)
            if problem is not None:
                report.failures.append(f"compressed_attention_and_selection: {problem}")
    run("selected_attention", lambda m, x: m.selected_attention(x[0], x[1], x[2], idx, s.select_block),
        [q, k, v])
    run("window_attention", lambda m, x: m.window_attention(x[0], x[1], x[2], s.window), [q, k, v])
    if ops is not reference and flex.unsuited(device, dtype, s.head_dim) is None:
        failed = len(report.failures)

        def flex_window(m: Any, x: list[torch.Tensor]) -> torch.Tensor:
            window = m.window_attention if m is reference else flex.window_attention
            return window(x[0], x[1], x[2], s.window)

        run(FLEX_WINDOW, flex_window, [q, k, v])
        # as a block under activation checkpointing runs it (recomputed in the backward)
        run(FLEX_WINDOW_CHECKPOINTED, lambda m, x: checkpoint(flex_window, m, x, use_reentrant=False),
            [q, k, v])
        if len(report.failures) > failed:
            report.flex_failure = "; ".join(report.failures[failed:])
            del report.failures[failed:]
