"""What one decode step must read, and how far a measured step is from it, without a GPU.

    python -m bench.decode_roofline [--contexts 8192 65536] [--batch 1 64] [--devices H100 H200]
                                    [--measured bench/results/<device>-<date>-decode-b1.json ...]
                                    [--json OUT]

A decoded token of a small model does little arithmetic: every weight is read once per
step (for the whole batch) and each sequence's attention reads its cache. So the step's
lower bound is its bytes over the GPU's HBM bandwidth, per launch of one plain step (the 15
in 16 steps that complete no compressed block; a compressing step also reads the
compression MLPs' weights and runs their kernels), for nsa-125m against dense-125m in bf16:

- ``weights``: every parameter the step multiplies by (the projections, the MLPs, the
  tied embedding as the output head; NSA's compression MLPs only on compressing steps), once
  per step whatever the batch: the GEMMs, cuBLAS's kernels;
- NSA (``nsa/ops/triton/decode.py``), per layer and sequence: ``_decode_partials`` the
  visible compressed tokens' K and V and the window's; ``_decode_scores`` the compressed
  keys again (each token's probability needs every split's log-sum-exp first); and
  ``_decode_selected`` the chosen blocks' K and V (``bench.decode.loaded_tokens`` counts the
  tokens); where a measured step ran them as one launch per layer (``_decode_fused``, a
  small batch), one row with their sum;
- dense (``decode_dense.py``): ``_dense_partials`` every cached token's K and V.

What each kernel writes (a token's K/V, partials of a few KiB) and the activations are
left out: small against these at any batch. The bound is what the kernels must move, not
what they can reach: at batch 1 a step reads ~0.2 GB and the bound is ~50 us, while a
replayed graph of ~100 launches pays several microseconds per launch, so there the launch
count is the cost (``wall us / kernel`` shows it). Given ``bench.decode --kernels`` results
(``--measured``), each launch's measured device time per step stands beside its bound
(kernels outside the ten that took the most of a step are not listed there: ``-``), and
``other kernels`` is the rest of the step's device time (merges, cache writes, norms). The
kernels are one plain step's; the ``wall`` time is the replayed steps' mean, NSA's compressing
steps (1 in 16, a few hundred microseconds more at 64k) included.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.decode import loaded_tokens  # noqa: E402
from bench.report import refuse_unreadable  # noqa: E402
from bench.roofline import DEVICES  # noqa: E402
from nsa.config import ModelConfig, load_config  # noqa: E402
from nsa.model import build_model  # noqa: E402
from nsa.ops.reference import num_compressed  # noqa: E402

BYTES = 2  # bf16 weights and caches
CONFIGS = {"nsa": "nsa-125m", "dense": "dense-125m"}
# kernels that are cuBLAS GEMMs (and their split-K reductions) in a profile's names
GEMM_MARKS = ("gemm", "nvjet", "cublas", "cutlass", "xmma", "splitkreduce")


def weight_bytes(cfg: ModelConfig, compressing: bool = False) -> int:
    """Bytes of the parameters one decode step reads (tied ones once); the compression
    MLPs only on a compressing step."""
    with torch.device("meta"):
        model = build_model(cfg)
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if id(p) in seen or (".compress_" in name and not compressing):
            continue
        seen.add(id(p))
        total += p.numel() * BYTES
    return total


# NSA's decode attention as one launch per layer: the three launches' bytes in one row
FUSED = "_decode_fused"


def attention_bytes(cfg: ModelConfig, context: int, batch: int) -> dict[str, int]:
    """Bytes each attention launch reads per step (all layers), by kernel name."""
    a, kv = cfg.attention, cfg.n_kv_heads * cfg.head_dim * BYTES  # one token's K (or V), all groups
    per = cfg.n_layers * batch * kv
    if a.kind != "nsa":
        return {"_dense_partials": per * 2 * context}
    n_cmp = num_compressed(context, a.compress_block, a.compress_stride)
    t = loaded_tokens(context, a)
    selected = int(t["nsa_exact"]) - n_cmp - min(a.window, context)
    return {"_decode_partials": per * 2 * (n_cmp + min(a.window, context)),
            "_decode_scores": per * n_cmp,
            "_decode_selected": per * 2 * selected}


@functools.cache
def _model(kind: str) -> tuple[ModelConfig, int]:
    """A kind's model config and its plain step's weight bytes (built once per kind)."""
    cfg = load_config(ROOT / "configs" / f"{CONFIGS[kind]}.yaml").model
    return cfg, weight_bytes(cfg)


def step_bounds(kind: str, context: int, batch: int) -> dict[str, int]:
    """``{launch: bytes}`` of one plain step: the weights (GEMMs) and the attention launches."""
    cfg, weights = _model(kind)
    return {"GEMMs (weights)": weights, **attention_bytes(cfg, context, batch)}


def measured_rows(paths: list[Path]) -> dict[tuple[str, int, int], dict[str, Any]]:
    """``bench.decode`` rows by (kind, context, batch), the last file's winning."""
    rows: dict[tuple[str, int, int], dict[str, Any]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for r in data.get("measured", []):
            rows[(r["kind"], r["context"], r["batch"])] = {**r, "device": data.get("device", "?")}
    return rows


def measured_launches(row: dict[str, Any]) -> tuple[dict[str, float], int | None, float | None]:
    """A measured row's device us per plain step by launch (GEMMs summed; only the listed
    ten), its kernel count and summed device us."""
    k = row.get("kernels_per_step") or {}
    kind = "plain" if "plain" in k else "step"
    out: dict[str, float] = {}
    for e in k.get(kind + "_top", []):
        name = "GEMMs (weights)" if any(m in e["kernel"].lower() for m in GEMM_MARKS) else e["kernel"]
        out[name] = out.get(name, 0.0) + e["us"]
    return out, k.get(kind), k.get(kind + "_us")


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def case_table(context: int, batch: int, devices: list[str], measured: dict) -> tuple[str, dict[str, Any]]:
    """One (context, batch): each launch's bytes and bound per device, beside what was measured."""
    dev = devices[-1]
    lines = [f"## context {context:,}, batch {batch}", "",
             "| model | launch | MB per step | " + " | ".join(f"{d} bound us" for d in devices)
             + " | measured us | measured / bound |", "|---|---|---|" + "---|" * len(devices) + "---|---|"]
    summary: dict[str, Any] = {"context": context, "batch": batch}
    for kind in ("dense", "nsa"):
        bounds = step_bounds(kind, context, batch)
        row = measured.get((kind, context, batch))
        got, n_kernels, busy = measured_launches(row) if row else ({}, None, None)
        if FUSED in got:  # the three launches' reads in one (nsa/ops/triton/decode_fused.py)
            three = [name for name in bounds if name.startswith("_decode_")]
            fused = sum(bounds[k] for k in three)
            bounds = {**{k: v for k, v in bounds.items() if k not in three}, FUSED: fused}
        for name, nbytes in bounds.items():
            b = {d: 1e6 * nbytes / DEVICES[d].bandwidth for d in devices}
            m = got.get(name)
            lines.append(f"| {CONFIGS[kind]} | `{name}` | {nbytes / 1e6:,.1f} | "
                         + " | ".join(_us(b[d]) for d in devices)
                         + f" | {_us(m)} | {'-' if m is None else f'{m / b[dev]:.1f}x'} |")
        if busy is not None:  # what the modelled launches leave of the step's device time
            rest = busy - sum(got.get(name, 0.0) for name in bounds)
            lines.append(f"| {CONFIGS[kind]} | other kernels (writes, norms, merges, activations) | - | "
                         + " | ".join("-" for _ in devices) + f" | {_us(rest)} | - |")
        total = sum(bounds.values())
        b_total = {d: 1e6 * total / DEVICES[d].bandwidth for d in devices}
        wall = None if row is None else 1e3 * row["wall_ms_per_step"]
        lines.append(f"| {CONFIGS[kind]} | **step** ({'-' if n_kernels is None else n_kernels} kernels, "
                     f"{_us(busy)} us busy) | {total / 1e6:,.1f} | "
                     + " | ".join(f"**{_us(b_total[d])}**" for d in devices)
                     + f" | {_us(wall)} wall | {'-' if wall is None else f'{wall / b_total[dev]:.1f}x'} |")
        summary[kind] = {"bytes": total, "bound_us": b_total, "wall_us": wall, "kernels": n_kernels,
                         "wall_us_per_kernel": None if wall is None or not n_kernels else wall / n_kernels,
                         "launches": {k: {"bytes": v, "measured_us": got.get(k)} for k, v in bounds.items()}}
    d_b, n_b = summary["dense"]["bound_us"][dev], summary["nsa"]["bound_us"][dev]
    note = f"- At the {dev} bound, NSA's step is {d_b / n_b:.2f}x dense's"
    d_w, n_w = summary["dense"]["wall_us"], summary["nsa"]["wall_us"]
    if d_w and n_w:
        per = summary["nsa"]["wall_us_per_kernel"], summary["dense"]["wall_us_per_kernel"]
        note += (f"; measured ({measured[('nsa', context, batch)]['device']}) {d_w / n_w:.2f}x, "
                 f"wall us / kernel: NSA {_us(per[0])}, dense {_us(per[1])}")
    summary["bound_ratio"] = d_b / n_b
    return "\n".join(lines + ["", note + "."]), summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.decode_roofline", description=__doc__.split("\n\n")[2])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 65536])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--devices", nargs="+", default=list(DEVICES), choices=list(DEVICES))
    ap.add_argument("--measured", type=Path, nargs="*", default=[],
                    help="bench.decode JSON results (with --kernels) to show beside the bounds")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if min(args.contexts) < 1 or min(args.batch) < 1:
        ap.error("contexts and batches must be >= 1")
    for path in args.measured:
        refuse_unreadable(ap, "--measured", path)
    measured = measured_rows(args.measured)
    print("# Decode step bounds (bytes / HBM bandwidth), nsa-125m vs dense-125m, bf16, plain step\n")
    cases = []
    for batch in args.batch:
        for context in args.contexts:
            text, summary = case_table(context, batch, args.devices, measured)
            cases.append(summary)
            print(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
