"""Strict, typed run configuration loaded from YAML.

Why strict: an earlier code base silently ignored misspelt keys and silently loaded
a toy default config (docs/lessons.md#no-silent-default). Here every key must be known, every value must
have the declared type and lie within the bounds declared with it, required values must be
present, and there is no default config at all: ``load_config`` needs a path.

The schema is declarative: typed dataclass sections whose annotations carry each key's
bounds (``msgspec.Meta``), and a ``relations`` method per section for rules between keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union

import msgspec
import yaml
from msgspec import Meta

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # a section: a dataclass


class ConfigError(ValueError):
    """A config file or override is wrong; the message names key, file and expectation."""


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
    heartbeat_interval_s: PosFloat = 2.0

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


class Origin:
    """Where a config's values came from, for error messages: ``path:line`` of the user's own
    file (``name``: the path as the user gave it, also for a file uploaded to a host under a
    temporary name), or the ``--set`` item that put the value there."""

    def __init__(self, name: str, lines: dict[str, int] | None = None, sets: dict[str, str] | None = None):
        self.name = name
        self.lines = lines or {}
        self.sets = sets or {}

    def __str__(self) -> str:
        return self.name

    def at(self, key: str | None) -> str:
        """The place to blame for ``key`` (dotted, e.g. ``train.steps`` or ``data.paths[0]``)."""
        if not key:
            return self.name
        key = re.sub(r"\[\d+\]", "", key)
        for dotted, item in self.sets.items():
            if key == dotted or key.startswith(dotted + "."):
                return f"--set {item} (over {self.name})"
        parts = key.split(".")
        while parts:  # the key's own line, else its section's (a missing key)
            line = self.lines.get(".".join(parts))
            if line is not None:
                return f"{self.name}:{line}"
            parts.pop()
        return self.name


def key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line of that key in a YAML document (nested mappings)."""
    out: dict[str, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return out

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                dotted = f"{prefix}.{k.value}" if prefix else str(k.value)
                out[dotted] = k.start_mark.line + 1
                walk(v, dotted)

    walk(root, "")
    return out


def yaml_error(name: str, exc: yaml.YAMLError) -> ConfigError:
    """A YAML syntax error as ``path:line:column: problem`` (PyYAML says ``"<unicode string>"``)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
    return ConfigError(f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else ""))


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
        raise ConfigError(f"{where}: expected a mapping at the top level, got {_kind(raw)}")
    origin = Origin(where, key_lines(text))
    for item in overrides:
        _apply_override(raw, item, origin)
    cfg = _build(Config, raw, "", origin)
    cfg.source_path = str(p.resolve())
    return cfg


def build_section(cls: type[T], raw: Any, where: str | Origin, prefix: str = "") -> T:
    """A dataclass ``cls`` from parsed YAML with this module's strictness (unknown keys, wrong
    types and values out of bounds are errors naming ``where``, the key and what was expected).
    Other files with a schema (nsa-tui's settings.yaml) use it too; an ``Origin`` with the file's key lines
    (``Origin(path, key_lines(text))``) makes the errors name the line too."""
    return _build(cls, raw, prefix, where if isinstance(where, Origin) else Origin(where))


def config_from_dict(raw: dict[str, Any], where: str = "<dict>") -> Config:
    """Build and validate a config from an already-parsed mapping (checkpoints, tests)."""
    raw = dict(raw)
    source = raw.pop("source_path", "")
    cfg = _build(Config, raw, "", Origin(where))
    cfg.source_path = source or ""
    return cfg


def known_keys() -> dict[str, str]:
    """Every key a config (or ``--set``) may set, dotted, with its type and default in words:
    what the panel's ``--set`` field completes."""
    out: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get("internal"):
                continue
            key = f"{prefix}.{f.name}" if prefix else f.name
            tp = hints[f.name]
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                walk(tp, key)
                continue
            if f.default is not dataclasses.MISSING:
                default = f"default {f.default!r}"
            elif f.default_factory is not dataclasses.MISSING:
                default = f"default {f.default_factory()!r}"
            else:
                default = "required"
            out[key] = f"{_type_name(tp)}, {default}"

    walk(Config, "")
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain data (for run.json, checkpoints and the panel)."""
    return dataclasses.asdict(cfg)


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``"a.b.c=value"`` into (["a", "b", "c"], parsed value)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    key, _, value = item.partition("=")
    parts = [k.strip() for k in key.split(".")]
    if not all(parts):
        raise ConfigError(f"--set {item!r}: empty key part in {key!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def _apply_override(raw: dict[str, Any], item: str, origin: Origin) -> None:
    parts, value = parse_override(item)
    node = raw
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            dotted = ".".join(parts[: i + 1])
            raise ConfigError(f"--set {item} (over {origin}): {dotted} is not a section")
        node = nxt
    node[parts[-1]] = value
    origin.sets[".".join(parts)] = item


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Annotated:  # the bounds are worded where they fail (_bounds)
        return _type_name(typing.get_args(tp)[0])
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping (section)"
    return getattr(tp, "__name__", str(tp))


class _Mismatch(ConfigError):
    """A value of the wrong type: a union tries its next member; any other error is final."""


def _build(cls: type[T], raw: Any, prefix: str, where: Origin) -> T:
    """A section from a mapping: unknown keys, missing keys, types and bounds (the fields'
    annotations), then the section's ``relations``; every error names the key and its place."""
    label = prefix or "<top level>"
    if not isinstance(raw, dict):
        raise _Mismatch(f"{where.at(prefix)}: {label}: expected a mapping (section), got {_kind(raw)}")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{where.at(key)}: unknown key {key!r}{hint}; known keys of {label}: {', '.join(sorted(fields))}"
        )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(
                    f"{where.at(prefix)}: missing required key {key!r} (expected {_type_name(hints[name])})"
                )
            continue
        kwargs[name] = _coerce(hints[name], raw[name], key, where)
    section = cls(**kwargs)
    relations = getattr(section, "relations", None)
    for holds, rel_key, expected in relations() if relations is not None else ():
        if not holds:
            key = f"{prefix}.{rel_key}" if prefix else rel_key
            value = _lookup(section, rel_key)
            raise ConfigError(f"{where.at(key)}: key {key!r}: expected {expected}, got {value!r}")
    return section


