"""Long-context evaluation records: passkey retrieval and loss by position (eval/passkey.jsonl).

One line per evaluation of one checkpoint, appended by whoever ran it (``nsa-tui eval``'s
worker, or rank 0 during training when the config's ``eval`` section asks). The same record
is the ``eval_done`` event of the agent's ``eval`` stream, and the ``evals`` op serves the
file's lines. docs/run-directory.md and docs/inference.md describe them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from nsa.contract.io import JsonlWriter, LineStats, decode_lines
from nsa.contract.records import Record
from nsa.contract.rundir import EVAL_PASSKEY_JSONL


class LossBucket(Record, kw_only=True):
    """Mean next-token loss (nats) over the positions ``[start, end)`` of held-out text."""

    start: int
    end: int
    loss: float
    tokens: int  # predictions averaged


class PasskeyEval(Record, kw_only=True):
    """One evaluation. ``accuracy[i][j]``: the share of ``trials`` prompts of ``lengths[i]``
    tokens with the key at ``depths[j]`` answered exactly (``hits`` the counts). Lengths
    above ``trained_context`` (the run's train.seq_len) are listed in ``beyond_context``:
    the model never saw positions that far during training."""

    ts: float
    run: str
    step: int  # the checkpoint's (or the training step, for periodic evaluation)
    checkpoint: str  # step-N; "" for a periodic evaluation (the weights at ``step``, in training)
    kind: Literal["passkey"] = "passkey"
    origin: Literal["cli", "train"] = "cli"
    attention: str = ""  # "nsa" | "dense": what is compared across runs
    device: str = "cpu"
    seed: int = 0
    digits: int = 5
    trials: int = 1
    trained_context: int = 0
    lengths: list[int] = []
    depths: list[float] = []
    beyond_context: list[int] = []
    accuracy: list[list[float]] = []  # [len(lengths)][len(depths)]
    hits: list[list[int]] = []
    loss_buckets: list[LossBucket] = []
    loss_length: int = 0  # tokens per held-out sequence
    loss_sequences: int = 0
    loss_source: str = ""  # "val" (the run's own validation split) | "filler" (no data source here)
    seconds: float = 0.0


class EvalStart(Record, kw_only=True):
    """``eval``: the checkpoint is loaded and evaluation begins (``total``: prompts + loss
    sequences, the unit of ``EvalProgress.done``)."""

    run: str
    checkpoint: str
    step: int
    device: str
    seed: int
    trained_context: int
    lengths: list[int]
    depths: list[float]
    trials: int
    total: int


class EvalProgress(Record, kw_only=True):
    """``eval``: ``done`` of ``total`` prompts and sequences; what was just evaluated."""

    done: int
    total: int
    part: Literal["passkey", "loss"]
    length: int
    depth: float | None = None
    correct: int = 0  # of the passkey prompts done so far at this length
    seconds: float = 0.0


class EvalList(Record, kw_only=True):
    """``evals``: a run's evaluation records, oldest first (``bad_lines``: skipped)."""

    evals: list[PasskeyEval]
    bad_lines: int = 0


def append_eval(run_dir: Path, record: PasskeyEval) -> None:
    """Append one record to the run's eval/passkey.jsonl (one write of one line; the
    directory is created private)."""
    w = JsonlWriter(run_dir / EVAL_PASSKEY_JSONL)
    try:
        w.write(record)
    finally:
        w.close()


def read_evals(run_dir: Path) -> EvalList:
    """Every record of the run's eval/passkey.jsonl, oldest first (none: an empty list)."""
    stats = LineStats()
    try:
        lines = (run_dir / EVAL_PASSKEY_JSONL).read_bytes().splitlines()
    except FileNotFoundError:
        return EvalList(evals=[])
    evals = list(decode_lines(lines, PasskeyEval, stats))
    return EvalList(evals=evals, bad_lines=stats.bad)
