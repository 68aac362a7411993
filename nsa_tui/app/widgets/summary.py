"""Run summary: the facts that make a wrong run obvious at a glance (LESSONS 1, 21)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from nsa_tui.app.fmt import NA, fmt_count, fmt_duration, fmt_float, is_num
from nsa_tui.app.state import PanelState, RunState

UNIFORM_TOL = 0.03  # gate shares within 3 points of 1/3 each look untrained (LESSONS 21)


def gate_text(shares: Any, step: Any, warmup: Any) -> Text:
    """'cmp 31% sel 45% win 24%', flagged when stuck at uniform after warmup."""
    if not isinstance(shares, dict):
        return Text("N/A (dense or no data)", style="dim")
    t = Text()
    vals = []
    for short, key in (("cmp", "compressed"), ("sel", "selected"), ("win", "window")):
        v = shares.get(key)
        vals.append(v)
        t.append(f"{short} ")
        t.append(f"{v * 100:.0f}%" if is_num(v) else NA, style="bold")
        t.append(" ")
    past_warmup = is_num(step) and is_num(warmup) and step > warmup
    if past_warmup and all(is_num(v) and abs(v - 1 / 3) < UNIFORM_TOL for v in vals):
        t.append("⚠ uniform", style="bold yellow")
    return t


def ops_text(ops: dict[str, Any]) -> Text:
    """Which attention ops the run trains on; a fallback to the reference stands out with its reason."""
    backend = str(ops.get("backend") or NA)
    if ops.get("fallback_reason"):
        t = Text(f"{backend} ", style="bold red")
        t.append(f"⚠ fallback from {ops.get('requested') or NA} (far slower): ", style="bold yellow")
        t.append(str(ops["fallback_reason"]), style="yellow")
        return t
    t = Text(backend, style="bold")
    check = ops.get("self_check")
    if isinstance(check, dict) and check.get("ok"):
        t.append(f" · self-check ok on {check.get('device', NA)}", style="dim")
    elif backend != "sdpa" and ops.get("requested") not in (None, backend):
        t.append(f" (requested {ops['requested']})", style="dim")
    return t


def ranks_text(run: RunState, now: float) -> Text:
    """One line per rank: phase, step and heartbeat age (a stuck rank stands out)."""
    t = Text()
    beats = sorted(run.heartbeats.items())
    if not beats:
        return Text(NA, style="dim")
    top = max((b.get("step") or 0) for _, b in beats)
    for i, (rank, b) in enumerate(beats[:8]):
        if i:
            t.append("\n")
        age = now - b["ts"] if is_num(b.get("ts")) else None
        behind = (b.get("step") or 0) < top
        t.append(f"r{rank} ", style="bold")
        t.append(f"{b.get('phase') or NA} step {b.get('step', NA)}", style="yellow" if behind else "")
        t.append(f" · beat {fmt_duration(age)} ago" if age is not None else "", style="dim")
    if len(beats) > 8:
        t.append(f"\n… {len(beats) - 8} more ranks", style="dim")
    return t


def summary_table(run: RunState, now: float = 0.0) -> Table:
    rec = run.record
    cfg = rec.get("config") or {}
    train = cfg.get("train") or {} if isinstance(cfg, dict) else {}
    model = cfg.get("model") or {} if isinstance(cfg, dict) else {}
    attn = (model.get("attention") or {}).get("kind") if isinstance(model, dict) else None
    seq = rec.get("seq_len") or train.get("seq_len")
    gb = rec.get("global_batch")
    t = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    launch = rec.get("launch") or {}
    config = launch.get("config_file") or rec.get("config_path")  # as the user gave it
    t.add_row("config", str(config) if config else NA)
    t.add_row("model", f"{fmt_count(rec.get('param_count'), 'params')}  {attn or NA}"
              + (f"  d{model.get('dim')}×L{model.get('n_layers')}" if model.get("dim") else ""))
    t.add_row("seq", f"{seq} tokens" if seq else NA)
    batch = NA
    if gb:
        batch = f"{gb} seq"
        if seq:
            batch += f" = {fmt_count(gb * seq, 'tok')}"
        per, world, acc = rec.get("batch_size", NA), rec.get("world_size", NA), rec.get("grad_accum", NA)
        batch += f" ({per}/rank×{world}×{acc} acc)"
    t.add_row("batch", batch)
    t.add_row("dtype", f"{rec.get('dtype') or NA} on {rec.get('device') or NA}")
    if isinstance(rec.get("attention_ops"), dict):  # absent in runs of older trainers
        t.add_row("attn ops", ops_text(rec["attention_ops"]))
    t.add_row("data", str(rec.get("data_source") or (cfg.get("data") or {}).get("source") or NA))
    t.add_row("gates", gate_text(run.last_metric.get("gate_shares"), rec.get("step"),
                                  train.get("warmup_steps")))
    m = run.last_metric
    lr = m.get("lr")
    t.add_row("last", f"loss {fmt_float(m.get('loss'))} · lr {f'{lr:.2e}' if is_num(lr) else NA}")
    if run.alive or run.heartbeats:
        t.add_row("ranks", ranks_text(run, now))
    if rec.get("parent_run"):
        t.add_row("parent", str(rec["parent_run"]))
    if rec.get("resumed_from"):
        t.add_row("resumed", str(rec["resumed_from"]))
    if rec.get("exit_reason"):
        t.add_row("exit", Text(str(rec["exit_reason"]), style="red"))
    return t


class RunSummary(Static):
    """What is this run, really? Shown for the selected run."""

    _sig: tuple = ()

    def update_from(self, state: PanelState, now: float) -> None:
        run = state.selected_run()
        sig = (run.key, run.version, int(now)) if run else ()
        if sig == self._sig and sig:
            return
        self._sig = sig
        if run is None:
            self.update(Text("N/A — no run selected", style="dim"))
            return
        self.update(summary_table(run, now), layout=False)  # fixed size pane: no re-layout