def _lookup(section: object, dotted: str) -> Any:
    for part in dotted.split("."):
        section = getattr(section, part)
    return section


def _coerce(tp: Any, value: Any, key: str, where: Origin) -> Any:
    """``value`` as type ``tp``. Sections, unions and lists are walked here, so an error names
    the innermost key; msgspec checks the leaves (strictly: no "1" for 1, no 1 for true) and
    the bounds. A wrong type raises ``_Mismatch``, a value out of bounds a plain ConfigError."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *extras = typing.get_args(tp)
        out = _coerce(base, value, key, where)
        for meta in extras:  # one by one, so that the error words the bound that failed
            try:
                msgspec.convert(out, Annotated[base, meta], strict=True)
            except msgspec.ValidationError:
                raise ConfigError(f"{where.at(key)}: key {key!r}: expected {_bounds(meta, base)}, "
                                  f"got {out!r}") from None
        return out
    bad = _Mismatch(f"{where.at(key)}: key {key!r}: expected {_type_name(tp)}, "
                    f"got {value!r} ({_kind(value)})")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, key, where)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for arg in typing.get_args(tp):
            try:
                return _coerce(arg, value, key, where)
            except _Mismatch:
                pass
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        (item_tp,) = typing.get_args(tp)
        return [_coerce(item_tp, v, f"{key}[{i}]", where) for i, v in enumerate(value)]
    if tp is float and isinstance(value, str):  # YAML reads "3e-4" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            raise bad from None
    try:
        return msgspec.convert(value, tp, strict=True)
    except msgspec.ValidationError:
        raise bad from None


def _bounds(meta: msgspec.Meta, base: Any) -> str:
    """A field's bounds in words: its ``description``, else one of the forms the schema uses
    (tests/test_config.py checks that every bound in the schema is one of them)."""
    if meta.description:
        return meta.description
    if meta.ge == 0 and meta.lt is not None:
        return f"a number in [0, {meta.lt:g})"
    noun = "integer" if base is int else "number"
    return f"a positive {noun}" if meta.gt == 0 else f"a non-negative {noun}"


def validate(cfg: Config, where: Origin) -> None:
    """Check an already-built config again: every bound and relation, as loading does (a
    config changed in code, e.g. by ``dataclasses.replace``, gets the loader's errors)."""
    raw = to_dict(cfg)
    raw.pop("source_path", None)
    _build(Config, raw, "", where)
