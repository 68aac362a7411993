"""Run summary: the facts that make a wrong run obvious at a glance (a toy model, gates stuck
at uniform: docs/lessons.md#no-silent-default and docs/lessons.md#gates-visible)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from nsa.contract import AttentionOps, CudaGraph, GateShares
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
    if ops.backend == "sdpa":  # dense: SDPA, and RoPE's kernel where one was checked
        t = Text("sdpa", style="bold")
        if ops.self_check is not None and ops.self_check.ok:
            t.append(f" · RoPE kernel checked on {ops.self_check.device}", style="dim")
        elif ops.self_check is not None:
            t.append(" · RoPE on torch's formula, its kernel failed the check: ", style="yellow")
            t.append("; ".join(ops.self_check.failures), style="yellow")
        return t
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
    if ops.window == "flexattention":
        t.append(" · window: FlexAttention", style="dim")
    return t


def graph_text(graph: CudaGraph) -> Text:
    """train.cuda_graph's outcome: replayed from a CUDA graph, or eager with the reason."""
    if graph.replayed:
        return Text("replayed from a CUDA graph (checked against eager)", style="bold")
    t = Text("eager ", style="bold")
    t.append("(train.cuda_graph asked): ", style="yellow")
    t.append(graph.reason, style="yellow")
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
        if not run.alive and not b.phase.is_final():  # the run ended and this rank never said how
            t.append(f"gone at step {b.step} ({b.phase.value}, no final heartbeat)", style="bold red")
            continue
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


Row = tuple[str, str, Text | str]  # (part, key, value); parts: FACTS, LIVE, END
FACTS, LIVE, END = "facts", "live", "end"  # what a run is / how it goes now / where it came from and ended


def summary_rows(run: RunState, now: float = 0.0, merged: MergedRun | None = None) -> list[Row]:
    """The summary's rows in order, each in its part: only the LIVE rows change from one second
    to the next while a run trains, so only they are drawn again (docs/panel.md, the panel's cost)."""
    view = run.view
    if view is None:
        return [(FACTS, "run", Text(run.run_id))]
    info = view.info
    train, model = _section(info.config, "train"), _section(info.config, "model")
    attn = _section(model, "attention").get("kind")
    seq = info.seq_len or train.get("seq_len")
    gb = info.global_batch
    config = (view.launch.config_file if view.launch else None) or info.config_path  # as the user gave it
    rows: list[Row] = [(FACTS, "config", Text(str(config)) if config else NA)]
    rows.append((FACTS, "model", f"{fmt_count(info.param_count, 'params')}  {attn or NA}"
                 + (f"  d{model.get('dim')}×L{model.get('n_layers')}" if model.get("dim") else "")))
    rows.append((FACTS, "seq", f"{seq} tokens" if seq else NA))
    batch = NA
    if gb:
        batch = f"{gb} seq"
        if seq:
            batch += f" = {fmt_count(gb * seq, 'tok')}"
        batch += f" ({info.batch_size or NA}/rank×{info.world_size}×{info.grad_accum or NA} acc)"
    rows.append((FACTS, "batch", batch))
    rows.append((FACTS, "dtype", Text(f"{info.dtype or NA} on {info.device or NA}")))
    if info.cuda_graph is not None:  # train.cuda_graph asked
        rows.append((FACTS, "steps", graph_text(info.cuda_graph)))
    if info.attention_ops is not None:  # absent in runs of older trainers
        rows.append((FACTS, "attn ops", ops_text(info.attention_ops)))
    data = info.data_source or _section(info.config, "data").get("source") or NA
    rows.append((FACTS, "data", Text(str(data))))
    m = run.metrics.last_train
    rows.append((LIVE, "gates", gate_text(m.gate_shares if m else None, run.step, train.get("warmup_steps"))))
    lr = m.lr if m else None
    last = f"loss {fmt_float(m.loss if m else None)} · lr {f'{lr:.2e}' if is_num(lr) else NA}"
    rows.append((LIVE, "last", last))
    if merged is not None:
        rows.append((LIVE, "hosts", hosts_text(merged)))
        if merged.problem:
            rows.append((LIVE, merged.status.value, Text(merged.problem, style="bold red")))
    if info.pg_timeouts is not None:
        rows.append((LIVE, "timeouts", timeouts_text(run)))
    if run.alive or run.beats or (merged is not None and merged.ranks):
        rows.append((LIVE, "ranks", ranks_text(run, now, merged)))
    if view.slurm is not None:  # a batch job: why it waits, where it runs, how it ended
        from nsa_tui.slurm.text import job_text

        rows.append((END, "slurm", Text(job_text(view.slurm))))
        rows.append((END, "script", Text(view.slurm.script)))
    if view.parent_run:
        rows.append((END, "parent", Text(view.parent_run)))
    if info.resumed_from:
        rows.append((END, "resumed", Text(info.resumed_from)))
    if info.exit_reason:
        rows.append((END, "exit", Text(info.exit_reason, style="red")))
    return rows


