"""What the CLI prints for people (``--json`` prints the records instead): the runs table, a
run's status, an alert. Pure functions of the contract's records and a clock, so they are tested
without a host. The table fits 100 columns; nothing unknown is printed as ``None``."""

from __future__ import annotations

import time
from collections.abc import Sequence

from nsa.contract import (
    Alert,
    AttentionOps,
    EvalMetric,
    Metric,
    RunStatus,
    RunStatusReport,
    RunView,
    TrainMetric,
)
from nsa.contract.replies import AlertState
from nsa_tui.cli.runref import short_ids
from nsa_tui.fmt import fmt_count, fmt_duration
from nsa_tui.slurm.text import job_text, short_text

MIN_NAME = 12
WIDTH = 100


class LineSplitter:
    """Whole lines out of chunks of a log that a read may cut anywhere (1 MiB reads, a line
    still being written): the cut start is kept for the next chunk."""

    def __init__(self) -> None:
        self.carry = ""

    def feed(self, text: str, final: bool = False) -> list[str]:
        """The lines that ``text`` completes; ``final``: the cut start too, as a line."""
        lines = (self.carry + text).split("\n")
        self.carry = lines.pop()
        if final and self.carry:
            lines.append(self.carry)
            self.carry = ""
        return lines


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def alert_lines(st: AlertState) -> list[str]:
    """One alert for a terminal: when, run, id, state, what; then its message and evidence."""
    a = st.alert
    rank = f" rank {a.rank}" if a.rank is not None else ""
    state: str = st.state
    if st.state == "resolved":
        state += f" {_when(st.resolved_at)}"
    if st.acked_at:
        state += f", acknowledged by {st.acked_by or '?'}"
    out = [f"{_when(st.raised_at)}  {st.run}  {st.id}  [{a.severity.upper()}] {a.kind}{rank}  ({state})",
           f"    {a.message}"]
    if a.evidence:
        out.append(f"    evidence: {', '.join(a.evidence)}")
    return out


