"""Strict, typed run configuration loaded from YAML.

Why strict: an earlier code base silently ignored misspelt keys and silently loaded
a toy default config (docs/lessons.md#no-silent-default). Here every key must be known, every value must
have the declared type and lie within the bounds declared with it, required values must be
present, and there is no default config at all: ``load_config`` needs a path.

The schema is declarative: typed dataclass sections whose annotations carry each key's
bounds (``msgspec.Meta``), and a ``relations`` method per section for rules between keys.
This module is the schema and its front door (``load_config``); reading a dataclass from YAML
with that strictness, and wording its errors, is ``nsa.typedyaml``'s job.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from msgspec import Meta

from nsa.typedyaml import (
    ConfigError,
    Origin,
    apply_override,
    build_section,
    key_lines,
    keys_of,
    kind,
    yaml_error,
)

__all__ = ["AttentionConfig", "Config", "ConfigError", "DataConfig", "DebugConfig", "FailurePolicy",
           "ModelConfig", "Origin", "TrainConfig", "config_from_dict", "known_keys", "load_config",
           "to_dict", "validate"]


# --------------------------------------------------------------------------- schema
#
# A value's type and its own bounds live in its annotation (``msgspec.Meta``: gt, ge, lt,
# multiple_of; ``description`` words the expectation when the bounds alone would not say
# why); relations between values are each section's ``relations``. The loader reads both, so
# a bound is stated once, next to the key, and every error names that key.

PosInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
PosFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0, description="a positive number of seconds")]
Beta = Annotated[float, Meta(ge=0, lt=1)]

Relation = tuple[bool, str, str]
"""One relation between values: (holds, key relative to the section, what was expected)."""


@dataclass
class AttentionConfig:
    """Attention of every layer. ``kind`` picks NSA or the dense SDPA baseline.

    NSA hyperparameters follow the paper's names: compression block l, stride d,
    selection block l', n selected blocks (including initial and local ones), window w.
    """

    kind: Literal["nsa", "dense"]
    backend: Literal["auto", "reference", "triton"] = "auto"
    compress_block: PosInt = 32  # l
    compress_stride: PosInt = 16  # d
    compress_mode: Literal["mlp", "avgpool"] = "mlp"
    select_block: PosInt = 64  # l'
    num_selected: PosInt = 16  # n, includes the initial and local blocks
    num_initial: NonNegInt = 1
    num_local: Annotated[int, Meta(ge=1, description="at least 1 local block (the query's own)")] = 2
    window: PosInt = 512  # w

    def relations(self) -> list[Relation]:
        """NSA's block sizes must tile each other; dense attention reads none of them."""
        if self.kind != "nsa":
            return []
        stride, block = self.compress_stride, self.compress_block
        return [
            (block % stride == 0, "compress_block", f"a multiple of compress_stride ({stride})"),
            (self.select_block % stride == 0, "select_block", f"a multiple of compress_stride ({stride})"),
            (self.select_block >= block, "select_block", f"at least compress_block ({block})"),
            (self.num_selected >= self.num_initial + self.num_local, "num_selected",
             f"at least num_initial + num_local ({self.num_initial + self.num_local})"),
        ]


@dataclass
class ModelConfig:
    vocab_size: PosInt
    dim: PosInt
    n_layers: PosInt
    n_heads: PosInt
    n_kv_heads: PosInt
    head_dim: Annotated[PosInt, Meta(multiple_of=2, description="an even number (RoPE)")]
    attention: AttentionConfig
    ffn_hidden: int | None = None  # None: SwiGLU's 8/3 * dim rounded up to 64
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def relations(self) -> list[Relation]:
        """Grouped-query attention shares each KV head among a whole number of query heads."""
        return [(self.n_heads % self.n_kv_heads == 0, "n_kv_heads",
                 f"a divisor of model.n_heads ({self.n_heads})")]


