"""The speed targets of NSA's kernels and decoder, against what results files measured.

    python -m bench.targets bench/results/<device>-<date>*.json [DIR ...] [--json OUT]

Reads ``bench.run`` results (their ``rows``), ``bench.decode`` results (their ``measured``
rows) and ``bench.trainer_overhead --json`` files, any mix, files or folders of them (other
JSON files there are skipped and named), and prints one table: each target, what each file
measured for it and whether that meets it. A ratio is only taken within one file: one run,
on one device. A target that no file measures says so. It needs no GPU: it reads files, so a
GPU session can end with it (``scripts/gpu-measure.sh`` does) and the docs can quote it.

The targets (bf16, on an H100 or H200):

- attention fwd+bwd, NSA against the fastest dense SDPA backend of the same run, for
  nsa-125m's and the paper's head layouts: at least 4x at 64k, 1.5x at 16k, break-even at 8k,
  0.6x at 2k;
- the train step, nsa-125m's tokens/s against dense-125m's: at least 1.0x at 16k and 0.8x at
  2k (eager, and both from CUDA graphs, each a row); nsa-train's steady step within 5 % of
  that bare step at the same shapes, on a GPU;
- decoding, replayed from CUDA graphs: both models at least 1,000 tokens/s at batch 1 and 8k;
  NSA at least 0.9x dense there, 1.2x at batch 1 and 64k, and 5.8x at batch 64 and 64k (half
  the ratio of KV tokens each loads).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.report import fastest_dense, fwd_bwd, ok_index, refuse_unreadable


@dataclasses.dataclass(frozen=True)
class Target:
    """A measured value must be at least ``bound`` (at most, with ``at_most``)."""

    what: str
    condition: str
    bound: float
    unit: str = "x"
    at_most: bool = False

    def wanted(self) -> str:
        sign = "<=" if self.at_most else ">="
        value = f"{self.bound:,.0f} tokens/s" if self.unit == "tokens/s" else f"{self.bound:.2f}x"
        return f"{sign} {value}"

    def meets(self, value: float) -> bool:
        return value <= self.bound if self.at_most else value >= self.bound


@dataclasses.dataclass
class Finding:
    """What one file measured for one target. ``met`` is None where the file measured it
    under another condition than the target's (eagerly, on a CPU)."""

    target: Target
    value: float
    detail: str
    source: str
    met: bool | None


def _tokens(n: int) -> str:
    return f"{n:,} tokens"


def _where(source: str, device: str) -> str:
    return f"{source} ({device})" if device else source


ATTENTION = {(layout, seq): Target("attention fwd+bwd, NSA vs the fastest dense", f"{layout}, {_tokens(seq)}",
                                   least)
             for layout in ("nsa-125m", "paper")
             for seq, least in ((65536, 4.0), (16384, 1.5), (8192, 1.0), (2048, 0.6))}
TRAIN = {seq: Target("train step tokens/s, nsa-125m vs dense-125m", _tokens(seq), least)
         for seq, least in ((16384, 1.0), (2048, 0.8))}
DECODE_SPEED = {(kind, 1, 8192): Target(f"decode tokens/s, {kind}-125m", f"batch 1, {_tokens(8192)}", 1000.0,
                                        "tokens/s") for kind in ("dense", "nsa")}
DECODE_RATIO = {(batch, ctx): Target("decode tokens/s, nsa-125m vs dense-125m",
                                     f"batch {batch}, {_tokens(ctx)}", least)
                for batch, ctx, least in ((1, 8192, 0.9), (1, 65536, 1.2), (64, 65536, 5.8))}
TRAINER = Target("nsa-train's steady step vs bench.run's train_step", "same shapes, one rank", 1.05,
                 at_most=True)
TARGETS: list[Target] = [*ATTENTION.values(), *TRAIN.values(), TRAINER, *DECODE_SPEED.values(),
                         *DECODE_RATIO.values()]


def run_findings(data: dict[str, Any], source: str) -> list[Finding]:
    """A ``bench.run`` results file: the attention ratios and the train step's."""
    rows = data["rows"]
    index = ok_index(rows)
    where = _where(source, str(data.get("meta", {}).get("device") or rows[0].get("device") or ""))
    out = []
    for (layout, seq), target in ATTENTION.items():
        nsa = fwd_bwd(index, "nsa_triton", layout, seq).get("fwd+bwd")
        best = fastest_dense(index, layout, seq)
        if nsa and best:
            ratio = best[1] / nsa
            detail = f"vs {best[0]}: {best[1]:.2f} / {nsa:.2f} ms"
            out.append(Finding(target, ratio, detail, where, target.meets(ratio)))
    for seq, target in TRAIN.items():
        for suffix, how in (("", "eager"), ("_graph", "both from CUDA graphs")):
            n = index.get(("train_step", "nsa_triton" + suffix, "nsa-125m", seq))
            d = index.get(("train_step", "dense_sdpa" + suffix, "dense-125m", seq))
            if n and d and n.get("tokens_per_s") and d.get("tokens_per_s"):
                ratio = n["tokens_per_s"] / d["tokens_per_s"]
                out.append(Finding(target, ratio, how, where, target.meets(ratio)))
    return out