def cut_middle(text: str, width: int) -> str:
    """``nsa-125m-…-fallback``: a long name keeps its start and its end (relaunch suffixes)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def _step(view: RunView, beat_step: int = 0) -> str:
    info = view.info
    step = max(info.step, beat_step)
    return f"{step}/{info.total_steps}" if info.total_steps is not None else str(step)


def runs_table(runs: Sequence[RunView], now: float) -> str:
    """One row per run, newest first: the shortest unique id prefix (what commands accept), age,
    name (cut in the middle), status, step/total, world size, parameters."""
    short = short_ids([r.run_id for r in runs])
    rows = [["RUN", "AGE", "NAME", "STATUS", "STEP", "WORLD", "PARAMS"]]
    for r in runs:
        i = r.info
        age = fmt_duration(now - r.created) if r.created else "-"
        status = r.status.value + (" (archived)" if r.archived else "")
        if r.slurm is not None:  # a Slurm run: why it waits, or where it runs
            status += f" [{short_text(r.slurm)}]"
        rows.append([short[r.run_id], age, r.name, status, _step(r), str(i.world_size),
                     fmt_count(i.param_count) if i.param_count else "-"])
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    others = sum(widths) - widths[2] + 2 * (len(widths) - 1)
    name_width = max(MIN_NAME, min(widths[2], WIDTH - others))  # the name gives way, not the id
    for row in rows[1:]:
        row[2] = cut_middle(row[2], name_width)
    widths[2] = max(len(row[2]) for row in rows)
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def attention_text(ops: AttentionOps) -> str:
    """The attention ops a run trains on, as the panel's summary says it: a fallback to the
    reference (far slower) names what was asked and why, so a script or a person at a terminal
    sees it without opening the panel."""
    if ops.backend == "sdpa":  # dense: SDPA, and RoPE's kernel where one was checked
        if ops.self_check is not None and ops.self_check.ok:
            return f"sdpa (RoPE kernel checked on {ops.self_check.device}, {ops.self_check.dtype})"
        if ops.self_check is not None:
            failures = "; ".join(ops.self_check.failures)
            return f"sdpa (RoPE on torch's formula, its kernel failed the check: {failures})"
        return "sdpa"
    if ops.fallback_reason:
        return f"{ops.backend} (FALLBACK from {ops.requested}, far slower: {ops.fallback_reason})"
    if ops.self_check is not None and ops.self_check.ok:
        window = "; window branch: FlexAttention" if ops.window == "flexattention" else ""
        return f"{ops.backend} (self-check passed on {ops.self_check.device}, {ops.self_check.dtype}{window})"
    if ops.backend != "sdpa" and ops.requested != ops.backend:
        return f"{ops.backend} (requested {ops.requested})"
    return ops.backend


def progress_text(metrics: Sequence[Metric]) -> str | None:
    """Where training stands, from the newest metric lines: the last step's loss, tokens/s over
    the recent steps (their tokens over their time, not one step's noise) and the newest
    validation loss among them. None before the first step is logged."""
    train = [m for m in metrics if isinstance(m, TrainMetric)]
    if not train:
        return None
    last = train[-1]
    text = f"step {last.step} loss {last.loss:.4g}"
    timed = [(m.tokens_per_s, m.step_time_s) for m in train if m.tokens_per_s is not None and m.step_time_s]
    seconds = sum(t for _, t in timed)
    if seconds > 0:
        tokens = sum(rate * t for rate, t in timed)
        steps = f"the last {len(timed)} steps" if len(timed) > 1 else "the last step"
        text += f", {tokens / seconds:,.0f} tokens/s over {steps} ({1e3 * seconds / len(timed):,.0f} ms/step)"
    evals = [m for m in metrics if isinstance(m, EvalMetric)]
    if evals:
        text += f", val_loss {evals[-1].val_loss:.4g} at step {evals[-1].step}"
    return text


def status_text(rep: RunStatusReport, alerts: Sequence[Alert], now: float, skew: float) -> str:
    """The run's identity and progress, one line per rank, the alerts that hold now. A run that
    is still booting says so (and how long its ranks have been in which phase) instead of
    printing the numbers it does not have yet."""
    run, info = rep.run, rep.run.info
    beat_step = max((b.step for b in rep.beats), default=0)  # run.json is rewritten every ~10 s
    parts = [run.run_id, run.name, f"status={run.status.value}", f"step={_step(run, beat_step)}",
             f"world={info.world_size}"]
    if info.global_batch:
        parts.append(f"global_batch={info.global_batch}")
    if info.param_count:
        parts.append(f"params={fmt_count(info.param_count)}")
    booting = run.status.is_alive() and info.status == RunStatus.STARTING
    if booting:
        created = run.created or info.started_at
        since = f" for {fmt_duration(now - skew - created)}" if created else ""
        parts.append(f"(booting{since}: " + ("no heartbeat yet)" if not rep.beats else "see the ranks)"))
    lines = ["  ".join(parts)]
    if run.slurm is not None:
        lines.append(f"  slurm: {job_text(run.slurm)}")
        lines.append(f"  script: {run.slurm.script}")
    if info.attention_ops is not None:  # chosen at boot (absent before that, and from older trainers)
        lines.append(f"  attention: {attention_text(info.attention_ops)}")
    progress = progress_text(rep.recent_metrics)
    if progress is not None:
        lines.append(f"  latest: {progress}")
    for b in rep.beats:
        phase_for = f" for {fmt_duration(max(0.0, now - skew - b.phase_since))}" if b.phase_since else ""
        age = rep.heartbeat_age_s.get(b.rank, max(0.0, now - skew - b.ts))
        lines.append(f"  rank {b.rank}: step {b.step} phase {b.phase.value}{phase_for}, "
                     f"heartbeat {age:.1f} s ago")
    for a in alerts:
        lines.append(f"  [{a.severity.upper()}] {a.kind}: {a.message}")
        lines += [f"      | {ln}" for ln in a.log_tail[-8:]] if a.kind in ("crash", "nan") else []
    return "\n".join(lines)