@dataclass
class TrainConfig:
    seq_len: PosInt
    batch_size: PosInt  # per-rank micro-batch, never split across ranks
    steps: PosInt  # optimizer steps
    lr: PosFloat
    min_lr: NonNegFloat
    warmup_steps: NonNegInt
    grad_accum: PosInt = 1
    weight_decay: NonNegFloat = 0.1
    beta1: Beta = 0.9
    beta2: Beta = 0.95
    grad_clip: Annotated[float, Meta(ge=0, description="a non-negative number (0 disables clipping)")] = 1.0
    dtype: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA
    device: Literal["auto", "cpu", "cuda"] = "auto"
    strategy: Literal["ddp", "fsdp"] = "ddp"
    activation_checkpointing: bool = False
    compile: bool = False
    # one process on CUDA: replay each micro-step from a CUDA graph, proved against eager first
    # (nsa/train/graphed.py); elsewhere, or when the proof fails, the log says why and steps run eagerly
    cuda_graph: bool = False
    seed: int = 1337
    save_every: PosInt = 200
    keep_checkpoints: PosInt = 3
    eval_every: PosInt = 100
    eval_batches: NonNegInt = 8
    log_every: PosInt = 1
    # Process-group timeouts by phase (docs/training.md): a peer that stops answering fails the
    # collective after this long. ``pg_timeout_start_s`` covers the rendezvous (torchrun's join
    # timeout), boot, checkpoint load, compile, the first step, every checkpoint save and the
    # first eval; ``pg_timeout_s`` every other collective (steady state).
    pg_timeout_s: Seconds = 300.0
    pg_timeout_start_s: Seconds = 1800.0
    checkpoint_async: bool = True  # write checkpoints in a background thread (DCP async_save)
    # a rank's timer beat comes this often; the alert rules take a stuck rank whose beats lag the
    # others' by 5 s for frozen, so a longer period would make healthy ranks look frozen
    heartbeat_interval_s: Annotated[float, Meta(gt=0), Meta(
        le=4, description="at most 4 seconds (the alert rules take a rank 5 s behind the others "
                          "for frozen)")] = 2.0

    def relations(self) -> list[Relation]:
        """The schedule decays from lr down to min_lr, never up."""
        return [(self.min_lr <= self.lr, "min_lr", f"between 0 and train.lr ({self.lr})")]


@dataclass
class DataConfig:
    source: Literal["fineweb-edu", "files", "stdlib", "synthetic"]
    tokenizer: Literal["byte", "gpt2"] = "byte"
    gpt2_vocab_bpe: str | None = None  # offline GPT-2 BPE files
    gpt2_encoder_json: str | None = None
    paths: list[str] = field(default_factory=list)  # for source=files, globs allowed
    fineweb_name: str = "sample-10BT"
    text_field: str = "text"
    val_every_n_docs: PosInt = 100  # every n-th document goes to validation, never training
    shuffle_buffer: int = 0
    prefetch_batches: int = 4
    seed: int = 0
    # where the batches are made: a thread of the rank, or a process of its own whose Python does
    # not hold the training thread's GIL (nsa/train/loader_process.py); auto: process on CUDA
    loader: Literal["auto", "thread", "process"] = "auto"

    def relations(self) -> list[Relation]:
        """source=files with no paths would train on nothing."""
        return [(self.source != "files" or bool(self.paths), "paths",
                 "at least one path or glob for source=files")]


Fraction = Annotated[float, Meta(ge=0, le=1, description="a fraction between 0 and 1")]
PromptLength = Annotated[int, Meta(ge=32, description="at least 32 tokens (a passkey prompt's fixed part "
                                                      "needs about 30)")]


@dataclass
class EvalConfig:
    """Periodic long-context evaluation during training (docs/inference.md, "Evaluation"):
    every ``every_steps`` steps (and at the last) rank 0 evaluates passkey retrieval at
    ``lengths`` x ``depths`` and the loss by position on the validation split, and appends
    the record to the run directory; the other ranks wait. Off by default (0)."""

    every_steps: NonNegInt = 0
    lengths: list[PromptLength] = field(default_factory=list)  # []: train.seq_len
    depths: list[Fraction] = field(default_factory=lambda: [0.0, 0.5, 1.0])
    trials: PosInt = 2
    loss_sequences: NonNegInt = 2
    buckets: PosInt = 8
    seed: NonNegInt = 0


@dataclass
class DebugConfig:
    """Fault injection for tests of the panel's alerts. Off by default."""

    hang_at_step: NonNegInt | None = None
    hang_rank: NonNegInt | None = None
    crash_at_step: NonNegInt | None = None
    crash_rank: NonNegInt | None = None
    nan_at_step: NonNegInt | None = None
    nan_rank: NonNegInt | None = None  # None: every rank
    slow_data_s: NonNegFloat = 0.0
    stop_at_step: NonNegInt | None = None  # behave as if SIGTERM arrived during this step
    die_in_save_at_step: NonNegInt | None = None  # exit between writing checkpoint step N and committing it
    record_rank_state: bool = False  # debug/rank-R.jsonl: data digests and a final parameter digest


