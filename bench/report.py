"""Benchmark results: the JSON file and the Markdown table beside it (pure functions).

A row is a dict with the keys in ``COLUMNS`` (``ms``, ``tokens_per_s``,
``peak_mem_bytes`` may be None when the case did not run: ``status`` says why; ``max_err``
is None where nothing was checked). A kernel entry (the per-kernel breakdown of one case)
has the keys in ``KERNEL_COLUMNS``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("device", "torch", "triton", "op", "impl", "layout", "seq_len", "batch", "ms", "tokens_per_s",
           "peak_mem_bytes", "max_err", "status", "note")
KERNEL_COLUMNS = ("impl", "layout", "seq_len", "batch", "kernel", "calls", "device_ms", "share")
DENSE_IMPLS = ("dense_flash", "dense_cudnn", "dense_efficient", "dense_sdpa")
RATIO_OPS = ("attn_fwd", "attn_fwd_train", "attn_bwd", "fwd+bwd")
KERNELS_SHOWN = 12  # per case in the Markdown (the JSON has all)


def refuse_unreadable(ap: argparse.ArgumentParser, flag: str, path: Path) -> None:
    """Exit 2 naming ``flag`` and ``path`` where it is not a readable JSON file (a results
    file mistyped, or cut short by a copy), before any table is made."""
    if not path.is_file():
        ap.error(f"{flag} {path}: no such file")
    try:
        json.loads(path.read_text())
    except (OSError, ValueError) as e:
        ap.error(f"{flag} {path}: not a readable JSON file ({e})")


def results_stem(device: str, date: str) -> str:
    """``<device>-<date>`` with the device name made file-name safe (lower case, dashes)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown-device"
    return f"{slug}-{date}"


def _fmt(v: Any, key: str) -> str:
    if v is None:
        return "-"
    if key == "ms":
        return f"{v:.3f}"
    if key == "tokens_per_s":
        return f"{v:,.0f}"
    if key == "peak_mem_bytes":
        return f"{v / 2**30:.2f} GiB"
    if key == "max_err":
        return f"{v:.1e}"
    return str(v)


