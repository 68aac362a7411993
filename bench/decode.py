"""Decode cost of NSA against dense attention: KV tokens loaded per decoded token, and
measured decode speed and memory with the KV-cache decoder (nsa/infer/).

    python -m bench.decode --analytic                  # the loaded-token table alone
    python -m bench.decode [--contexts 4096 ... 65536] [--steps 32] [--batch 1] [--stagger]
                           [--device cpu|cuda] [--dtype fp32|bf16] [--threads N] [--eager]
                           [--kernels] [--json OUT]

Loaded tokens (per layer and KV group, for the one query of a decoded token whose context
holds s tokens, itself included):

- dense: every key, ``s``;
- NSA, the paper's estimate (arXiv 2502.11089, Table 4): ``s/d + n*l' + w``;
- NSA, counted exactly for this model: the compressed tokens whose block has ended,
  ``(s - l)//d + 1``; the tokens ``<= t`` of the n selected blocks (the query's own block
  is always among them, and is partial); the window, ``min(w, s)``. Each branch has its
  own K/V (docs/model.md), so the three counts add up.

The paper's config (l=32, d=16, l'=64, n=16, w=512) must give its 4.0x / 6.4x / 9.1x /
11.6x at 8k / 16k / 32k / 64k (tests/test_bench_decode.py checks it). nsa-125m uses the
same NSA hyperparameters, so its row is the same.

Measured: configs/nsa-125m.yaml against configs/dense-125m.yaml (random weights: speed
and memory do not depend on them), batch ``--batch``, caches filled with random K/V at
context s (a prefill of 64k tokens would dominate the run and is not what is measured),
then ``--steps`` timed decode steps (each also choosing the next token, greedily) through
``nsa.infer.graph.DecodeRunner``: on CUDA the step is captured as a CUDA graph after its
warm-up steps and replayed (``--eager``: no graph), on CPU it runs eagerly; every row and
the JSON say which (``decode_path``). NSA's steps come in two kinds, each its own graph: 1
in d (16) completes a compressed block and runs the compression, the others skip it; the
warm-up goes on until both are captured, and the default 32 timed steps hold them in that
proportion. With ``--stagger`` sequence b starts at ``context - (b % d)``: from a batch of d
on, some sequence completes a block at every step, so every step compresses, as in a batch
of prompts of their own lengths. The warm-up steps and the captures are not timed.
tokens/s = batch * steps / time: wall time on CUDA; on CPU the process's CPU time (steadier
on a shared machine; with one thread, ``--threads 1``, it is the work done). Memory: the
caches' bytes, and on CUDA the peak allocated during the steps over what was allocated
before them (the model and caches excluded). ``--kernels``: before the timed run, what one
eager step of each kind runs (``torch.profiler``, on the second step of its kind: the first
compiles), in every row as ``kernels_per_step`` (``plain`` and ``compressing`` for NSA, ``step``
for dense): how many, their summed device time, and the ten that took the most of it with
their calls. On CUDA these are kernels: a replayed step pays about one launch latency for
each, and the step's wall time less their busy time is what the launches and gaps cost. On
the CPU they are torch's operators with their self CPU time (the same accounting as
``bench.run``'s breakdown there).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.breakdown import kernel_breakdown, profile_kernels  # noqa: E402
from nsa.config import AttentionConfig, ModelConfig, load_config  # noqa: E402
from nsa.infer import DecodeState, decode_step, make_cache  # noqa: E402
from nsa.infer.decode import compresses  # noqa: E402
from nsa.infer.fused import fused_op  # noqa: E402
from nsa.infer.graph import CUDA_GRAPH, WARMUP, DecodeRunner  # noqa: E402
from nsa.model import build_model  # noqa: E402
from nsa.model.layers import upcast_dtype  # noqa: E402
from nsa.ops.reference import num_compressed, num_select_blocks  # noqa: E402
from nsa.ops.rope import rope_table  # noqa: E402

CONTEXTS = [4096, 8192, 16384, 32768, 65536]
PAPER = AttentionConfig(kind="nsa", compress_block=32, compress_stride=16, select_block=64, num_selected=16,
                        num_initial=1, num_local=2, window=512)


def loaded_tokens(s: int, a: AttentionConfig) -> dict[str, float]:
    """KV tokens one decoded token's query loads at context ``s`` (see the module docstring)."""
    d, lp, n, w = a.compress_stride, a.select_block, a.num_selected, a.window
    blocks = num_select_blocks(s, lp)
    if blocks <= n:
        selected = s  # every block, the own one up to the query
    else:
        selected = (n - 1) * lp + (s - (blocks - 1) * lp)
    exact = num_compressed(s, a.compress_block, d) + selected + min(w, s)
    return {"dense": s, "nsa_paper": s / d + n * lp + w, "nsa_exact": exact}


