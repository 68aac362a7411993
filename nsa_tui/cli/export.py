"""A run's metrics in the files other tools open: CSV and TensorBoard event files.

Where it runs: on this machine (the panel's side), from the metrics the host's agent sends
(``read_log`` of metrics.jsonl, every line). Why not on the host with torch's writer: the
panel-side install has no torch, and a host needs nothing extra this way; the event files
are written here with ``tensorboardX`` (``pip install 'nsa-tui[export]'``), or
``torch.utils.tensorboard`` where torch and tensorboard are installed. W&B: ``wandb sync
--sync-tensorboard DIR`` uploads the TensorBoard export (offline until then).

Series are the ones the panel charts (``nsa.contract.series.metric_values``): the train
line's loss, lr, grad norm, tokens/s, step time, tokens, memory and gate shares (tags
``train/<name>``), the validation loss (``eval/val_loss``); x is the optimizer step and the
wall time is the trainer's. A NaN loss stays NaN.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nsa.contract import EpochMetric, EvalMetric, Metric, RunInfo, TrainMetric
from nsa.contract.series import metric_values


class ExportError(Exception):
    """An export that cannot be written (a missing writer, an unwritable place)."""


def _kind(m: Metric) -> str:
    return "train" if isinstance(m, TrainMetric) else "eval" if isinstance(m, EvalMetric) else "epoch"


def rows(metrics: Sequence[Metric]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, one dict per metrics line): kind, step, ts, every series seen, epoch message."""
    columns = ["kind", "step", "ts"]
    out = []
    for m in metrics:
        row: dict[str, Any] = {"kind": _kind(m), "step": m.step, "ts": m.ts}
        for name, value in metric_values(m):
            if name not in columns:
                columns.append(name)
            row[name] = value
        if isinstance(m, EpochMetric):
            row.update(epoch=m.epoch, split=m.split, message=m.message)
        out.append(row)
    if any(r["kind"] == "epoch" for r in out):
        columns += ["epoch", "split", "message"]
    return columns, out


def write_csv(metrics: Sequence[Metric], path: Path) -> Path:
    """One row per metrics line (empty cells where a line has no such value)."""
    columns, table = rows(metrics)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in table:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})
    return path


def _summary_writer(logdir: Path) -> Any:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package too
        except ImportError:
            raise ExportError("a TensorBoard export needs tensorboardX: pip install 'nsa-tui[export]' "
                              "(or torch with tensorboard)") from None
    return SummaryWriter(logdir=str(logdir))


def write_tensorboard(metrics: Sequence[Metric], info: RunInfo | None, logdir: Path) -> Path:
    """Event files in ``logdir`` (one run: point TensorBoard at the parent to compare runs)."""
    logdir.mkdir(parents=True, exist_ok=True)
    writer = _summary_writer(logdir)
    try:
        if info is not None:
            writer.add_text("run/config", "```\n" + json.dumps(info.config or {}, indent=1, sort_keys=True)
                            + "\n```", global_step=0)
            facts = {"run_id": info.run_id, "name": info.name, "params": info.param_count,
                     "world_size": info.world_size, "global_batch": info.global_batch,
                     "seq_len": info.seq_len, "parent_run": info.parent_run, "status": info.status.value}
            writer.add_text("run/info", "\n".join(f"- {k}: {v}" for k, v in facts.items()), global_step=0)
        for m in metrics:
            kind = _kind(m)
            if kind == "epoch":
                continue
            for name, value in metric_values(m):
                writer.add_scalar(f"{kind}/{name}", value, global_step=m.step, walltime=m.ts)
        writer.flush()
    finally:
        writer.close()
    return logdir