def ok_index(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """The rows that ran (``status`` ok) by (op, impl, layout, sequence length)."""
    ok = (r for r in rows if r.get("status") == "ok")
    return {(r["op"], r["impl"], r.get("layout") or "", r["seq_len"]): r for r in ok}


def fwd_bwd(index: dict, impl: str, layout: str, seq: int) -> dict[str, float]:
    """ms per op of one attention case; ``fwd+bwd`` = training forward (or the inference
    forward when the training one is missing) + backward."""
    got = {op: index[(op, impl, layout, seq)]["ms"] for op in ("attn_fwd", "attn_fwd_train", "attn_bwd")
           if (op, impl, layout, seq) in index and index[(op, impl, layout, seq)]["ms"]}
    fwd = got.get("attn_fwd_train", got.get("attn_fwd"))
    if fwd and "attn_bwd" in got:
        got["fwd+bwd"] = fwd + got["attn_bwd"]
    return got


def fastest_dense(index: dict, layout: str, seq: int) -> tuple[str, float] | None:
    """The dense SDPA backend with the shortest fwd+bwd in the same run, and that time."""
    times = {d: fwd_bwd(index, d, layout, seq).get("fwd+bwd") for d in DENSE_IMPLS}
    ran = {d: t for d, t in times.items() if t}
    if not ran:
        return None
    best = min(ran, key=lambda d: ran[d])
    return best, ran[best]


def _speedups(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Derived lines: dense / nsa_triton time ratios per dense impl (and against the fastest
    dense fwd+bwd), and nsa/dense train tokens/s."""
    ok = [r for r in rows if r.get("status") == "ok"]
    index = ok_index(rows)
    lines = []
    keys = sorted({(r.get("layout") or "", r["seq_len"]) for r in ok if r["op"].startswith("attn")})
    for layout, seq in keys:
        nsa = fwd_bwd(index, "nsa_triton", layout, seq)
        if not nsa:
            continue
        for dense in DENSE_IMPLS:
            times = fwd_bwd(index, dense, layout, seq)
            parts = [f"{op} {times[op] / nsa[op]:.2f}x" for op in RATIO_OPS if op in times and op in nsa]
            if parts:
                lines.append(f"| {layout} | {seq} | {dense} | " + ", ".join(parts) + " |")
        best = fastest_dense(index, layout, seq)
        if best and "fwd+bwd" in nsa:
            ratio = best[1] / nsa["fwd+bwd"]
            lines.append(f"| {layout} | {seq} | fastest dense ({best[0]}) | fwd+bwd {ratio:.2f}x |")
    for seq in sorted({r["seq_len"] for r in ok if r["op"] == "train_step"}):
        for suffix, how in (("", ""), ("_graph", " (both from CUDA graphs)")):
            n = index.get(("train_step", "nsa_triton" + suffix, "nsa-125m", seq))
            d = index.get(("train_step", "dense_sdpa" + suffix, "dense-125m", seq))
            if n and d and n["tokens_per_s"] and d["tokens_per_s"]:
                ratio = n["tokens_per_s"] / d["tokens_per_s"]
                lines.append(f"| train_step | {seq} | dense-125m | nsa/dense tokens/s {ratio:.2f}x{how} |")
        for impl, layout in (("nsa_triton", "nsa-125m"), ("dense_sdpa", "dense-125m")):
            e = index.get(("train_step", impl, layout, seq))
            g = index.get(("train_step", impl + "_graph", layout, seq))
            if e and g and e["ms"] and g["ms"]:
                lines.append(f"| train_step | {seq} | {layout} eager | CUDA graph {e['ms'] / g['ms']:.2f}x |")
    return lines


def _kernel_tables(kernels: Sequence[dict[str, Any]]) -> list[str]:
    """One table per profiled case: its most expensive kernels, the rest summed."""
    out: list[str] = []
    cases: dict[tuple, list[dict[str, Any]]] = {}
    for k in kernels:
        cases.setdefault((k["impl"], k["layout"], k["seq_len"], k["batch"]), []).append(k)
    for (impl, layout, seq, batch), ks in cases.items():
        total = sum(k["device_ms"] or 0.0 for k in ks)
        head = f"### {impl}, {layout}, seq {seq}, batch {batch}: one fwd+bwd, {total:.3f} ms on the device"
        out += ["", head,
                "", "| kernel | calls | device ms | share |", "|---|---|---|---|"]
        shown = sorted(ks, key=lambda k: -(k["device_ms"] or 0.0))
        rest = shown[KERNELS_SHOWN:]
        if rest:
            shown = shown[:KERNELS_SHOWN] + [dict(kernel=f"({len(rest)} other kernels)",
                                                  calls=sum(k["calls"] for k in rest),
                                                  device_ms=sum(k["device_ms"] or 0.0 for k in rest),
                                                  share=sum(k["share"] or 0.0 for k in rest))]
        for k in shown:
            name = k["kernel"] if len(k["kernel"]) <= 90 else k["kernel"][:87] + "..."
            ms = "-" if k["device_ms"] is None else f"{k['device_ms']:.3f}"
            share = "-" if k["share"] is None else f"{100 * k['share']:.1f}%"
            out.append(f"| `{name.replace('|', '/')}` | {k['calls']} | {ms} | {share} |")
    return out


def format_markdown(rows: Sequence[dict[str, Any]], title: str = "NSA benchmark",
                    kernels: Sequence[dict[str, Any]] = ()) -> str:
    """A Markdown table of every row, the dense-vs-NSA ratios derived from it, then the
    per-kernel breakdowns."""
    head = [c for c in COLUMNS if c not in ("device", "torch", "triton")]
    out = [f"# {title}", ""]
    if rows:
        r0 = rows[0]
        out += [f"device: {r0.get('device')}, torch {r0.get('torch')}, triton {r0.get('triton')}", ""]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(c), c) for c in head) + " |")
    ratios = _speedups(rows)
    if ratios:
        out += ["", "Speed-up of nsa_triton over each dense impl (dense ms / nsa ms; > 1 means NSA is",
                "faster; fwd+bwd = training forward + backward), derived from the medians above:", "",
                "| layout / op | seq_len | against | ratio |", "|---|---|---|---|"]
        out += ratios
    if kernels:
        out += ["", "## Per-kernel device time (torch.profiler)"]
        out += _kernel_tables(kernels)
    return "\n".join(out) + "\n"


def write_results(rows: Sequence[dict[str, Any]], out_dir: Path, device: str, date: str,
                  meta: dict[str, Any] | None = None,
                  kernels: Sequence[dict[str, Any]] = ()) -> tuple[Path, Path]:
    """Write ``<out_dir>/<device>-<date>.json`` (meta, rows, kernels) and the ``.md`` beside it."""
    for r in rows:
        missing = [c for c in COLUMNS if c not in r]
        if missing:
            raise ValueError(f"benchmark row lacks {missing}: {r}")
    for k in kernels:
        missing = [c for c in KERNEL_COLUMNS if c not in k]
        if missing:
            raise ValueError(f"kernel entry lacks {missing}: {k}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = results_stem(device, date)
    jpath = out_dir / f"{stem}.json"
    mpath = out_dir / f"{stem}.md"
    data = {"meta": meta or {}, "rows": list(rows), "kernels": list(kernels)}
    jpath.write_text(json.dumps(data, indent=1) + "\n")
    mpath.write_text(format_markdown(rows, title=f"NSA benchmark: {device}, {date}", kernels=kernels))
    return jpath, mpath
