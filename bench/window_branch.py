"""The sliding-window branch alone: the band kernel against FlexAttention (what a training
step on a GPU runs, nsa/ops/flex.py), forward and forward + backward, on one CUDA GPU.

    python -m bench.window_branch [--layouts nsa-125m paper] [--seqs 2048 16384 65536]
                                  [--tokens 65536] [--window 512] [--json OUT]

For each layout (query heads, KV groups, head dim as bench.run's) and sequence length, batch
``tokens // seq``, bf16: milliseconds (median of CUDA-event timings) of
``nsa.ops.triton.window_attention`` (the band kernel) and ``nsa.ops.flex.window_attention``
(compiled; its compile happens in the warm-up, reported apart), forward without gradient
and forward + backward, and how far FlexAttention's output and gradients are from the band
kernel's (relative, Frobenius). The causal SDPA of the whole sequence (torch's pick of
backend) is timed beside them for scale. A GPU is required: on CPU FlexAttention has no
backward and the kernels run interpreted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import LAYOUTS, time_cuda  # noqa: E402

WARMUP, ITERS = 3, 10


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _inputs(B: int, T: int, H: int, G: int, D: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(T)
    return [torch.randn(B, T, n, D, device="cuda", generator=gen, dtype=torch.bfloat16) for n in (H, G, G)]


def _fwd_bwd(fn: Callable[..., torch.Tensor], xs: list[torch.Tensor], do: torch.Tensor
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [x.detach().requires_grad_() for x in xs]
    out = fn(*leaves)
    out.backward(do)
    return out.detach(), [x.grad for x in leaves]


def case(layout: str, T: int, tokens: int, window: int) -> dict[str, Any]:
    """One layout and length: every implementation's times, and FlexAttention's distance
    from the band kernel."""
    from nsa.ops import flex
    from nsa.ops.triton import window_attention as band

    H, G, D = LAYOUTS[layout]
    B = max(1, tokens // T)
    xs = _inputs(B, T, H, G, D)
    do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)

    def full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True, enable_gqa=H != G).transpose(1, 2)

    impls: dict[str, Callable[..., torch.Tensor]] = {
        "band": lambda q, k, v: band(q, k, v, window),
        "flex": lambda q, k, v: flex.window_attention(q, k, v, window),
        "sdpa_causal_full": full,
    }
    row: dict[str, Any] = {"layout": layout, "T": T, "B": B, "H": H, "G": G, "D": D, "window": window}
    t0 = time.perf_counter()
    flex_out, flex_grads = _fwd_bwd(impls["flex"], xs, do)  # compiles forward and backward
    torch.cuda.synchronize()
    row["flex_first_call_s"] = round(time.perf_counter() - t0, 2)
    band_out, band_grads = _fwd_bwd(impls["band"], xs, do)
    row["flex_vs_band"] = {"out": _rel(flex_out, band_out),
                           **{f"d{i}": _rel(a, b) for i, (a, b) in enumerate(zip(flex_grads, band_grads))}}
    for name, fn in impls.items():
        with torch.no_grad():
            fwd, _ = time_cuda(lambda _s, fn=fn: fn(*xs), None, WARMUP, ITERS)
        both, _ = time_cuda(lambda _s, fn=fn: _fwd_bwd(fn, xs, do), None, WARMUP, ITERS)
        row[name] = {"fwd_ms": round(fwd, 3), "fwd_bwd_ms": round(both, 3)}
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| layout | T x B | band fwd / fwd+bwd ms | flex fwd / fwd+bwd ms | flex speed-up fwd+bwd | "
             "causal SDPA fwd+bwd ms | flex vs band (max rel) | flex first call s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, f, s = r["band"], r["flex"], r["sdpa_causal_full"]
        worst = max(r["flex_vs_band"].values())
        lines.append(f"| {r['layout']} | {r['T']} x {r['B']} | {b['fwd_ms']} / {b['fwd_bwd_ms']} | "
                     f"{f['fwd_ms']} / {f['fwd_bwd_ms']} | {b['fwd_bwd_ms'] / f['fwd_bwd_ms']:.2f}x | "
                     f"{s['fwd_bwd_ms']} | {worst:.1e} | {r['flex_first_call_s']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.window_branch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--seqs", nargs="+", type=int, default=[2048, 16384, 65536])
    ap.add_argument("--tokens", type=int, default=65536, help="batch = max(1, tokens // seq)")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.window_branch needs a CUDA GPU: FlexAttention has no backward on CPU and the band "
              "kernel would run in Triton's interpreter", file=sys.stderr)
        return 2
    rows = []
    for layout in args.layouts:
        for T in args.seqs:
            rows.append(case(layout, T, args.tokens, args.window))
            print(json.dumps(rows[-1]), flush=True)
            if args.json:
                args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                 "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
