"""How a checkpoint continues on this run: the checks that refuse a resume, and the step's layout
(grad_accum, data streams) and the stream positions it continues from.

Kept apart from the loop (trainer.py) because these are rules, not steps: the global batch stays
what the checkpoint trained with on any world size (``nsa.contract.rundir.grad_accum_for``), a
streamed source is never re-sharded (it has no global document index, so re-sharding would
replay documents, skip others and move validation onto trained documents), and a re-shard never
replays a document. Every refusal is a ``CheckpointError`` naming the value that differs, raised
before any state is loaded. No torch: the rules run without a process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nsa.config import Config, to_dict
from nsa.contract import CheckpointMeta
from nsa.contract.rundir import grad_accum_for
from nsa.train import checkpoint as ckpt
from nsa.train.data import StreamPos, own_streams, positions_from_json, reshard_positions

# Sources read through ``datasets`` streaming: no global document index (see the docstring).
STREAMED_SOURCES = ("files", "fineweb-edu")


@dataclass(frozen=True)
class ResumeLayout:
    """What a step looks like when this run continues the checkpoint."""

    grad_accum: int  # micro-batches per rank per optimizer step (keeps the global batch)
    n_streams: int  # data streams: the checkpoint's, or the world size after a re-shard
    micro_per_stream: int  # micro-batches of each owned stream per step
    old_streams: int  # the checkpoint's stream count
    reshard: bool  # the world size does not divide the checkpoint's streams: new streams
    note: str | None  # said in run.json's ``resume_note`` when the layout changed


def layout(path: Path, meta: CheckpointMeta, cfg: Config, world: int, rank: int) -> ResumeLayout:
    """The layout that continues ``meta`` (read from ``path``) on ``world`` ranks, or a
    ``CheckpointError`` saying why this run cannot continue it."""
    ckpt.check_model_config(path, meta, to_dict(cfg.model))
    for key, saved, mine in (("batch_size", meta.batch_size, cfg.train.batch_size),
                             ("seq_len", meta.seq_len, cfg.train.seq_len)):
        if saved != mine:
            raise ckpt.CheckpointError(f"{path}: saved with train.{key}={saved}, this run has "
                                       f"{mine}; resume needs the same value")
    g, b, w = meta.global_batch, cfg.train.batch_size, world
    accum = grad_accum_for(g, b, w)
    if accum is None:
        raise ckpt.CheckpointError(
            f"{path}: global batch {g} is not a multiple of batch_size {b} x world {w}: "
            "cannot keep the global batch on this world size")
    old_streams = meta.n_streams
    reshard = own_streams(old_streams, w, rank) is None
    if reshard and cfg.data.source in STREAMED_SOURCES:
        raise ckpt.CheckpointError(
            f"{path}: {old_streams} data stream(s) of data.source {cfg.data.source} cannot be re-sharded "
            f"over {w} ranks without replaying documents or mixing validation into training: resume "
            f"on a world size that divides {old_streams}")
    note = None
    if meta.world_size != w or accum != cfg.train.grad_accum:
        note = (f"resuming a {meta.world_size}-rank checkpoint on {w} rank(s): "
                f"grad_accum {meta.grad_accum} -> {accum} keeps the global "
                f"batch of {g} sequences")
    if reshard:
        return ResumeLayout(accum, w, accum, old_streams, True, note)
    # micro-batches of each saved stream per step
    return ResumeLayout(accum, old_streams, g // (b * old_streams), old_streams, False, note)


def positions(meta: CheckpointMeta, plan: ResumeLayout) -> tuple[dict[int, StreamPos], str | None]:
    """Where each stream continues, and, after a re-shard, the line that says what was skipped."""
    saved = positions_from_json(meta.data_positions)
    if not plan.reshard:
        return saved, None
    new = reshard_positions(saved, plan.old_streams, plan.n_streams)
    return new, (f"data: {plan.old_streams} streams cannot be split over {plan.n_streams} ranks; re-sharding "
                 f"into {plan.n_streams} streams starting at document {new[0].doc} of each (nothing "
                 "replayed, the rest of partly read documents skipped)")
