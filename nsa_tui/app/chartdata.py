"""What each chart shows: the chart kinds, the sets a key cycles through, a run's lines or the
marked runs' overlay, by step or by tokens. Pure (no Textual, no torch): widgets/charts.py
draws the ``ChartData`` made here.

Why a kind is more than a series name: TFLOP/s is tokens/s times the model FLOPs per token
that the trainer records in run.json (``train_flops_per_token``; the panel has no torch to
count them), MFU divides that by the GPUs' peak, and memory is bytes shown in GiB or MiB.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from nsa.contract.rundir import RUN_JSON
from nsa_tui.app.runmetrics import Points
from nsa_tui.app.state import PanelState, RunState
from nsa_tui.fmt import GIB, MIB

# line colours (RGB: plotext and the legend draw the same ones); the bucket min/max envelope
PALETTE = ((0, 200, 220), (255, 150, 50), (220, 110, 220), (120, 210, 110), (240, 210, 70),
           (120, 150, 255), (240, 100, 100), (180, 180, 180))
ENVELOPE = (88, 104, 118)


@dataclass(frozen=True)
class Series:
    label: str
    name: str  # a series of nsa.contract.series.metric_values
    style: str = "line"  # "line" | "dots" (sparse points: validation)


@dataclass(frozen=True)
class ChartKind:
    key: str
    title: str
    series: tuple[Series, ...]
    derive: str = ""  # "tflops" | "bytes" | ""


CHARTS: dict[str, ChartKind] = {k.key: k for k in (
    ChartKind("loss", "loss", (Series("train", "loss"), Series("val", "val_loss", "dots"))),
    ChartKind("tokens_per_s", "tokens/s", (Series("tokens/s", "tokens_per_s"),)),
    ChartKind("grad_norm", "grad norm", (Series("grad norm", "grad_norm"),)),
    ChartKind("lr", "learning rate", (Series("lr", "lr"),)),
    ChartKind("val_loss", "validation loss", (Series("val", "val_loss"),)),
    ChartKind("tflops", "model TFLOP/s", (Series("TFLOP/s", "tokens_per_s"),), derive="tflops"),
    ChartKind("gates", "gate shares", (Series("cmp", "gate.compressed"), Series("sel", "gate.selected"),
                                      Series("win", "gate.window"))),
    ChartKind("memory", "memory, rank 0", (Series("allocated", "mem_allocated_bytes"),), derive="bytes"),
)}

# what the chart key cycles through (the choice persists: app/viewprefs.py)
PRESETS: tuple[tuple[str, ...], ...] = (
    ("loss", "tokens_per_s"),
    ("loss", "grad_norm", "lr"),
    ("loss", "tflops", "memory"),
    ("gates", "val_loss", "grad_norm"),
)

# dense bf16 tensor-core peak per GPU (vendor data sheets), by a part of the NVML name; the
# first match wins, so longer names come first
PEAK_BF16 = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
             ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12))


def next_preset(current: tuple[str, ...]) -> tuple[str, ...]:
    """The chart set after ``current`` (the first one after an unknown set)."""
    try:
        return PRESETS[(PRESETS.index(tuple(current)) + 1) % len(PRESETS)]
    except ValueError:
        return PRESETS[0]


def valid_charts(keys: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``keys`` if they name 1-3 known charts (a preferences file may be old), else the default."""
    keys = tuple(k for k in keys if k in CHARTS)[:3]
    return keys or PRESETS[0]


@dataclass
class Line:
    label: str
    points: Points
    color: tuple[int, int, int]
    style: str = "line"
    envelope: bool = False  # also draw the bucket min/max


@dataclass
class ChartData:
    title: str
    lines: list[Line] = field(default_factory=list)
    x_label: str = "step"
    note: str = ""  # NaN/inf count, MFU, or why there is nothing to draw

    @property
    def empty(self) -> bool:
        return not any(len(line.points) for line in self.lines)


def peak_flops(gpu_name: str | None) -> float | None:
    for part, peak in PEAK_BF16:
        if gpu_name and part in gpu_name:
            return peak
    return None


def gpu_name(state: PanelState, run: RunState) -> str | None:
    host = state.hosts.get(run.host)
    if host is None:
        return None
    if host.sample is not None and host.sample.gpus:
        return host.sample.gpus[0].name
    names = host.hello.gpu_names if host.hello is not None else []
    return names[0] if names else None


def mfu_note(state: PanelState, run: RunState, tflops: float | None) -> str:
    """'MFU 41%' of the newest TFLOP/s, or why there is none (CPU, fp32, an unknown GPU)."""
    info = run.view.info if run.view is not None else None
    if info is None or tflops is None:
        return ""
    if not (info.device or "").startswith("cuda"):
        return "MFU N/A on cpu"
    if not any(t in (info.dtype or "") for t in ("bf16", "bfloat16")):
        return f"MFU N/A ({info.dtype or 'dtype unknown'}: no peak)"
    name = gpu_name(state, run)
    peak = peak_flops(name)
    if peak is None:
        return f"MFU N/A (no peak known for {name or 'this GPU'})"
    return f"MFU {tflops * 1e12 / (peak * max(1, info.world_size)) * 100:.0f}%"