def analytic_rows(contexts: list[int], configs: dict[str, AttentionConfig]) -> list[dict[str, Any]]:
    rows = []
    for name, a in configs.items():
        for s in contexts:
            t = loaded_tokens(s, a)
            rows.append({"config": name, "context": s, **t, "ratio_paper": s / t["nsa_paper"],
                         "ratio_exact": s / t["nsa_exact"]})
    return rows


def analytic_table(rows: list[dict[str, Any]]) -> str:
    out = ["| config | context | dense loads | NSA loads (paper: s/d + n*l' + w) | ratio | "
           "NSA loads (exact) | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['config']} | {r['context']:,} | {r['dense']:,} | {r['nsa_paper']:,.0f} | "
                   f"{r['ratio_paper']:.1f}x | {r['nsa_exact']:,} | {r['ratio_exact']:.2f}x |")
    return "\n".join(out)


def staggered_lengths(batch: int, context: int, stagger: int) -> list[int]:
    """Sequence b's length: ``context`` less ``b % stagger`` (0 or 1: all at ``context``). With
    ``stagger`` = d and a batch of at least d, some sequence completes a compression block at
    every step, as in a batch of prompts of their own lengths."""
    return [context - (b % max(1, stagger)) for b in range(batch)]


def filled_state(model: torch.nn.Module, batch: int, context: int, extra: int, dtype: torch.dtype,
                 device: torch.device, stagger: int = 0) -> DecodeState:
    """Caches at ``context`` tokens per sequence (``stagger``: ``staggered_lengths``) holding
    random K/V (room for ``extra`` more)."""
    cfg = model.cfg
    rope = rope_table(context + extra, cfg.head_dim, cfg.rope_theta, upcast_dtype(dtype), device)  # prefill's
    caches = [make_cache(b.attn, batch, context + extra, rope) for b in model.blocks]
    gen = torch.Generator(device=device).manual_seed(0)
    for c in caches:
        c.allocate(dtype, device)
        for t in c.cache_tensors():
            t.copy_(torch.randn(t.shape, generator=gen, device=device, dtype=torch.float32).to(dtype))
    lens = staggered_lengths(batch, context, stagger)
    lengths = torch.tensor(lens, dtype=torch.long, device=device)
    return DecodeState(caches, lengths, context, caches[0].capacity, lens)


