"""NSA vs dense attention on one CUDA GPU: every case of docs/kernels.md, in one command.

    python -m bench.run [--quick] [--out-dir bench/results] [--no-train] [--no-reference]
                        [--no-check] [--no-breakdown] [--seqs 2048 8192 ...]
                        [--layouts nsa-125m paper] [--tag NAME]

Rows (bench/report.py), at seq 2k..64k with the nsa-125m head layout (16 q heads, 1 KV
group, dim 64) and the paper's (64, 4, 128):

- ``attn_fwd``: the attention forward under ``no_grad`` (inference);
  ``attn_fwd_train``: the same forward recording autograd (inputs require grad; what a
  training step pays, saved tensors included); ``attn_bwd``: the backward alone (the
  forward runs untimed before each timed backward). For ``nsa_triton``, ``nsa_reference``
  (until it runs out of memory) and one dense impl per SDPA backend: ``dense_flash``,
  ``dense_cudnn``, ``dense_efficient`` (causal; native GQA where the backend takes it, else
  K/V repeated per head; a backend the GPU or this torch lacks gives a ``skipped`` row
  with the reason).
- every ``nsa_triton`` row is checked against the reference ops on the same inputs
  (bench/check.py): ``max_err`` is the largest relative error (output and block scores
  for the forward rows, the gradient of every input for the backward), and ``status``
  says ``mismatch`` when it is over the tests' bar (bf16: 1e-2).
- a per-kernel breakdown of one ``nsa_triton`` fwd+bwd per case (torch.profiler device
  time per kernel name; bench/breakdown.py): the ``kernels`` list in the JSON and one
  table per case in the Markdown.
- ``train_step`` (forward, loss, backward, clip, AdamW) of nsa-125m vs dense-125m at
  seq 2048 and 16k, eager (``nsa_triton``, ``dense_sdpa``) and with the forward and backward
  replayed from a CUDA graph as ``train.cuda_graph`` does (``nsa_triton_graph``,
  ``dense_sdpa_graph``; ``failed: ...`` when the graph's proof against eager fails); and
  ``select_topn``, the top-n block selection alone.

Times are medians over CUDA-event timings after warm-up. Memory (``peak_mem_bytes``) is
the growth over what was allocated before the timed calls (the inputs, the model):
``max_memory_allocated`` during them minus ``memory_allocated`` before. Dense rows
always come from the same run. bf16 throughout (train: bf16 autocast over fp32 weights).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import importlib
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.breakdown import kernel_breakdown, profile_kernels  # noqa: E402
from bench.check import check_nsa, verdict  # noqa: E402
from bench.core import NSA, attention_inputs, nsa_attention  # noqa: E402
from bench.report import write_results  # noqa: E402

__all__ = ["NSA", "attention_inputs", "nsa_attention", "main"]

LAYOUTS = {"nsa-125m": (16, 1, 64), "paper": (64, 4, 128)}  # H, G, D: run by default
# Only with --layouts: 4 query heads per group, where the selected kernels tile several
# positions (or pad, with --sel-positions 1): the measurement behind that choice.
EXTRA_LAYOUTS = {"h16-g4": (16, 4, 64)}
SEQS = (2048, 8192, 16384, 32768, 65536)
TRAIN_CASES = ((2048, 8), (16384, 1))  # (seq_len, batch)
DENSE_BACKENDS = ("dense_flash", "dense_cudnn", "dense_efficient")
ATTN_OPS = ("attn_fwd", "attn_fwd_train", "attn_bwd")


def time_cuda(fn: Callable[[Any], None], setup: Callable[[], Any] | None, warmup: int,
              iters: int) -> tuple[float, int | None]:
    """(median ms of ``fn(setup())`` measured with CUDA events, peak memory growth in bytes).

    The growth: ``max_memory_allocated`` over the timed calls and their setup minus
    ``memory_allocated`` just before them (after warm-up), i.e. what the calls need on
    top of their inputs. Without CUDA (only the CPU smoke test of this module's code
    paths) it times with perf_counter and reports no memory; the CLI never writes such rows."""
    if not torch.cuda.is_available():
        times = []
        for i in range(warmup + iters):
            state = setup() if setup else None
            t0 = time.perf_counter()
            fn(state)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), None
    for _ in range(warmup):
        fn(setup() if setup else None)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(iters):
        state = setup() if setup else None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(state)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        del state
    return statistics.median(times), torch.cuda.max_memory_allocated() - base


def _sdpa_backend(impl: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {"dense_flash": SDPBackend.FLASH_ATTENTION, "dense_cudnn": SDPBackend.CUDNN_ATTENTION,
            "dense_efficient": SDPBackend.EFFICIENT_ATTENTION}[impl]


def _dense_variants(impl: str) -> list[tuple[str, Callable[..., torch.Tensor]]]:
    """Causal SDPA in [B, H, T, D] restricted to one backend: native GQA first, then K/V
    repeated per query head (what DenseAttention does)."""
    from torch.nn.attention import sdpa_kernel

    backend = _sdpa_backend(impl)

    def gqa(q, k, v):
        with sdpa_kernel(backend):
            gqa = q.shape[1] != k.shape[1]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def repeat(q, k, v):
        r = q.shape[1] // k.shape[1]
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1),
                                                  is_causal=True)

    return [("enable_gqa", gqa), ("K/V repeated per head", repeat)]


class BackendUnavailable(RuntimeError):
    """An SDPA backend does not run these inputs on this GPU / torch (the reason)."""


def _pick_dense(impl: str, xs: list[torch.Tensor]) -> tuple[str, Callable[..., torch.Tensor]]:
    """The first variant of ``impl``'s backend that runs forward and backward on these
    inputs; ``BackendUnavailable`` with the errors (and SDPA's warnings, which name the
    reason a backend was not used) when none does."""
    errors = []
    for name, fn in _dense_variants(impl):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                leaves = [x.detach().requires_grad_() for x in xs]
                fn(*leaves).sum().backward()
                return name, fn
            except torch.cuda.OutOfMemoryError:
                raise
            except RuntimeError as exc:
                why = {" ".join(str(w.message).split())[:160] for w in caught}
                errors.append(f"{name}: {'; '.join(sorted(why)) or ' '.join(str(exc).split())[:100]}")
    raise BackendUnavailable("; ".join(errors))


def _ops(impl: str) -> Any:
    return importlib.import_module("nsa.ops.reference" if impl == "nsa_reference" else "nsa.ops.triton")


def bench_attention(impl: str, layout: str, T: int, B: int, warmup: int, iters: int, device: str = "cuda",
                    dims: tuple[int, int, int] | None = None, check: bool = True,
                    check_max_len: int | None = None) -> list[dict[str, Any]]:
    """attn_fwd, attn_fwd_train and attn_bwd rows of one implementation at one shape (bf16
    on CUDA; fp32 on CPU, where only the smoke test runs it, with ``dims`` overriding the
    layout's H, G, D). ``nsa_triton`` rows carry the check against the reference."""
    H, G, D = dims or {**LAYOUTS, **EXTRA_LAYOUTS}[layout]
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    xs = attention_inputs(impl, B, T, H, G, D, device, dt)
    note = f"H={H} G={G} D={D} {str(dt).removeprefix('torch.')}"
    ident = dict(impl=impl, layout=layout, seq_len=T, batch=B, tokens_per_s=None)
    if impl.startswith("dense"):
        try:
            variant, fwd = _pick_dense(impl, xs)
        except BackendUnavailable as exc:
            return [dict(ident, op=op, ms=None, peak_mem_bytes=None, max_err=None, status=f"skipped: {exc}",
                         note=note) for op in ATTN_OPS]
        note += f", causal sdpa {impl.removeprefix('dense_')}, {variant}"
    else:
        ops = _ops(impl)
        fwd = lambda *xs: nsa_attention(ops, *xs)  # noqa: E731
        if impl == "nsa_triton":
            from nsa.ops.triton import selected

            note += f", selected positions/program {selected.POSITIONS or 'auto'}"
    rows = []
    with torch.no_grad():
        ms, mem = time_cuda(lambda _: fwd(*xs), None, warmup, iters)
    rows.append(dict(op="attn_fwd", ms=ms, peak_mem_bytes=mem))
    leaves = [x.requires_grad_() for x in xs]
    grad_out = None

    def setup():
        nonlocal grad_out
        for x in leaves:
            x.grad = None
        out = fwd(*leaves)
        if grad_out is None:
            grad_out = torch.randn_like(out)
        return out

    ms, mem = time_cuda(lambda _: setup(), None, warmup, iters)  # forward recording autograd
    rows.append(dict(op="attn_fwd_train", ms=ms, peak_mem_bytes=mem))
    ms, mem = time_cuda(lambda out: out.backward(grad_out), setup, warmup, iters)
    rows.append(dict(op="attn_bwd", ms=ms, peak_mem_bytes=mem))
    for r in rows:
        r.update(ident, max_err=None, status="ok", note=note)
    if impl == "nsa_triton" and check:
        try:
            res = check_nsa(ops, [x.detach() for x in xs], grad_out, check_max_len)
        except Exception as exc:  # noqa: BLE001 - keep the timings; the row says it is unchecked
            for r in rows:
                r["status"] = f"check error: {type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
        else:
            _apply_check(rows, res)
    return rows


def _apply_check(rows: list[dict[str, Any]], res: dict[str, Any]) -> None:
    """Write a check's verdict into the attention rows: forward rows get the output/score
    error, the backward row the largest input-gradient error."""
    T = rows[0]["seq_len"]
    where = "" if res["checked_len"] == T else f" (first {res['checked_len']} positions)"
    worst = {"fwd": max(("out", "scores"), key=lambda k: res["errors"][k])}
    grads = {k: v for k, v in res["errors"].items() if k.startswith("d")}
    if grads:
        worst["bwd"] = max(grads, key=grads.get)
    for r in rows:
        kind = "bwd" if r["op"] == "attn_bwd" else "fwd"
        err = res[f"{kind}_err"]
        r["max_err"] = err
        r["status"] = verdict(err, res["tolerance"], worst.get(kind, ""))
        r["note"] += f"; checked vs reference{where}"


def profile_case(layout: str, T: int, B: int, device: str = "cuda",
                 dims: tuple[int, int, int] | None = None) -> list[dict[str, Any]]:
    """Per-kernel device time of one ``nsa_triton`` fwd+bwd (after one warm-up call)."""
    H, G, D = dims or {**LAYOUTS, **EXTRA_LAYOUTS}[layout]
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    xs = [x.requires_grad_() for x in attention_inputs("nsa_triton", B, T, H, G, D, device, dt)]
    ops = _ops("nsa_triton")

    def step() -> None:
        for x in xs:  # as the timed rows: fresh gradients, no accumulation into the warm-up's
            x.grad = None
        out = nsa_attention(ops, *xs)
        out.backward(torch.ones_like(out))

    step()
    rows = kernel_breakdown(profile_kernels(step, device))
    for r in rows:
        r.update(impl="nsa_triton", layout=layout, seq_len=T, batch=B)
    return rows


def bare_loss(model: Any, vocab: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The bare step's loss of a batch ``[B, T + 1]``: bf16 autocast forward on CUDA, fp32
    cross-entropy."""
    def loss_fn(batch: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=batch.device.type == "cuda"):
            logits = model(batch[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, vocab), batch[:, 1:].reshape(-1))

    return loss_fn


def train_step_fn(model: Any, opt: Any, tokens: torch.Tensor, vocab: int, grad_clip: float
                  ) -> Callable[[Any], None]:
    """The bare train step on one batch ``tokens [B, T + 1]``: ``bare_loss``, backward, clip,
    optimizer step (bench.trainer_overhead times nsa-train's step against this one)."""
    loss_fn = bare_loss(model, vocab)

    def step(_: Any) -> None:
        loss_fn(tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def graphed_train_step_fn(model: Any, opt: Any, tokens: torch.Tensor, vocab: int, grad_clip: float
                          ) -> tuple[Callable[[Any], None] | None, str]:
    """The bare train step with its forward, loss and backward replayed from one CUDA graph, as
    nsa-train's ``train.cuda_graph`` runs it (nsa/train/graphed.py), once the graph is proved
    against eager on ``tokens``: (step, what the proof said); (None, why) when it failed."""
    from nsa.train.graphed import GraphedMicroStep

    micro = GraphedMicroStep(bare_loss(model, vocab), [p for p in model.parameters() if p.requires_grad])
    if not micro.prepare(tokens):
        return None, micro.why

    def step(_: Any) -> None:
        micro.step(tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=False)  # the graph adds into these buffers

    return step, micro.why


def bench_train(config: str, T: int, B: int, warmup: int, iters: int, device: str = "cuda",
                graph: bool = False) -> dict[str, Any]:
    """One train_step row: bf16 autocast forward, cross-entropy, backward, clip, AdamW; with
    ``graph``, the forward and backward replayed from a CUDA graph (impl ``..._graph``).

    ``config``: a name under configs/ or a path to a config file."""
    from nsa.config import load_config
    from nsa.model import build_model
    from nsa.train.trainer import build_optimizer

    path = Path(config) if config.endswith(".yaml") else ROOT / "configs" / f"{config}.yaml"
    cfg = load_config(path, [f"train.seq_len={T}", f"train.batch_size={B}"])
    if cfg.model.attention.kind == "nsa":
        cfg.model.attention.backend = "triton"
    dev = torch.device(device)
    torch.manual_seed(0)
    model = build_model(cfg.model).to(dev)
    opt = build_optimizer(model, cfg, dev)
    tokens = torch.randint(0, 256, (B, T + 1), device=dev)
    impl = ("nsa_triton" if cfg.model.attention.kind == "nsa" else "dense_sdpa") + ("_graph" * graph)
    note = f"{model.param_count() / 1e6:.1f}M params, bf16 autocast, fused AdamW"
    if graph:
        maybe, why = graphed_train_step_fn(model, opt, tokens, cfg.model.vocab_size, cfg.train.grad_clip)
        if maybe is None:
            return _failed(f"failed: {why}", op="train_step", impl=impl, layout=cfg.name, seq_len=T,
                           batch=B, note=note)
        step, note = maybe, f"{note}; {why}"
    else:
        step = train_step_fn(model, opt, tokens, cfg.model.vocab_size, cfg.train.grad_clip)
    ms, mem = time_cuda(step, None, warmup, iters)
    return dict(op="train_step", impl=impl, layout=cfg.name, seq_len=T, batch=B, ms=ms,
                tokens_per_s=B * T / (ms / 1000.0), peak_mem_bytes=mem, max_err=None, status="ok", note=note)


def bench_select(impl: str, layout: str, T: int, B: int, warmup: int, iters: int,
                 device: str = "cuda") -> list[dict[str, Any]]:
    """``select_topn`` row: the top-n alone on random scores (``ops.select_blocks``: the Triton
    selection kernel or the reference's torch top-n); the model fuses it into the scores kernel."""
    G = {**LAYOUTS, **EXTRA_LAYOUTS}[layout][1]
    ops = _ops(impl)
    ns = -(-T // NSA["select_block"])
    scores = torch.rand(B, T, G, ns, device=device)
    args = (NSA["select_block"], NSA["num_selected"], NSA["num_initial"], NSA["num_local"])
    ms, mem = time_cuda(lambda _: ops.select_blocks(scores, *args), None, warmup, iters)
    return [dict(op="select_topn", impl=impl, layout=layout, seq_len=T, batch=B, ms=ms, tokens_per_s=None,
                 peak_mem_bytes=mem, max_err=None, status="ok", note=f"scores [B,T,{G},{ns}] fp32")]


def _failed(status: str, **kw: Any) -> dict[str, Any]:
    return dict(ms=None, tokens_per_s=None, peak_mem_bytes=None, max_err=None, status=status, **kw)


def _guard(make: Callable[[], list[dict[str, Any]]], ident: dict[str, Any],
           ops: tuple[str, ...]) -> list[dict[str, Any]]:
    """Run one case; an out-of-memory or any other error becomes a row saying so."""
    try:
        return make()
    except torch.cuda.OutOfMemoryError:
        status = "oom"
    except Exception as exc:  # noqa: BLE001 - the benchmark must run end to end
        status = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    torch.cuda.empty_cache()
    return [_failed(status, op=op, note="", **ident) for op in ops]


def _profile_guarded(layout: str, T: int, B: int) -> list[dict[str, Any]]:
    """``profile_case``; a failure becomes one entry saying so (the benchmark runs on)."""
    try:
        return profile_case(layout, T, B)
    except Exception as exc:  # noqa: BLE001
        torch.cuda.empty_cache()
        why = "oom" if isinstance(exc, torch.cuda.OutOfMemoryError) else f"{type(exc).__name__}: {exc}"
        return [dict(impl="nsa_triton", layout=layout, seq_len=T, batch=B,
                     kernel=f"(profile failed: {why})"[:200], calls=0, device_ms=None, share=None)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2k and 8k, nsa-125m layout, few iters")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--no-train", action="store_true", help="skip the train_step rows")
    ap.add_argument("--train-only", action="store_true",
                    help="only the train_step rows (nsa-125m and dense-125m, eager and from a CUDA graph)")
    ap.add_argument("--no-reference", action="store_true", help="skip the nsa_reference rows")
    ap.add_argument("--no-check", action="store_true", help="skip the nsa_triton vs reference check")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-kernel profile")
    ap.add_argument("--tokens", type=int, default=65536, help="attention batch = max(1, tokens // seq_len)")
    ap.add_argument("--seqs", type=int, nargs="+", help=f"attention sequence lengths (default {SEQS})")
    ap.add_argument("--layouts", nargs="+", choices=list(LAYOUTS) + list(EXTRA_LAYOUTS),
                    help=f"head layouts (default {list(LAYOUTS)})")
    ap.add_argument("--sel-positions", type=int, help="query positions per selected-attention program "
                    "(default: fill a 16-row tile; 1 = pad the heads)")
    ap.add_argument("--tag", default="", help="suffix of the results file name (several partial runs a day)")
    args = ap.parse_args(argv)
    if args.train_only and (args.no_train or args.seqs or args.layouts):
        ap.error("--train-only runs the train_step rows alone, at their own shapes: it takes no --no-train, "
                 "--seqs or --layouts")
    if not torch.cuda.is_available():
        print("bench.run: no CUDA device here; this benchmark measures GPU kernels and needs one "
              "(nothing was measured, no results written).", file=sys.stderr)
        return 2
    import triton

    if args.sel_positions is not None:
        from nsa.ops.triton import selected

        selected.POSITIONS = args.sel_positions
    device = torch.cuda.get_device_name()
    seqs = args.seqs or (SEQS[:2] if args.quick else SEQS)
    layouts = args.layouts or (["nsa-125m"] if args.quick else list(LAYOUTS))
    warmup, iters = (1, 3) if args.quick else (3, 10)
    impls = ["nsa_triton", *DENSE_BACKENDS] + ([] if args.no_reference else ["nsa_reference"])
    common = dict(device=device, torch=torch.__version__, triton=triton.__version__)
    rows: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    stem_date = date + ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
    meta = dict(common, argv=sys.argv[1:], quick=args.quick, nsa_hparams=NSA,
                tokens_per_attn_batch=args.tokens, sel_positions=args.sel_positions)

    def save() -> tuple[Path, Path]:  # after every case: a crash keeps what was measured
        return write_results(rows, args.out_dir, device, stem_date, meta, kernels)

    def record(got: list[dict[str, Any]]) -> None:
        for r in got:
            r.update(common)
            print(_line(r), flush=True)
        rows.extend(got)
        save()
        torch.cuda.empty_cache()

    for layout in [] if args.train_only else layouts:
        for impl in impls:
            gave_up = False
            for T in seqs:
                B = max(1, args.tokens // T)
                ident = dict(impl=impl, layout=layout, seq_len=T, batch=B)
                if gave_up:  # a shorter sequence already ran out of memory
                    got = [_failed("skipped (oom at a shorter seq)", op=op, note="", **ident)
                           for op in ATTN_OPS]
                else:
                    w, n = (1, 2) if impl == "nsa_reference" else (warmup, iters)
                    got = _guard(functools.partial(bench_attention, impl, layout, T, B, w, n,
                                                   check=not args.no_check), ident, ATTN_OPS)
                    gave_up = any(r["status"] == "oom" for r in got)
                if impl.startswith("nsa"):
                    got += _guard(functools.partial(bench_select, impl, layout, T, B, warmup, iters),
                                  ident, ("select_topn",))
                if impl == "nsa_triton" and not args.no_breakdown and not gave_up:
                    kernels.extend(_profile_guarded(layout, T, B))
                record(got)
    if not args.no_train:
        cases = TRAIN_CASES[:1] if args.quick else TRAIN_CASES
        for T, B in cases:
            for graph in (False, True):
                for config in ("nsa-125m", "dense-125m"):
                    impl = ("nsa_triton" if config == "nsa-125m" else "dense_sdpa") + ("_graph" * graph)
                    ident = dict(impl=impl, layout=config, seq_len=T, batch=B)
                    make = functools.partial(bench_train, config, T, B, warmup, iters, graph=graph)
                    got = _guard(lambda make=make: [make()], ident, ("train_step",))
                    record(got)
    jpath, mpath = save()
    print(f"wrote {jpath} and {mpath}")
    return 0


def _line(r: dict[str, Any]) -> str:
    ms = "-" if r["ms"] is None else f"{r['ms']:.3f} ms"
    err = "" if r.get("max_err") is None else f" err {r['max_err']:.1e}"
    return (f"{r['op']:14s} {r['impl']:15s} {r['layout']:10s} T={r['seq_len']:6d} B={r['batch']:3d} "
            f"{ms}{err} {r['status']}")


if __name__ == "__main__":
    sys.exit(main())