def attention_kind(run: RunState) -> str | None:
    """``nsa`` or ``dense`` as run.json says (the resolved config's model.attention.kind, else
    the ops it trains on: SDPA is dense), None when it does not say."""
    info = run.view.info if run.view is not None else None
    if info is None:
        return None
    model = (info.config or {}).get("model")
    attention = model.get("attention") if isinstance(model, dict) else None
    kind = attention.get("kind") if isinstance(attention, dict) else None
    if isinstance(kind, str):
        return kind
    if info.attention_ops is not None and info.attention_ops.backend == "sdpa":
        return "dense"
    return None


def tokens_per_step(run: RunState) -> float | None:
    """Tokens of one optimizer step: global batch × seq len (run.json); constant across a
    fallback (it keeps the global batch); else the newest metric line's tokens / step."""
    info = run.view.info if run.view is not None else None
    if info is not None and info.global_batch and info.seq_len:
        return float(info.global_batch * info.seq_len)
    m = run.metrics.last_train
    if m is not None and m.tokens and m.step:
        return m.tokens / m.step
    return None


def _bytes_unit(lines: list[Line]) -> tuple[float, str]:
    top = max((max(line.points.hi) for line in lines if len(line.points)), default=0.0)
    return (GIB, "GiB") if top >= GIB else (MIB, "MiB")


def _finish(kind: ChartKind, data: ChartData, runs: list[RunState], state: PanelState) -> ChartData:
    """Scale derived kinds and write the note (NaN count, MFU, unit, why empty)."""
    notes: list[str] = []
    if kind.derive == "tflops":
        for line, run in zip(data.lines, runs):
            per_token = run.view.info.train_flops_per_token if run.view is not None else None
            line.points = line.points.mapped(k=per_token / 1e12) if per_token else Points()
        if len(runs) == 1 and data.lines and len(data.lines[0].points):
            notes.append(mfu_note(state, runs[0], data.lines[0].points.y[-1]))
        elif data.empty:
            notes.append(f"N/A: {RUN_JSON} has no train_flops_per_token (older trainer)")
    if kind.derive == "bytes":
        div, unit = _bytes_unit(data.lines)
        for line in data.lines:
            line.points = line.points.mapped(k=1 / div)
        cpu = all(r.view is not None and not (r.view.info.device or "").startswith("cuda") for r in runs)
        data.title += f" ({'RSS, ' if cpu else ''}{unit})"
    bad = sum(len(line.points.bad) for line in data.lines)
    if bad:
        notes.append(f"⚠ {bad} NaN/inf")
    if kind.key == "gates" and data.empty and runs and all(attention_kind(r) == "dense" for r in runs):
        notes.append("dense: no gates")  # not "no data yet": none will ever come
    if data.empty and not notes:
        notes.append("N/A (no data yet)")
    data.note = "  ".join(n for n in notes if n)
    return data


def _x_map(run: RunState, axis: str) -> Callable[[float], float | None] | None:
    if axis != "tokens":
        return lambda x: x
    per = tokens_per_step(run)
    return (lambda x: x * per) if per else None


def single(state: PanelState, run: RunState, key: str, axis: str = "step") -> ChartData:
    """One run's chart of kind ``key``: its lineage's points (a fallback continues its
    parent's curve), every series of the kind, the bucket min/max around the main line."""
    kind = CHARTS[key]
    data = ChartData(kind.title, x_label=axis)
    fx = _x_map(run, axis)
    for i, s in enumerate(kind.series):
        p = state.chart_points(run, s.name)
        p = p.mapped(fx) if fx else Points()
        data.lines.append(Line(s.label, p, PALETTE[i % len(PALETTE)], s.style, envelope=s.style == "line"))
    return _finish(kind, data, [run] * len(kind.series), state)


def compare(state: PanelState, runs: list[RunState], key: str, axis: str = "step") -> ChartData:
    """The marked runs overlaid: the kind's first series of each run, its own points only (a
    run and its fallback are two lines), coloured in the order they were marked."""
    kind = CHARTS[key]
    s = kind.series[0] if key != "gates" else kind.series[1]  # gates: the selected branch's share
    title = kind.title if key != "gates" else "gate share: selected"
    data = ChartData(f"{title} · {len(runs)} runs", x_label=axis)
    missing = []
    for i, run in enumerate(runs):
        fx = _x_map(run, axis)
        if fx is None:
            missing.append(run.name)
        p = run.metrics.points(s.name).mapped(fx) if fx else Points()
        data.lines.append(Line(run.name, p, PALETTE[i % len(PALETTE)]))
    data = _finish(kind, data, runs, state)
    if missing:
        data.note = (data.note + "  " if data.note else "") + f"no token count: {', '.join(missing)}"
    return data


def legend(runs: list[RunState]) -> list[tuple[str, tuple[int, int, int]]]:
    """(label, colour) of each compared run, as ``compare`` draws them."""
    multi = len({r.host for r in runs}) > 1
    return [(f"{r.name} ({r.host})" if multi else r.name, PALETTE[i % len(PALETTE)])
            for i, r in enumerate(runs)]
