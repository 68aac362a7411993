"""Long-context evaluation results as the panel draws them: per run, the passkey accuracy
grid (length x depth, each cell coloured by its accuracy) and the loss by position bucket as
bars on one scale, so that marked runs (NSA against dense) compare at a glance. Pure: Rich
renderables from PasskeyEval records (nsa/contract/evals.py); screens/evals.py shows them."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from nsa.contract.evals import PasskeyEval

BAR_WIDTH = 24


@dataclass
class RunEvals:
    """One run's side of the comparison: its label and its records, oldest first."""

    label: str
    evals: list[PasskeyEval]
    error: str = ""  # why its records could not be read


def newest(evals: list[PasskeyEval]) -> PasskeyEval | None:
    """The record the panel shows for a run: its newest."""
    return max(evals, key=lambda e: (e.ts, e.step)) if evals else None


def _cell_style(acc: float) -> str:
    return "bold green" if acc >= 0.9 else "green" if acc >= 0.5 else "yellow" if acc > 0 else "red"


def accuracy_grid(rec: PasskeyEval, title: str) -> Group:
    """Its heading, then a table: rows are lengths (``*``: beyond the trained context),
    columns depths, cells the accuracy."""
    where = rec.checkpoint or f"step {rec.step} (in training)"
    head = Text(f"{title}  {rec.attention or '?'} · {where} · {rec.trials} trial(s), seed {rec.seed}",
                style="bold")
    t = Table(show_edge=False, pad_edge=False, expand=False)
    t.add_column("length \\ depth", justify="right", style="bold")
    for d in rec.depths:
        t.add_column(f"{d:.2f}", justify="right")
    for n, row in zip(rec.lengths, rec.accuracy):
        cells = [Text(f"{a:.2f}", style=_cell_style(a)) for a in row]
        t.add_row(f"{n}{'*' if n in rec.beyond_context else ''}", *cells)
    if rec.beyond_context:
        note = Text(f"* beyond the trained context ({rec.trained_context} tokens)", style="dim")
        return Group(head, t, note)
    return Group(head, t)


def loss_chart(runs: list[tuple[str, PasskeyEval]]) -> Table:
    """Loss by position bucket, a row per bucket and a bar per run on one shared scale."""
    losses = [b.loss for _, r in runs for b in r.loss_buckets]
    lo, hi = (min(losses), max(losses)) if losses else (0.0, 1.0)
    t = Table(title=f"loss by position (nats per token; bars from {lo:.3f} to {hi:.3f})",
              title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("positions", justify="right")
    for label, rec in runs:
        t.add_column(f"{label} ({rec.loss_source or '-'})")
    rows = max((len(r.loss_buckets) for _, r in runs), default=0)
    for i in range(rows):
        span = next((f"{r.loss_buckets[i].start}-{r.loss_buckets[i].end}" for _, r in runs
                     if i < len(r.loss_buckets)), "")
        cells: list[RenderableType] = []
        for _, rec in runs:
            if i >= len(rec.loss_buckets):
                cells.append(Text(""))
                continue
            b = rec.loss_buckets[i]
            n = 1 + round((BAR_WIDTH - 1) * (b.loss - lo) / (hi - lo)) if hi > lo else BAR_WIDTH
            cells.append(Text("█" * n + " " * (BAR_WIDTH - n) + f" {b.loss:.3f}"))
        t.add_row(span, *cells)
    return t


def render(runs: list[RunEvals]) -> RenderableType:
    """The whole view: a grid per run (its newest record), then the loss chart of them all."""
    parts: list[RenderableType] = []
    shown: list[tuple[str, PasskeyEval]] = []
    for r in runs:
        rec = newest(r.evals)
        if r.error:
            parts.append(Text(f"{r.label}: {r.error}", style="bold red"))
        elif rec is None:
            parts.append(Text(f"{r.label}: no evaluations yet (nsa-tui eval HOST RUN --passkey, or the "
                              "config's eval.every_steps)", style="dim"))
        else:
            parts.append(accuracy_grid(rec, r.label))
            shown.append((r.label, rec))
        parts.append(Text(""))
    if any(rec.loss_buckets for _, rec in shown):
        parts.append(loss_chart([(label, rec) for label, rec in shown if rec.loss_buckets]))
    return Group(*parts)