def decode_findings(data: dict[str, Any], source: str) -> list[Finding]:
    """A ``bench.decode`` results file: speed and NSA/dense ratio where it measured the
    targets' batch and context (sequences all at that context, not ``--stagger``'s)."""
    device = str(data.get("device") or "")
    where = _where(source, device)
    same = (m for m in data.get("measured", []) if not m.get("stagger"))
    rows = {(m["kind"], m["batch"], m["context"]): m for m in same}

    def condition(*ms: dict[str, Any]) -> tuple[bool, str]:
        """Whether the rows ran as the targets are set (replayed CUDA graphs, bf16, a GPU)."""
        paths = {m.get("decode_path") for m in ms}
        dtype = str(data.get("dtype") or "")
        if device.startswith("CPU"):
            return False, "on a CPU"
        if paths != {"cuda-graph"}:
            return False, f"decode path {', '.join(sorted(str(p) for p in paths))}, not cuda-graph"
        if dtype and "bfloat16" not in dtype:
            return False, f"{dtype}, not bf16"
        return True, "cuda-graph"

    out = []
    for (kind, batch, ctx), target in DECODE_SPEED.items():
        m = rows.get((kind, batch, ctx))
        if m:
            ok, how = condition(m)
            met = target.meets(m["tokens_per_s"]) if ok else None
            out.append(Finding(target, m["tokens_per_s"], how, where, met))
    for (batch, ctx), target in DECODE_RATIO.items():
        n, d = rows.get(("nsa", batch, ctx)), rows.get(("dense", batch, ctx))
        if n and d and d["tokens_per_s"]:
            ok, how = condition(n, d)
            ratio = n["tokens_per_s"] / d["tokens_per_s"]
            detail = f"{n['tokens_per_s']:,.0f} / {d['tokens_per_s']:,.0f} tokens/s, {how}"
            out.append(Finding(target, ratio, detail, where, target.meets(ratio) if ok else None))
    return out


def trainer_findings(data: dict[str, Any], source: str) -> list[Finding]:
    """A ``bench.trainer_overhead --json`` file: nsa-train's step against the bare one (both
    eager, or both from CUDA graphs with ``train.cuda_graph``); judged on a GPU only, where a
    host sync and the trainer's threads cost what they cost in training."""
    r = data["trainer_overhead"]
    device = str(r.get("device") or "")
    graph = r.get("cuda_graph") or "eager"
    detail = (f"{r['config']} at {r['batch_size']} x {r['seq_len']}: {r['trainer_ms']:.1f} / "
              f"{r['bare_ms']:.1f} ms, {graph}")
    on_gpu = bool(device) and not device.startswith("CPU")
    met = TRAINER.meets(r["ratio"]) if on_gpu else None
    detail = detail if on_gpu else f"{detail}, on a CPU"
    return [Finding(TRAINER, r["ratio"], detail, _where(source, device), met)]


def findings(paths: Iterable[Path]) -> tuple[list[Finding], list[str]]:
    """Every file's findings, and the files read that hold neither kind of result."""
    out: list[Finding] = []
    skipped = []
    for path in paths:
        data = json.loads(path.read_text())
        data = data if isinstance(data, dict) else {}
        rows = data.get("rows")
        if isinstance(rows, list) and rows and all(isinstance(r, dict) and "op" in r for r in rows):
            out += run_findings(data, path.name)
        elif isinstance(data.get("measured"), list):
            out += decode_findings(data, path.name)
        elif isinstance(data.get("trainer_overhead"), dict):
            out += trainer_findings(data, path.name)
        else:
            skipped.append(path.name)
    return out, skipped


def _value(f: Finding) -> str:
    return f"{f.value:,.0f} tokens/s" if f.target.unit == "tokens/s" else f"{f.value:.2f}x"


def format_markdown(found: Sequence[Finding], skipped: Sequence[str]) -> str:
    """One row per (target, file that measured it); a row for each target none did."""
    lines = ["# Speed targets against measured results", "",
             "| target | condition | wanted | measured | met | how | file (device) |",
             "|---|---|---|---|---|---|---|"]
    for t in TARGETS:
        mine = [f for f in found if f.target == t]
        for f in mine:
            met = {True: "yes", False: "no", None: "not as set"}[f.met]
            lines.append(f"| {t.what} | {t.condition} | {t.wanted()} | {_value(f)} | {met} | {f.detail} "
                         f"| {f.source} |")
        if not mine:
            lines.append(f"| {t.what} | {t.condition} | {t.wanted()} | - | not measured | - | - |")
    judged = [f for f in found if f.met is not None]
    targets = {f.target for f in judged}
    everywhere = {t for t in targets if all(f.met for f in judged if f.target == t)}
    somewhere = {f.target for f in judged if f.met}
    lines += ["", f"{len(TARGETS)} targets: {len(targets)} measured as set; met in every file that measured "
              f"them: {len(everywhere)}, in some: {len(somewhere)}."]
    if skipped:
        lines.append(f"Not results of bench.run, bench.decode or bench.trainer_overhead, skipped: "
                     f"{', '.join(skipped)}.")
    return "\n".join(lines) + "\n"


def _expand(ap: argparse.ArgumentParser, given: Sequence[Path]) -> list[Path]:
    """The files named, and the JSON files in each folder named (sorted)."""
    out = [f for p in given for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    for f in out:
        refuse_unreadable(ap, "results file", f)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.targets",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", type=Path, nargs="+",
                    help="bench.run, bench.decode or bench.trainer_overhead JSON results, or folders of them")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the findings here")
    args = ap.parse_args(argv)
    found, skipped = findings(_expand(ap, args.paths))
    print(format_markdown(found, skipped), end="")
    if args.json:
        rows = [dict(dataclasses.asdict(f.target), value=f.value, detail=f.detail, source=f.source, met=f.met)
                for f in found]
        args.json.write_text(json.dumps(dict(findings=rows, skipped=list(skipped)), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
