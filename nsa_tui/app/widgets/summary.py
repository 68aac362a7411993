"""Run summary: the facts that make a wrong run obvious at a glance (a toy model, gates stuck
at uniform: docs/lessons.md#no-silent-default and docs/lessons.md#gates-visible)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from nsa.contract import AttentionOps, GateShares
from nsa_tui.app.state import PanelState, RunState
from nsa_tui.fmt import NA, fmt_count, fmt_duration, fmt_float, is_num
from nsa_tui.hosts.merge import MergedRun, hosts_of

UNIFORM_TOL = 0.03  # gate shares within 3 points of 1/3 each look untrained (docs/lessons.md#gates-visible)


def gate_text(shares: GateShares | None, step: int | None, warmup: Any) -> Text:
    """'cmp 31% sel 45% win 24%', flagged when stuck at uniform after warmup."""
    if shares is None:
        return Text("N/A (dense or no data)", style="dim")
    t = Text()
    vals = [shares.compressed, shares.selected, shares.window]
    for short, v in zip(("cmp", "sel", "win"), vals):
        t.append(f"{short} ")
        t.append(f"{v * 100:.0f}%" if is_num(v) else NA, style="bold")
        t.append(" ")
    past_warmup = is_num(step) and is_num(warmup) and step > warmup
    if past_warmup and all(is_num(v) and abs(v - 1 / 3) < UNIFORM_TOL for v in vals):
        t.append("⚠ uniform", style="bold yellow")
    return t


def ops_text(ops: AttentionOps) -> Text:
    """Which attention ops the run trains on; a fallback to the reference stands out with its reason."""
    if ops.fallback_reason:
        t = Text(f"{ops.backend} ", style="bold red")
        t.append(f"⚠ fallback from {ops.requested} (far slower): ", style="bold yellow")
        t.append(ops.fallback_reason, style="yellow")
        return t
    t = Text(ops.backend, style="bold")
    if ops.self_check is not None and ops.self_check.ok:
        t.append(f" · self-check ok on {ops.self_check.device}", style="dim")
    elif ops.backend != "sdpa" and ops.requested != ops.backend:
        t.append(f" (requested {ops.requested})", style="dim")
    return t


def ranks_text(run: RunState, now: float, merged: MergedRun | None = None) -> Text:
    """One line per rank: phase, step and heartbeat age (a stuck rank stands out); over several
    hosts, every host's ranks with their host."""
    t = Text()
    if merged is not None:
        beats = [(b.rank, b) for _, b in merged.ranks]
        where = {b.rank: h for h, b in merged.ranks}
    else:
        beats, where = sorted(run.beats.items()), {}
    if not beats:
        return Text(NA, style="dim")
    top = max(b.step for _, b in beats)
    for i, (rank, b) in enumerate(beats[:8]):
        if i:
            t.append("\n")
        t.append(f"r{rank}" + (f"@{where[rank]}" if rank in where else "") + " ", style="bold")
        t.append(f"{b.phase.value} step {b.step}", style="yellow" if b.step < top else "")
        t.append(f" · beat {fmt_duration(now - b.ts)} ago", style="dim")
    if len(beats) > 8:
        t.append(f"\n… {len(beats) - 8} more ranks", style="dim")
    return t


def _section(cfg: dict[str, Any] | None, name: str) -> dict[str, Any]:
    sec = (cfg or {}).get(name)
    return sec if isinstance(sec, dict) else {}


def hosts_text(merged: MergedRun) -> Text:
    """The hosts of a run over several hosts: which holds rank 0, which cannot be reached."""
    t = Text()
    for i, host in enumerate(merged.hosts):
        if i:
            t.append(" + ")
        t.append(host, style="bold" if host == merged.primary else "")
        if host == merged.primary:
            t.append(" (rank 0)", style="dim")
        if host in merged.lost:
            t.append(f" LOST: {merged.lost[host].splitlines()[0] if merged.lost[host] else 'unreachable'}",
                     style="bold yellow")
    return t


