"""The agent protocol's wire: the hello, requests and replies, and the events of subscriptions.

Newline-delimited JSON (docs/agent-protocol.md states the same): the agent's first line is
``{"hello": Hello}``; then the client sends :class:`Request` lines and the agent answers with
:class:`Reply` lines and, for subscriptions, :class:`EventMsg` lines whose ``data`` type is
given by ``event`` (:data:`EVENT_DATA`). What each operation takes is in
``nsa.contract.requests``; what it answers, in ``nsa.contract.replies``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from nsa.contract.appended import StreamPos
from nsa.contract.evals import EvalProgress, EvalStart, PasskeyEval
from nsa.contract.records import (
    Beat,
    HostSample,
    Metric,
    Record,
)
from nsa.contract.replies import AlertList, AlertState, RunView
from nsa.contract.series import MetricsSummary

PROTOCOL = 3  # the agent's protocol version: client and agent must agree


class Hello(Record, kw_only=True):
    """What a client needs first: versions, host, GPUs, where runs live, what is missing."""

    agent: int
    nsa_tui: str
    nsa_version: str | None = None
    host: str = ""
    python: str = ""
    python_exe: str = ""
    torch: str | None = None
    runs_root: str = ""
    gpus: int = 0
    gpu_names: list[str | None] = []
    gpu_message: str = ""
    boot_id: str = ""
    pid: int = 0
    time: float = 0.0
    problems: list[str] = []


class Request(Record, kw_only=True):
    id: int | str | None = None
    op: str
    args: dict[str, Any] = {}


class ErrorInfo(Record, kw_only=True):
    code: str
    message: str


class Reply(Record, kw_only=True):
    id: int | str | None = None
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None


class LogLines(Record, kw_only=True):
    lines: list[str]


class Gap(Record, kw_only=True):
    """Part of a stream was not sent (too old to be worth sending): ``skipped_bytes`` of it
    before this point. The stream continues after it."""

    stream: str
    skipped_bytes: int
    size: int


class Synced(Record, kw_only=True):
    """The subscription's bounded backlog has been sent; ``bad_lines``: malformed lines skipped
    so far, per stream (never fatal)."""

    ts: float
    offsets: dict[str, StreamPos] = {}
    bad_lines: dict[str, int] = {}


class RunsList(Record, kw_only=True):
    runs: list[RunView]


class RunRemoved(Record, kw_only=True):
    run_id: str


class SampleStart(Record, kw_only=True):
    """``sample``: the checkpoint is loaded and generation begins (what it runs on, the prompt's
    token ids: end-of-text first, as a document starts in training)."""

    run: str
    checkpoint: str  # step-N
    step: int
    device: str  # "cpu", "cuda:0", ...
    tokenizer: str  # "byte" | "gpt2"
    seed: int
    prompt_tokens: list[int] = []
    decode_path: str = ""  # "cuda-graph" or "eager (why)": how each token is decoded


class SampleText(Record, kw_only=True):
    """``sample``: new tokens and the text they complete (a character cut between two steps
    comes with the step that ends it)."""

    text: str
    tokens: list[int]


class SampleDone(Record, kw_only=True):
    """``sample``: the whole answer; the stream ends after it. ``stop``: ``eot`` (the model
    ended its document) or ``max_new_tokens``."""

    run: str
    checkpoint: str
    step: int
    device: str
    seed: int
    prompt: str
    prompt_tokens: list[int]
    text: str
    tokens: list[int]
    stop: Literal["eot", "max_new_tokens"]
    seconds: float = 0.0  # loading excluded: prefill and decoding


# event name -> the type of its ``data``
EVENT_DATA: dict[str, Any] = {
    "status": RunView,
    "beats": list[Beat],
    "metrics": list[Metric],
    "summary": MetricsSummary,
    "log": LogLines,
    "gap": Gap,
    "synced": Synced,
    "host": HostSample,
    "runs": RunsList,
    "run": RunView,
    "run_removed": RunRemoved,
    "alerts": AlertList,
    "alert": AlertState,
    "error": ErrorInfo,
    "sample_start": SampleStart,
    "sample_text": SampleText,
    "sample_done": SampleDone,
    "eval_start": EvalStart,
    "eval_progress": EvalProgress,
    "eval_done": PasskeyEval,
}
EventKind = Literal["status", "beats", "metrics", "summary", "log", "gap", "synced", "host", "runs", "run",
                    "run_removed", "alerts", "alert", "error", "sample_start", "sample_text", "sample_done",
                    "eval_start", "eval_progress", "eval_done"]


# events whose offset is a position in their stream's file, from which a later watch resumes
# (``WatchArgs.offsets``); the other events' offsets are sequence numbers
OFFSET_EVENTS = ("beats", "metrics", "log")


class EventMsg(Record, kw_only=True):
    """One event of a subscription: ``id`` is the subscribing request's id; ``offset`` the
    byte offset after the data in its stream's file generation ``gen`` (file streams: a
    rotated or replaced file is a new generation), else a sequence number."""

    id: int | str | None = None
    event: str
    run: str | None = None
    stream: str = ""
    offset: int = 0
    gen: str = ""
    initial: bool = False  # a status sent while the subscription's backlog is still coming
    data: Any = None


class EventEnvelope(Record, kw_only=True):
    """An incoming line, before its data is validated by its event kind."""

    id: int | str | None = None
    event: str | None = None
    run: str | None = None
    stream: str = ""
    offset: int = 0
    gen: str = ""
    initial: bool = False
    data: msgspec.Raw = msgspec.Raw(b"null")
    ok: bool | None = None
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: ErrorInfo | None = None
    hello: msgspec.Raw = msgspec.Raw(b"null")
