"""One NSA layer's decode branches: the fused kernels (nsa/ops/triton/decode.py) against the
KV-cache decoder's torch maths, per decoded token.

    python -m bench.decode_kernel [--contexts 4096 16384 65536] [--batch 1] [--device cpu|cuda]
                                  [--dtype fp32|bf16] [--threads 1] [--iters 20]
                                  [--plan-sms 132] [--sweep] [--waves] [--json OUT]

nsa-125m's attention layer (16 query heads in one KV group, head dim 64, l=32, d=16,
l'=64, n=16, w=512), an ``NSACache`` with room for the context, filled with random K/V,
every sequence at the context's last position. For each context:

- torch: ``NSACache._branches`` (the step's three branches over the cache, without the
  projections and the cache writes), its aten ops per call, and its time per call
  (process CPU time on CPU, one thread unless ``--threads``; wall time on CUDA);
- kernels: the launches and grids ``plan_splits`` gives on this device (or, ``--plan-sms``,
  on a GPU of that many SMs), the wrapper's aten
  ops (allocations), the K/V bytes the launches must read at least (compressed K and V,
  compressed K again for the scores, the selected blocks' and the window's K and V), and
  on CUDA the time per call, eager and replayed from a CUDA graph, with the planned splits
  and with none (and, where the plan runs every phase in one launch, the same splits in
  their own launches: ``kernels_launches_*``).

``--sweep`` (CUDA): the splits ``plan_splits`` chooses are design estimates (its ``MIN_*``
keys per program and ``PROGRAMS_PER_SM``). Each phase's split is also tried at a quarter,
half, twice and four times the planned one (within what the shapes allow), the others as
planned, and the scores launch's merges of the partials the other way (one program per head,
or one per branch for all heads: ``plan_splits`` goes per branch once per-head merges would
outnumber the programs the SMs are planned to hold; where the plan is one launch, its splits
in their own launches), each replayed from a CUDA graph; the rows
say which plan was fastest per context, which is what to set the constants from. On CPU it
lists the plans without timing them.

``--waves`` (no GPU needed; the compiled kernels, not under ``TRITON_INTERPRET=1``): each
launch of the planned call (bf16, on a GPU of ``--plan-sms`` SMs, 132 by default) compiled
for sm_90 by the compile gate's machinery, with its registers, shared memory and warps, the
programs an SM holds at once (``bench.roofline.resident``) and the waves its grid takes.
Every decode grid is (sequence and KV group) x (the program's part), handed out in that
linear order: the rows say how many parts of every sequence the first wave starts. Where
a launch's parts differ in length (the scores launch: its scoring programs, then the
merges of two branches' partials, per head or per branch), the long ones come first and should
all be there.

The kernels are not timed on CPU: there they run in Triton's interpreter.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nsa.config import load_config  # noqa: E402
from nsa.infer.cache import NSACache  # noqa: E402
from nsa.model import build_model  # noqa: E402
from nsa.ops.reference import num_compressed  # noqa: E402
from nsa.syncs import OpCounter  # noqa: E402


def setup(context: int, batch: int, dtype: torch.dtype, device: torch.device
          ) -> tuple[NSACache, torch.Tensor, torch.Tensor]:
    """nsa-125m's first attention layer with a random cache at ``context`` tokens, a random
    query, the positions (each sequence's last)."""
    cfg = load_config(ROOT / "configs" / "nsa-125m.yaml").model
    cfg.n_layers = 1
    torch.manual_seed(0)
    attn = build_model(cfg).to(device=device, dtype=dtype).blocks[0].attn
    cache = NSACache(attn, batch, context)
    cache.allocate(dtype, device)
    gen = torch.Generator(device=device).manual_seed(0)
    for t in cache.cache_tensors():
        t.copy_(torch.randn(t.shape, generator=gen, device=device, dtype=torch.float32).to(dtype))
    q = torch.randn(batch, 1, attn.n_heads, attn.head_dim, generator=gen, device=device).to(dtype)
    pos = torch.full((batch,), context - 1, dtype=torch.long, device=device)
    return cache, q, pos


def kernel_call(cache: NSACache, q: torch.Tensor, pos: torch.Tensor, splits: Any = None) -> Any:
    from nsa.ops.triton.decode import nsa_decode_branches

    c, t = cache.attn.cfg, cache.tensors  # the cache's merge counters, as its step passes them
    return lambda: nsa_decode_branches(q, t["k_cmp"], t["v_cmp"], t["k_slc"], t["v_slc"], t["k_win"],
                                       t["v_win"], pos, c.compress_block, c.compress_stride, c.select_block,
                                       c.num_selected, c.num_initial, c.num_local, splits=splits,
                                       tickets=cache.tickets)


def timed(fn: Any, iters: int, device: torch.device) -> float:
    """Seconds per call: wall time on CUDA (synchronised), process CPU time on CPU."""
    for _ in range(2):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / iters
    c0 = time.process_time()
    for _ in range(iters):
        fn()
    return (time.process_time() - c0) / iters


def graph_timed(fn: Any, iters: int) -> float:
    """Seconds per replay of ``fn`` captured as a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(graph.replay, iters, torch.device("cuda"))


def launch_plan(cache: NSACache, q: torch.Tensor, pos: torch.Tensor, sms: int | None = None
                ) -> tuple[list[str], int]:
    """The kernel launches (name and grid) of one call on this device (on a GPU of ``sms``
    SMs when given), and the wrapper's aten ops, without running a kernel."""
    from nsa.ops.triton import decode as DK

    log: list[str] = []

    class Rec:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: tuple[int, ...]) -> Any:
            return lambda *a, **k: log.append(f"{self.name}{list(grid)}")

    names = ("_decode_partials", "_decode_scores", "_decode_selected", "_decode_combine", "_decode_fused",
             "_sm_count")
    saved = {n: getattr(DK, n) for n in names}
    try:
        for n in names[:-1]:
            setattr(DK, n, Rec(n))
        if sms is not None:
            DK._sm_count = lambda device: sms
        with OpCounter() as ops:
            kernel_call(cache, q, pos)()
    finally:
        for n, k in saved.items():
            setattr(DK, n, k)
    return log, ops.total