def rows_table(rows: list[Row], key_width: int | None = None) -> Table:
    """Rows as a two-column table; ``key_width`` lines up the parts' tables with each other."""
    t = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    t.add_column(style="bold", no_wrap=True, width=key_width)
    t.add_column(overflow="fold", ratio=1)  # the values take the width left, the keys stay put
    for _, key, value in rows:
        t.add_row(key, value)
    return t


def summary_table(run: RunState, now: float = 0.0, merged: MergedRun | None = None) -> Table:
    """The whole summary as one table (what the pane shows, in its parts)."""
    return rows_table(summary_rows(run, now, merged))


def _row_sig(row: Row) -> tuple:
    part, key, value = row
    return (part, key, value) if isinstance(value, str) else (part, key, value.plain, tuple(value.spans),
                                                              str(value.style))


class RunSummary(VerticalScroll):
    """What is this run, really? Shown for the selected run, in three parts drawn on their own:
    the facts, the live rows (loss, gates, ranks' beats: new every second), where it came from
    and how it ended."""

    can_focus = False  # tab goes from the run list to the GPUs, as before; the mouse wheel scrolls it

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown: dict[str, tuple] = {}  # part -> what it shows (its rows' signature)
        self._rows: list[Row] = []
        self._sig: tuple = ()

    def compose(self) -> ComposeResult:
        for part in (FACTS, LIVE, END):
            yield Static(id=f"summary-{part}", classes="summary-part")

    @property
    def content(self) -> Table | Text:
        """Everything the summary shows, as one renderable (what tests read)."""
        return rows_table(self._rows) if self._rows else Text("N/A — no run selected", style="dim")

    def update_from(self, state: PanelState, now: float) -> None:
        run = state.selected_run()
        parts = state.parts_of(run) if run else []
        sig = (run.key, tuple(p.version for p in parts), int(now)) if run else (None,)
        if sig == self._sig:
            return
        self._sig = sig
        if run is None:
            self._rows = []
            self._show(FACTS, ("none",), Text("N/A — no run selected", style="dim"))
            self._show(LIVE, (), None)
            self._show(END, (), None)
            return
        merged = state.merged(run) if hosts_of(run.view) else None
        self._rows = rows = summary_rows(run, now, merged)
        key_width = max(len(key) for _, key, _ in rows)  # the parts' keys line up
        for part in (FACTS, LIVE, END):
            mine = [r for r in rows if r[0] == part]
            self._show(part, (key_width, *map(_row_sig, mine)), rows_table(mine, key_width) if mine else None)

    def _show(self, part: str, sig: tuple, table: Table | Text | None) -> None:
        """Draw one part again only when what it shows changed."""
        if self._shown.get(part) == sig:
            return
        self._shown[part] = sig
        widget = self.query_one(f"#summary-{part}", Static)
        widget.display = table is not None
        if table is not None:
            # a new layout (the whole screen's) only when the part's height changes: a rank's line
            # that wraps once its step has another digit, a row more
            width = widget.size.width
            console = self.app.console
            options = console.options.update_width(width)
            height = len(console.render_lines(table, options, pad=False)) if width else 0
            widget.update(table, layout=not width or height != widget.size.height)