@dataclass
class FailurePolicy:
    """What the host's watchdog does when this run fails (docs/host-agent.md, "Policies").

    ``none``: alert only. ``restart``: after a crash or failure, resume from the newest
    complete checkpoint as a new run linked to this one, at most ``max_restarts`` times in a
    row, waiting ``backoff_s`` doubled per restart. ``fallback``: after a hang or a rank crash,
    stop the run and relaunch it on one GPU (the fallback key, done by the watchdog). ``stop``:
    after a hang, stop the run so its GPUs are free (TERM, KILL after ``grace_s``: a hung rank
    never ends on TERM, and its peers cannot checkpoint without it)."""

    action: Literal["none", "restart", "fallback", "stop"] = "none"
    max_restarts: NonNegInt = 3
    backoff_s: Annotated[float, Meta(ge=0, description="a non-negative number of seconds")] = 30.0
    grace_s: Seconds = 15.0


@dataclass
class Config:
    name: str
    model: ModelConfig
    train: TrainConfig
    data: DataConfig
    debug: DebugConfig = field(default_factory=DebugConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    on_failure: FailurePolicy = field(default_factory=FailurePolicy)
    source_path: str = field(default="", metadata={"internal": True})

    def relations(self) -> list[Relation]:
        """The embedding must hold every id the tokenizer makes; periodic evaluation runs the
        whole model on rank 0, which an FSDP shard cannot."""
        fsdp_eval = (self.eval.every_steps == 0 or self.train.strategy != "fsdp", "eval.every_steps",
                     "0 with train.strategy=fsdp (rank 0 evaluates the whole model; evaluate FSDP runs' "
                     "checkpoints with nsa-tui eval)")
        if self.data.tokenizer == "byte":
            return [(self.model.vocab_size >= 257, "model.vocab_size",
                     "at least 257 for the byte tokenizer (256 bytes + end-of-text)"), fsdp_eval]
        return [(self.model.vocab_size >= 50257, "model.vocab_size", "at least 50257 for the gpt2 tokenizer"),
                fsdp_eval]


# --------------------------------------------------------------------------- loading
# The strict machinery (types, bounds, relations, errors naming file:line) is nsa.typedyaml's.


def load_config(path: str | Path, overrides: typing.Sequence[str] = (),
                shown_as: str | None = None) -> Config:
    """Read ``path`` (YAML), apply ``"section.key=value"`` overrides, validate strictly.
    Errors name ``shown_as`` (the user's own path, when ``path`` is a copy) and the line."""
    if path is None or str(path) == "":
        raise ConfigError("no config given: pass a config file path (there is no default config)")
    p = Path(path)
    where = shown_as or str(p)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read config file ({exc.strerror or exc})") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise yaml_error(where, exc) from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level, got {kind(raw)}")
    origin = Origin(where, key_lines(text))
    for item in overrides:
        apply_override(raw, item, origin)
    cfg = build_section(Config, raw, origin)
    cfg.source_path = str(p.resolve())
    return cfg


def config_from_dict(raw: dict[str, Any], where: str = "<dict>") -> Config:
    """Build and validate a config from an already-parsed mapping (checkpoints, tests)."""
    raw = dict(raw)
    source = raw.pop("source_path", "")
    cfg = build_section(Config, raw, where)
    cfg.source_path = source or ""
    return cfg


def known_keys() -> dict[str, str]:
    """Every key a config (or ``--set``) may set, dotted, with its type and default in words:
    what the panel's ``--set`` field completes."""
    return keys_of(Config)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain data (for run.json, checkpoints and the panel)."""
    return dataclasses.asdict(cfg)


def validate(cfg: Config, where: Origin) -> None:
    """Check an already-built config again: every bound and relation, as loading does (a
    config changed in code, e.g. by ``dataclasses.replace``, gets the loader's errors)."""
    raw = to_dict(cfg)
    raw.pop("source_path", None)
    build_section(Config, raw, where)