def timeouts_text(run: RunState) -> Text:
    """The process-group timeouts by phase and which one holds now (docs/training.md)."""
    info = run.view.info if run.view is not None else None
    pg = info.pg_timeouts if info is not None else None
    if pg is None:
        return Text(NA, style="dim")
    phase = run.phase()[0]
    now = "start" if run.step == 0 or phase in ("checkpoint", "boot") else "steady"
    return Text(f"start {pg.start_s:.0f} s · steady {pg.steady_s:.0f} s (now: {now})")


def summary_table(run: RunState, now: float = 0.0, merged: MergedRun | None = None) -> Table:
    view = run.view
    t = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    if view is None:
        t.add_row("run", Text(run.run_id))
        return t
    info = view.info
    train, model = _section(info.config, "train"), _section(info.config, "model")
    attn = _section(model, "attention").get("kind")
    seq = info.seq_len or train.get("seq_len")
    gb = info.global_batch
    config = (view.launch.config_file if view.launch else None) or info.config_path  # as the user gave it
    t.add_row("config", Text(str(config)) if config else NA)
    t.add_row("model", f"{fmt_count(info.param_count, 'params')}  {attn or NA}"
              + (f"  d{model.get('dim')}×L{model.get('n_layers')}" if model.get("dim") else ""))
    t.add_row("seq", f"{seq} tokens" if seq else NA)
    batch = NA
    if gb:
        batch = f"{gb} seq"
        if seq:
            batch += f" = {fmt_count(gb * seq, 'tok')}"
        batch += f" ({info.batch_size or NA}/rank×{info.world_size}×{info.grad_accum or NA} acc)"
    t.add_row("batch", batch)
    t.add_row("dtype", Text(f"{info.dtype or NA} on {info.device or NA}"))
    if info.attention_ops is not None:  # absent in runs of older trainers
        t.add_row("attn ops", ops_text(info.attention_ops))
    t.add_row("data", Text(str(info.data_source or _section(info.config, "data").get("source") or NA)))
    m = run.metrics.last_train
    t.add_row("gates", gate_text(m.gate_shares if m else None, run.step, train.get("warmup_steps")))
    lr = m.lr if m else None
    t.add_row("last", f"loss {fmt_float(m.loss if m else None)} · lr {f'{lr:.2e}' if is_num(lr) else NA}")
    if merged is not None:
        t.add_row("hosts", hosts_text(merged))
        if merged.problem:
            t.add_row(merged.status.value, Text(merged.problem, style="bold red"))
    if info.pg_timeouts is not None:
        t.add_row("timeouts", timeouts_text(run))
    if run.alive or run.beats or (merged is not None and merged.ranks):
        t.add_row("ranks", ranks_text(run, now, merged))
    if view.slurm is not None:  # a batch job: why it waits, where it runs, how it ended
        from nsa_tui.slurm.text import job_text

        t.add_row("slurm", Text(job_text(view.slurm)))
        t.add_row("script", Text(view.slurm.script))
    if view.parent_run:
        t.add_row("parent", Text(view.parent_run))
    if info.resumed_from:
        t.add_row("resumed", Text(info.resumed_from))
    if info.exit_reason:
        t.add_row("exit", Text(info.exit_reason, style="red"))
    return t


class RunSummary(Static):
    """What is this run, really? Shown for the selected run."""

    _sig: tuple = ()

    def update_from(self, state: PanelState, now: float) -> None:
        run = state.selected_run()
        parts = state.parts_of(run) if run else []
        sig = (run.key, tuple(p.version for p in parts), int(now)) if run else (None,)
        if sig == self._sig:
            return
        self._sig = sig
        if run is None:
            self.update(Text("N/A — no run selected", style="dim"))
            return
        merged = state.merged(run) if hosts_of(run.view) else None
        self.update(summary_table(run, now, merged), layout=False)  # fixed size pane: no re-layout