def step_ops(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> str:
    """What a decode step runs besides its matmuls: the fused kernels (CUDA) or torch's ops."""
    probe = torch.empty(0, dtype=dtype, device=device)
    return "fused kernels" if fused_op(cfg.attention.backend, probe, "silu_mul") is not None else "torch ops"


def _step_kind(model: torch.nn.Module, state: DecodeState) -> str:
    if model.cfg.attention.kind != "nsa":
        return "step"
    return "compressing" if compresses(model, state) else "plain"


def kernels_per_step(model: torch.nn.Module, state: DecodeState, kinds: int, most: int
                     ) -> dict[str, Any]:
    """What one eager decode step of each kind runs (NSA: ``plain`` and ``compressing``; dense:
    ``step``), profiled on the second step of its kind (the first compiles kernels and
    initialises libraries): ``<kind>`` the number of kernels (CUDA) or operators (CPU),
    ``<kind>_us`` their summed device time (CPU: self CPU time), ``<kind>_top`` the ten that
    took the most of it (``kernel``, ``calls``, ``us``). Real steps: the state moves on (at
    most ``most`` of them)."""
    device = state.lengths.device.type
    seen: dict[str, int] = {}
    counts: dict[str, Any] = {}
    tok = torch.zeros(state.lengths.shape[0], dtype=torch.long, device=state.lengths.device)
    for _ in range(most):
        if len(seen) == kinds and all(n >= 2 for n in seen.values()):
            break
        kind = _step_kind(model, state)
        seen[kind] = seen.get(kind, 0) + 1
        if seen[kind] != 2:
            decode_step(model, state, tok)
            continue
        if device == "cuda":
            torch.cuda.synchronize()
        events = profile_kernels(lambda: decode_step(model, state, tok), device)
        by_name = kernel_breakdown(events)
        counts[kind] = len(events)
        counts[kind + "_us"] = round(sum(us for _, us in events), 1)
        counts[kind + "_top"] = [dict(kernel=k["kernel"], calls=k["calls"], us=round(1e3 * k["device_ms"], 1))
                                 for k in by_name[:10]]
    return counts


def measure(cfg: ModelConfig, context: int, steps: int, batch: int, dtype: torch.dtype,
            device: torch.device, graph: bool | None = None, stagger: int = 0,
            kernels: bool = False) -> dict[str, Any]:
    """Decode ``steps`` tokens per sequence after ``context`` tokens: speed and memory.
    ``graph``: as ``DecodeRunner``'s (None: a CUDA graph on CUDA); ``stagger``: the
    sequences' lengths spread below ``context`` (``staggered_lengths``); ``kernels``:
    first profile one step of each kind (``kernels_per_step``)."""
    torch.manual_seed(0)
    model = build_model(cfg).to(device=device, dtype=dtype).eval()
    # eager warm-up steps, then (CUDA graph) the one that captures; an NSA step comes in two
    # kinds (one completes a compressed block, d - 1 of every d do not), each with its graph
    kinds = 2 if cfg.attention.kind == "nsa" else 1
    cycle = cfg.attention.compress_stride if kinds == 2 else 1  # steps until each kind has come
    most = (WARMUP + 1) * cycle + 1
    count_steps = 2 * cycle + 1 if kernels else 0
    state = filled_state(model, batch, context, steps + most + count_steps, dtype, device, stagger)
    cache_bytes = sum(t.numel() * t.element_size() for c in state.caches for t in c.cache_tensors())
    per_step = kernels_per_step(model, state, kinds, count_steps) if kernels else None
    runner = DecodeRunner(model, state, graph=graph)
    tok = torch.zeros(batch, dtype=torch.long, device=device)
    for i in range(most):
        if i >= WARMUP + 1 and (runner.path != CUDA_GRAPH or len(runner.graphs) == kinds):
            break
        tok = runner.step(tok)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        tok = runner.step(tok)
    sync()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    # On CPU the process's CPU time is the steadier clock on a shared machine (with one
    # thread it is the work done); on CUDA, wall time.
    clock = cpu if device.type == "cpu" else dt
    row = {"kind": cfg.attention.kind, "context": context, "batch": batch, "steps": steps,
           "tokens_per_s": batch * steps / clock, "clock": "process CPU" if device.type == "cpu" else "wall",
           "wall_ms_per_step": 1000 * dt / steps, "cpu_ms_per_step": 1000 * cpu / steps,
           "cache_bytes": cache_bytes, "step_peak_bytes": None, "decode_path": runner.path,
           "replays": runner.replays, "step_ops": step_ops(cfg, dtype, device), "stagger": stagger,
           "kernels_per_step": per_step}
    if device.type == "cuda":
        row["step_peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
    del model, state
    return row


def measured_table(rows: list[dict[str, Any]], ratios: dict[int, float]) -> str:
    by = {(r["kind"], r["context"]): r for r in rows}
    out = ["| context | dense tok/s | NSA tok/s | speedup | loaded-token ratio | speedup / ratio | "
           "dense cache MiB | NSA cache MiB | dense step peak MiB | NSA step peak MiB |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    mib = (lambda v: "-" if v is None else f"{v / 2**20:,.1f}")
    for s in sorted({r["context"] for r in rows}):
        d, n = by.get(("dense", s)), by.get(("nsa", s))
        if d is None or n is None:
            continue
        sp = n["tokens_per_s"] / d["tokens_per_s"]
        out.append(f"| {s:,} | {d['tokens_per_s']:.2f} | {n['tokens_per_s']:.2f} | {sp:.2f}x | "
                   f"{ratios[s]:.2f}x | {sp / ratios[s]:.2f} | {mib(d['cache_bytes'])} | "
                   f"{mib(n['cache_bytes'])} | "
                   f"{mib(d['step_peak_bytes'])} | {mib(n['step_peak_bytes'])} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--analytic", action="store_true", help="print the loaded-token table alone")
    ap.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    ap.add_argument("--steps", type=int, default=32,
                    help="timed steps; a multiple of d (16) holds the steps that compress in their share")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                    help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--threads", type=int, default=None, help="torch threads on CPU")
    ap.add_argument("--eager", action="store_true", help="no CUDA graph: every step eagerly")
    ap.add_argument("--stagger", action="store_true",
                    help="sequence b at context - (b %% d): with a batch of d or more, some sequence "
                         "completes a compression block at every step, as prompts of their own lengths do")
    ap.add_argument("--kernels", action="store_true",
                    help="first profile one eager step of each kind: its kernels (CUDA; operators on CPU), "
                         "their device time, the ten costliest")
    ap.add_argument("--json", type=Path, default=None, help="also write every row here")
    args = ap.parse_args(argv)

    nsa_cfg = load_config(ROOT / "configs" / "nsa-125m.yaml").model
    dense_cfg = load_config(ROOT / "configs" / "dense-125m.yaml").model
    rows = analytic_rows(args.contexts, {"paper": PAPER, "nsa-125m": nsa_cfg.attention})
    print("KV tokens loaded per decoded token (per layer and KV group)\n")
    print(analytic_table(rows))
    result: dict[str, Any] = {"analytic": rows}
    if not args.analytic:
        device = torch.device(args.device)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype or
                                                               ("bf16" if device.type == "cuda" else "fp32")]
        if args.threads:
            torch.set_num_threads(args.threads)
        measured = []
        for s in args.contexts:
            for cfg in (dense_cfg, nsa_cfg):
                measured.append(measure(cfg, s, args.steps, args.batch, dtype, device,
                                        graph=False if args.eager else None,
                                        stagger=nsa_cfg.attention.compress_stride if args.stagger else 0,
                                        kernels=args.kernels))
                row = measured[-1]
                counted = row["kernels_per_step"]
                what = "CUDA kernels" if device.type == "cuda" else "operators"
                per = "" if counted is None else f", {what} per eager step: " + ", ".join(
                    f"{k} {v} ({counted[k + '_us']:,.0f} us)" for k, v in counted.items()
                    if not k.endswith(("_top", "_us")))
                print(f"  measured {cfg.attention.kind} at {s}: {row['tokens_per_s']:.2f} tok/s "
                      f"({row['decode_path']}, {row['step_ops']}{per})", file=sys.stderr, flush=True)
        ratios = {r["context"]: r["ratio_exact"] for r in rows if r["config"] == "nsa-125m"}
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
            f"CPU, {torch.get_num_threads()} threads, tokens per second of process CPU time"
        paths = sorted({r["decode_path"] for r in measured})
        spread = f", lengths context - (b % {nsa_cfg.attention.compress_stride})" if args.stagger else ""
        print(f"\nMeasured decode, nsa-125m vs dense-125m, batch {args.batch}{spread}, {dtype}, {where}, "
              f"decode path {', '.join(paths)}\n")
        print(measured_table(measured, ratios))
        result["measured"] = measured
        result["device"] = where
        result["dtype"] = str(dtype)
        result["decode_path"] = paths[0] if len(paths) == 1 else paths
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
