"""The selected dK/dV's inverted index and chunk map: the kernels (``nsa.ops.triton.invert``)
against the torch ops they replaced, on one CUDA GPU.

    python -m bench.inverted_index [--layouts nsa-125m paper] [--seqs 2048 16384 65536]
                                   [--tokens 65536] [--json OUT]

For each layout (KV groups as bench.run's) and sequence length, batch ``tokens // seq``: a
selection like the model's (the initial block and the two local ones forced, the rest of the
16 drawn among the blocks a query may see; -1 where it sees fewer), then milliseconds (median
of CUDA-event timings) of building the index and the chunk plan each way, what one
``torch.profiler`` pass counts as kernels for each, and whether they agree exactly (the
segments, the positions in them, and the chunk map). Without CUDA it runs the same code at
one small shape with the kernels interpreted (``TRITON_INTERPRET=1``), as a check of this
module only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.core import NSA  # noqa: E402
from bench.run import LAYOUTS, time_cuda  # noqa: E402

WARMUP, ITERS = 3, 20


def selection(B: int, T: int, G: int, device: str, seed: int = 0) -> torch.Tensor:
    """[B, T, G, n] blocks per query: forced initial and local blocks, the rest uniform among
    the visible ones (random scores, top-n), -1 where fewer are visible."""
    block, n = NSA["select_block"], NSA["num_selected"]
    ns = -(-T // block)
    gen = torch.Generator(device=device).manual_seed(seed)
    scores = torch.rand(B, T, G, ns, device=device, generator=gen)
    j = torch.arange(ns, device=device)
    own = torch.arange(T, device=device) // block
    visible = j[None, :] <= own[:, None]  # [T, ns]
    forced = (j[None, :] < NSA["num_initial"]) | (own[:, None] - j[None, :] < NSA["num_local"])
    scores = torch.where(forced[None, :, None], 2.0, scores)
    scores = torch.where(visible[None, :, None], scores, -1.0)
    top, idx = scores.topk(min(n, ns), dim=-1)
    idx = torch.where(top >= 0, idx, -1)
    if ns < n:
        idx = torch.cat([idx, idx.new_full((B, T, G, n - ns), -1)], dim=-1)
    return idx


def _kernels(fn: Any) -> int:
    """Kernels one call launches (on CUDA; 0 elsewhere)."""
    if not torch.cuda.is_available():
        return 0
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(None)
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")


def case(layout: str, T: int, tokens: int, device: str) -> dict[str, Any]:
    from nsa.ops.triton import invert, selected

    _, G, _ = LAYOUTS[layout]
    B = max(1, tokens // T)
    idx = selection(B, T, G, device)
    ns = -(-T // NSA["select_block"])
    N = idx.numel()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 0
    chunk = selected.dkdv_chunk(N, NSA["num_selected"], NSA["select_block"], sms)
    max_chunks = B * G * ns + -(-N // chunk)

    def kernels(_: Any) -> tuple[torch.Tensor, ...]:
        tlist, offsets = invert.inverted_index(idx, ns)
        return (tlist, offsets, *invert.chunk_map(offsets, chunk, max_chunks))

    def torch_ops(_: Any) -> tuple[torch.Tensor, ...]:
        tlist, offsets = invert.inverted_index_torch(idx, ns)
        return (tlist, offsets, *invert.chunk_map_torch(offsets, chunk, max_chunks))

    got, want = kernels(None), torch_ops(None)
    valid = int(want[1][-1])
    agree = (torch.equal(got[1], want[1]) and torch.equal(got[0][:valid], want[0][:valid])
             and torch.equal(got[2], want[2]) and torch.equal(got[3], want[3]))
    warmup, iters = (WARMUP, ITERS) if device == "cuda" else (0, 1)
    row: dict[str, Any] = dict(layout=layout, seq_len=T, batch=B, groups=G, selections=N, blocks=B * G * ns,
                               chunk=chunk, agree=agree)
    for name, fn in (("kernels", kernels), ("torch", torch_ops)):
        row[f"{name}_ms"] = time_cuda(fn, None, warmup, iters)[0]
        row[f"{name}_launches"] = _kernels(fn)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| layout | seq | batch | selections | kernels ms | torch ms | torch / kernels | launches "
             "(kernels, torch) | agree |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["torch_ms"] / r["kernels_ms"]
        lines.append(f"| {r['layout']} | {r['seq_len']} | {r['batch']} | {r['selections']:,} | "
                     f"{r['kernels_ms']:.3f} | {r['torch_ms']:.3f} | {ratio:.2f}x | "
                     f"{r['kernels_launches']}, {r['torch_launches']} | {r['agree']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.inverted_index", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--seqs", nargs="+", type=int, default=[2048, 16384, 65536])
    ap.add_argument("--tokens", type=int, default=65536, help="batch = max(1, tokens // seq)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    if torch.cuda.is_available():
        device, cases = "cuda", [(layout, T, args.tokens) for layout in args.layouts for T in args.seqs]
    elif os.environ.get("TRITON_INTERPRET") == "1":
        device, cases = "cpu", [(layout, 256, 512) for layout in args.layouts]
        print("bench.inverted_index: no CUDA: one small interpreted case per layout (a check, not a timing)")
    else:
        print("bench.inverted_index: needs a CUDA GPU (or TRITON_INTERPRET=1 for a small check)",
              file=sys.stderr)
        return 2
    rows = []
    for layout, T, tokens in cases:
        rows.append(case(layout, T, tokens, device))
        print(json.dumps(rows[-1]), flush=True)
    print(markdown(rows))
    if args.json:
        name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
        data = dict(device=name, torch=torch.__version__, rows=rows)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
