"""Benchmark results: the JSON file and the Markdown table beside it (pure functions).

A row is a dict with the keys in ``COLUMNS`` (``ms``, ``tokens_per_s``,
``peak_mem_bytes`` may be None when the case did not run: ``status`` says why).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("device", "torch", "triton", "op", "impl", "layout", "seq_len", "batch", "ms", "tokens_per_s",
           "peak_mem_bytes", "status", "note")


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
    return str(v)


def _speedups(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Derived lines: dense / nsa_triton time ratios for fwd, bwd, fwd+bwd and train tokens/s."""
    ok = [r for r in rows if r.get("status") == "ok"]
    index = {(r["op"], r["impl"], r.get("layout") or "", r["seq_len"]): r for r in ok}
    lines = []
    keys = sorted({(r.get("layout") or "", r["seq_len"]) for r in ok if r["op"].startswith("attn")})
    for layout, seq in keys:
        parts = []
        both = {}
        for op in ("attn_fwd", "attn_bwd"):
            n = index.get((op, "nsa_triton", layout, seq))
            d = index.get((op, "dense_sdpa", layout, seq))
            if n and d and n["ms"] and d["ms"]:
                parts.append(f"{op} {d['ms'] / n['ms']:.2f}x")
                both[op] = (n["ms"], d["ms"])
        if len(both) == 2:
            n_ms = sum(v[0] for v in both.values())
            d_ms = sum(v[1] for v in both.values())
            parts.append(f"fwd+bwd {d_ms / n_ms:.2f}x")
        if parts:
            lines.append(f"| {layout} | {seq} | " + ", ".join(parts) + " |")
    for seq in sorted({r["seq_len"] for r in ok if r["op"] == "train_step"}):
        n = index.get(("train_step", "nsa_triton", "nsa-125m", seq))
        d = index.get(("train_step", "dense_sdpa", "dense-125m", seq))
        if n and d and n["tokens_per_s"] and d["tokens_per_s"]:
            ratio = n["tokens_per_s"] / d["tokens_per_s"]
            lines.append(f"| train_step | {seq} | nsa/dense tokens/s {ratio:.2f}x |")
    return lines


def format_markdown(rows: Sequence[dict[str, Any]], title: str = "NSA benchmark") -> str:
    """A Markdown table of every row, then the dense-vs-NSA ratios derived from it."""
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
        out += ["", "Speed-up of nsa_triton over dense_sdpa (dense ms / nsa ms; > 1 means NSA is faster),",
                "derived from the medians above:", "", "| layout / op | seq_len | ratio |", "|---|---|---|"]
        out += ratios
    return "\n".join(out) + "\n"


def write_results(rows: Sequence[dict[str, Any]], out_dir: Path, device: str, date: str,
                  meta: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write ``<out_dir>/<device>-<date>.json`` (meta + rows) and the ``.md`` table beside it."""
    for r in rows:
        missing = [c for c in COLUMNS if c not in r]
        if missing:
            raise ValueError(f"benchmark row lacks {missing}: {r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = results_stem(device, date)
    jpath = out_dir / f"{stem}.json"
    mpath = out_dir / f"{stem}.md"
    jpath.write_text(json.dumps({"meta": meta or {}, "rows": list(rows)}, indent=1) + "\n")
    mpath.write_text(format_markdown(rows, title=f"NSA benchmark: {device}, {date}"))
    return jpath, mpath