def launch_waves(cache: NSACache, q: torch.Tensor, pos: torch.Tensor, sms: int = 132) -> list[dict[str, Any]]:
    """Each launch of one call on a GPU of ``sms`` SMs, compiled for sm_90 (Triton's compiler,
    no GPU; a minute or so per launch where Triton's cache lacks it): grid, registers, shared
    bytes, warps, programs an SM holds at once, waves, and how many of every sequence's parts
    (axis 1) start in the first wave."""
    from bench.compile_check import compile_launch
    from bench.compile_launches import capture
    from bench.roofline import resident
    from nsa.ops.triton import decode as DK

    grids, _ = launch_plan(cache, q, pos, sms)
    saved = DK._sm_count
    try:
        DK._sm_count = lambda device: sms
        with capture() as launches:
            kernel_call(cache, q, pos)()
    finally:
        DK._sm_count = saved
    names = [g.split("[")[0] for g in grids]
    if [la.name for la in launches] != names:
        raise RuntimeError(f"captured {[la.name for la in launches]}, planned {names}")
    rows = []
    for la, grid in zip(launches, grids):
        res = compile_launch(la, 90)
        if res.error or res.registers is None or res.shared is None or res.num_warps is None:
            raise RuntimeError(f"{la.name} did not compile for sm_90: {res.error}")
        groups, parts = (int(x) for x in grid[grid.index("[") + 1:-1].split(","))  # every decode grid is 2-D
        per_sm = resident(res.registers, res.shared, res.num_warps)
        slots = per_sm * sms
        rows.append({"launch": grid, "programs": groups * parts, "registers": res.registers,
                     "shared": res.shared, "warps": res.num_warps, "per_sm": per_sm,
                     "waves": groups * parts / slots if slots else None, "parts": parts,
                     "parts_in_first_wave": min(parts, slots // groups)})
    return rows


PHASES = ("cmp", "win", "scores", "selected")
FACTORS = (0.25, 0.5, 2, 4)


def sweep_plans(cache: NSACache, device: torch.device, sms: int | None = None) -> dict[str, Any]:
    """The splits to time: the planned ones (on a GPU of ``sms`` SMs when given), none, and each
    phase's at ``FACTORS`` times the planned, within 1 and what the shapes allow (the other
    phases as planned), duplicates dropped."""
    from nsa.ops.triton import decode as DK

    t, c = cache.tensors, cache.attn.cfg
    B, NC, G = t["k_cmp"].shape[:3]
    n_blocks = -(-t["k_slc"].shape[1] // c.select_block)
    units = {"cmp": NC, "win": t["k_win"].shape[1], "scores": min(n_blocks, DK.MAX_SCORE_SPLITS),
             "selected": c.num_selected}
    saved = DK._sm_count
    try:
        if sms is not None:
            DK._sm_count = lambda device: sms
        planned = DK.plan_splits(B, G, NC, units["win"], n_blocks, c.num_selected, device,
                                 heads_per_group=cache.attn.n_heads // G)
    finally:
        DK._sm_count = saved
    gpu_sms = sms if sms is not None else DK._sm_count(device)

    def fitted(plan: Any) -> Any:  # one launch only where its programs fit (plan_splits' rule)
        fits = plan.fits_one_launch(B * G, gpu_sms)
        return dataclasses.replace(plan, one_launch=planned.one_launch and fits)

    plans: dict[str, Any] = {"planned": planned, "no_split": DK.DecodeSplits()}
    if planned.one_launch:  # the same splits in their own launches, as at a larger batch
        plans["planned in launches"] = dataclasses.replace(planned, one_launch=False)
    for phase in PHASES:
        for factor in FACTORS:
            n = min(max(1, round(getattr(planned, phase) * factor)), max(1, units[phase]))
            plan = fitted(dataclasses.replace(planned, **{phase: n}))
            if plan not in plans.values():
                plans[f"{phase} x{factor:g}"] = plan
    # the partials' merges the other way (per head / per branch), where a branch's partials fit
    # one merge program (its MAX_FUSED_SLOTS)
    if max(planned.cmp, planned.win) <= DK.MAX_FUSED_SLOTS and not planned.one_launch:
        merges = "per branch" if planned.head_merges else "per head"
        plans[f"merges {merges}"] = dataclasses.replace(planned, head_merges=not planned.head_merges)
    return plans


def kv_bytes(context: int, batch: int, cache: NSACache, itemsize: int) -> int:
    """K/V bytes the kernels must read per call at least (see the module docstring)."""
    c, a = cache.attn.cfg, cache.attn
    row = a.n_kv_heads * a.head_dim * itemsize
    nc = num_compressed(context, c.compress_block, c.compress_stride)
    selected = min(c.num_selected * c.select_block, context)
    return batch * row * (3 * nc + 2 * selected + 2 * min(c.window, context))


def measure(context: int, batch: int, dtype: torch.dtype, device: torch.device, iters: int,
            plan_sms: int | None = None, sweep: bool = False) -> dict[str, Any]:
    cache, q, pos = setup(context, batch, dtype, device)
    branches = getattr(cache, "_branches", None)
    row: dict[str, Any] = {"context": context, "batch": batch, "dtype": str(dtype), "device": device.type}
    if branches is not None:
        with torch.no_grad(), OpCounter() as ops:
            branches(q, pos)
        row["torch_ops"] = ops.total
        with torch.no_grad():
            row["torch_us"] = 1e6 * timed(lambda: branches(q, pos), iters, device)
    launches, wrapper_ops = launch_plan(cache, q, pos, plan_sms)
    row.update(launches=launches, wrapper_ops=wrapper_ops,
               kv_mib=kv_bytes(context, batch, cache, q.element_size()) / 2**20)
    if device.type == "cuda":
        from nsa.ops.triton.decode import DecodeSplits

        plans: list[tuple[str, Any]] = [("planned", None), ("no_split", DecodeSplits())]
        planned = sweep_plans(cache, device)["planned"]
        if planned.one_launch:  # and the planned splits in their own launches
            plans.append(("launches", dataclasses.replace(planned, one_launch=False)))
        for name, splits in plans:
            fn = kernel_call(cache, q, pos, splits)
            row[f"kernels_{name}_us"] = 1e6 * timed(fn, iters, device)
            row[f"kernels_{name}_graph_us"] = 1e6 * graph_timed(fn, iters)
    if sweep:
        row["sweep"] = {}
        want = kernel_call(cache, q, pos)() if device.type == "cuda" else None
        for name, plan in sweep_plans(cache, device, plan_sms).items():
            got: dict[str, Any] = {"splits": dataclasses.asdict(plan), "graph_us": None}
            if want is not None:  # a fast plan is worth something only if it computes the same
                fn = kernel_call(cache, q, pos, plan)
                diffs = [(a.float() - b.float()).abs().max() for a, b in zip(fn(), want)]
                got["max_abs_diff"] = float(max(diffs))
                got["graph_us"] = 1e6 * graph_timed(fn, iters)
            row["sweep"][name] = got
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.decode_kernel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                    help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--plan-sms", type=int, default=None,
                    help="show the launches planned for a GPU of this many SMs (132: an H100)")
    ap.add_argument("--sweep", action="store_true",
                    help="also time each phase's split at 1/4, 1/2, 2 and 4 times the planned one (CUDA)")
    ap.add_argument("--waves", action="store_true",
                    help="compile each launch for sm_90 (no GPU): programs per SM and waves on a GPU of "
                         "--plan-sms SMs (default 132)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.waves and os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("--waves compiles the kernels: unset TRITON_INTERPRET")
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype or ("bf16" if device.type == "cuda"
                                                                          else "fp32")]
    rows = []
    if args.waves:  # the launches alone, as a GPU runs them (bf16); nothing timed
        sms = args.plan_sms or 132
        for s in args.contexts:
            got = launch_waves(*setup(s, args.batch, torch.bfloat16, device), sms=sms)
            rows.append({"context": s, "batch": args.batch, "sms": sms, "waves": got})
            print(f"context {s:,} batch {args.batch}, a GPU of {sms} SMs (sm_90):", flush=True)
            for w in got:
                print(f"  {w['launch']}: {w['programs']:,} programs; {w['registers']} registers, "
                      f"{w['shared']:,} B shared, {w['warps']} warps: {w['per_sm']} per SM, {w['waves']:.2f} "
                      f"waves; the first wave starts {w['parts_in_first_wave']} of every sequence's "
                      f"{w['parts']} parts", flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    for s in args.contexts:
        r = measure(s, args.batch, dtype, device, args.iters, args.plan_sms, args.sweep)
        rows.append(r)
        timing = "  ".join(f"{k} {v:,.1f}" for k, v in r.items() if k.endswith("_us"))
        print(f"context {s:,} batch {args.batch}: torch {r.get('torch_ops', '-')} aten ops; kernels "
              f"{len(r['launches'])} launches {' '.join(r['launches'])}, wrapper {r['wrapper_ops']} aten "
              f"ops, >= {r['kv_mib']:.2f} MiB K/V read; {timing}", flush=True)
        for name, got in r.get("sweep", {}).items():
            us = ("not timed (no CUDA)" if got["graph_us"] is None else f"{got['graph_us']:,.1f} us "
                  f"(graph), outputs within {got['max_abs_diff']:.1e} of the planned splits'")
            print(f"  splits {name:>14}: {got['splits']}  {us}", flush=True)
        timed_plans = {n: g["graph_us"] for n, g in r.get("sweep", {}).items() if g["graph_us"] is not None}
        if timed_plans:
            best = min(timed_plans, key=timed_plans.__getitem__)
            fastest, planned_us = timed_plans[best], timed_plans["planned"]
            print(f"  fastest: {best} ({fastest:,.1f} us; planned {planned_us:,.1f} us)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
