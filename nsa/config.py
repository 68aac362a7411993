"""Strict, typed run configuration loaded from YAML.

Why strict: an earlier code base silently ignored misspelt keys and silently loaded
a toy default config (docs/lessons.md#no-silent-default). Here every key must be known, every value must
have the declared type, required values must be present, and there is no default
config at all: ``load_config`` needs a path.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

import yaml

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # a section: a dataclass


class ConfigError(ValueError):
    """A config file or override is wrong; the message names key, file and expectation."""


# --------------------------------------------------------------------------- schema


@dataclass
class AttentionConfig:
    """Attention of every layer. ``kind`` picks NSA or the dense SDPA baseline.

    NSA hyperparameters follow the paper's names: compression block l, stride d,
    selection block l', n selected blocks (including initial and local ones), window w.
    """

    kind: Literal["nsa", "dense"]
    backend: Literal["auto", "reference", "triton"] = "auto"
    compress_block: int = 32  # l
    compress_stride: int = 16  # d
    compress_mode: Literal["mlp", "avgpool"] = "mlp"
    select_block: int = 64  # l'
    num_selected: int = 16  # n, includes the initial and local blocks
    num_initial: int = 1
    num_local: int = 2
    window: int = 512  # w


@dataclass
class ModelConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    attention: AttentionConfig
    ffn_hidden: int | None = None  # None: SwiGLU's 8/3 * dim rounded up to 64
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02


@dataclass
class TrainConfig:
    seq_len: int
    batch_size: int  # per-rank micro-batch, never split across ranks
    steps: int  # optimizer steps
    lr: float
    min_lr: float
    warmup_steps: int
    grad_accum: int = 1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    dtype: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA
    device: Literal["auto", "cpu", "cuda"] = "auto"
    strategy: Literal["ddp", "fsdp"] = "ddp"
    activation_checkpointing: bool = False
    compile: bool = False
    seed: int = 1337
    save_every: int = 200
    keep_checkpoints: int = 3
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 1
    # Process-group timeouts by phase (docs/training.md): a peer that stops answering fails the
    # collective after this long. ``pg_timeout_start_s`` covers the rendezvous (torchrun's join
    # timeout), boot, checkpoint load, compile, the first step, every checkpoint save and the
    # first eval; ``pg_timeout_s`` every other collective (steady state).
    pg_timeout_s: float = 300.0
    pg_timeout_start_s: float = 1800.0
    checkpoint_async: bool = True  # write checkpoints in a background thread (DCP async_save)
    heartbeat_interval_s: float = 2.0


@dataclass
class DataConfig:
    source: Literal["fineweb-edu", "files", "stdlib", "synthetic"]
    tokenizer: Literal["byte", "gpt2"] = "byte"
    gpt2_vocab_bpe: str | None = None  # offline GPT-2 BPE files
    gpt2_encoder_json: str | None = None
    paths: list[str] = field(default_factory=list)  # for source=files, globs allowed
    fineweb_name: str = "sample-10BT"
    text_field: str = "text"
    val_every_n_docs: int = 100  # every n-th document goes to validation, never training
    shuffle_buffer: int = 0
    prefetch_batches: int = 4
    seed: int = 0


@dataclass
class DebugConfig:
    """Fault injection for tests of the panel's alerts. Off by default."""

    hang_at_step: int | None = None
    hang_rank: int | None = None
    crash_at_step: int | None = None
    crash_rank: int | None = None
    nan_at_step: int | None = None
    nan_rank: int | None = None  # None: every rank
    slow_data_s: float = 0.0
    stop_at_step: int | None = None  # behave as if SIGTERM arrived during this step
    die_in_save_at_step: int | None = None  # exit between writing checkpoint step N and committing it
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
    max_restarts: int = 3
    backoff_s: float = 30.0
    grace_s: float = 15.0


@dataclass
class Config:
    name: str
    model: ModelConfig
    train: TrainConfig
    data: DataConfig
    debug: DebugConfig = field(default_factory=DebugConfig)
    on_failure: FailurePolicy = field(default_factory=FailurePolicy)
    source_path: str = field(default="", metadata={"internal": True})


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
    validate(cfg, origin)
    return cfg


def build_section(cls: type[T], raw: Any, where: str | Origin, prefix: str = "") -> T:
    """A dataclass ``cls`` from parsed YAML with this module's strictness (unknown keys and
    wrong types are errors naming ``where``, the key and the expected type). Other files with
    a schema (nsa-tui's settings.yaml) use it too; an ``Origin`` with the file's key lines
    (``Origin(path, key_lines(text))``) makes the errors name the line too."""
    return _build(cls, raw, prefix, where if isinstance(where, Origin) else Origin(where))


def config_from_dict(raw: dict[str, Any], where: str = "<dict>") -> Config:
    """Build and validate a config from an already-parsed mapping (checkpoints, tests)."""
    raw = dict(raw)
    source = raw.pop("source_path", "")
    cfg = _build(Config, raw, "", Origin(where))
    cfg.source_path = source or ""
    validate(cfg, Origin(where))
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


def _build(cls: type[T], raw: Any, prefix: str, where: Origin) -> T:
    label = prefix or "<top level>"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where.at(prefix)}: {label}: expected a mapping (section), got {_kind(raw)}")
    hints = typing.get_type_hints(cls)
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
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str, where: Origin) -> Any:
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{where.at(key)}: key {key!r}: expected {_type_name(tp)}, "
                      f"got {value!r} ({_kind(value)})")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, key, where)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key, where)
            except ConfigError:
                pass
        raise bad
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        (item_tp,) = typing.get_args(tp)
        return [_coerce(item_tp, v, f"{key}[{i}]", where) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    raise ConfigError(f"{where.at(key)}: key {key!r}: unsupported type {tp!r}")  # schema bug


# --------------------------------------------------------------------------- semantics


def _require(cond: bool, where: Origin, key: str, expected: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{where.at(key)}: key {key!r}: expected {expected}, got {value!r}")


def validate(cfg: Config, where: Origin) -> None:
    """Relations between values that types alone cannot express."""
    m, a, t, d = cfg.model, cfg.model.attention, cfg.train, cfg.data
    for key, value in [
        ("model.vocab_size", m.vocab_size),
        ("model.dim", m.dim),
        ("model.n_layers", m.n_layers),
        ("model.n_heads", m.n_heads),
        ("model.n_kv_heads", m.n_kv_heads),
        ("model.head_dim", m.head_dim),
        ("train.seq_len", t.seq_len),
        ("train.batch_size", t.batch_size),
        ("train.grad_accum", t.grad_accum),
        ("train.steps", t.steps),
        ("train.save_every", t.save_every),
        ("train.keep_checkpoints", t.keep_checkpoints),
        ("train.eval_every", t.eval_every),
        ("train.log_every", t.log_every),
        ("data.val_every_n_docs", d.val_every_n_docs),
    ]:
        _require(value > 0, where, key, "a positive integer", value)
    _require(m.n_heads % m.n_kv_heads == 0, where, "model.n_kv_heads",
             f"a divisor of model.n_heads ({m.n_heads})", m.n_kv_heads)
    _require(m.head_dim % 2 == 0, where, "model.head_dim", "an even number (RoPE)", m.head_dim)
    _require(t.warmup_steps >= 0, where, "train.warmup_steps", "a non-negative integer", t.warmup_steps)
    _require(t.lr > 0, where, "train.lr", "a positive number", t.lr)
    _require(0 <= t.min_lr <= t.lr, where, "train.min_lr", f"between 0 and train.lr ({t.lr})", t.min_lr)
    _require(t.eval_batches >= 0, where, "train.eval_batches", "a non-negative integer", t.eval_batches)
    _require(t.grad_clip >= 0, where, "train.grad_clip", "a non-negative number (0 disables clipping)",
             t.grad_clip)
    _require(t.weight_decay >= 0, where, "train.weight_decay", "a non-negative number", t.weight_decay)
    for key, beta in (("train.beta1", t.beta1), ("train.beta2", t.beta2)):
        _require(0 <= beta < 1, where, key, "a number in [0, 1)", beta)
    _require(t.pg_timeout_s > 0, where, "train.pg_timeout_s", "a positive number of seconds", t.pg_timeout_s)
    _require(t.pg_timeout_start_s > 0, where, "train.pg_timeout_start_s", "a positive number of seconds",
             t.pg_timeout_start_s)
    _require(t.heartbeat_interval_s > 0, where, "train.heartbeat_interval_s", "a positive number",
             t.heartbeat_interval_s)
    if d.tokenizer == "byte":
        _require(m.vocab_size >= 257, where, "model.vocab_size",
                 "at least 257 for the byte tokenizer (256 bytes + end-of-text)", m.vocab_size)
    else:
        _require(m.vocab_size >= 50257, where, "model.vocab_size",
                 "at least 50257 for the gpt2 tokenizer", m.vocab_size)
    if d.source == "files":
        _require(bool(d.paths), where, "data.paths", "at least one path or glob for source=files",
                 d.paths)
    if a.kind == "nsa":
        _require(a.compress_block > 0 and a.compress_stride > 0, where, "model.attention.compress_stride",
                 "positive compress_block and compress_stride", a.compress_stride)
        _require(a.compress_block % a.compress_stride == 0, where, "model.attention.compress_block",
                 f"a multiple of compress_stride ({a.compress_stride})", a.compress_block)
        _require(a.select_block % a.compress_stride == 0, where, "model.attention.select_block",
                 f"a multiple of compress_stride ({a.compress_stride})", a.select_block)
        _require(a.select_block >= a.compress_block, where, "model.attention.select_block",
                 f"at least compress_block ({a.compress_block})", a.select_block)
        _require(a.num_initial >= 0 and a.num_local >= 1, where, "model.attention.num_local",
                 "at least 1 local block (the query's own)", a.num_local)
        _require(a.num_selected >= a.num_initial + a.num_local, where, "model.attention.num_selected",
                 f"at least num_initial + num_local ({a.num_initial + a.num_local})", a.num_selected)
        _require(a.window > 0, where, "model.attention.window", "a positive integer", a.window)
    dbg = cfg.debug
    for key, setting in [("debug.hang_at_step", dbg.hang_at_step), ("debug.crash_at_step", dbg.crash_at_step),
                       ("debug.nan_at_step", dbg.nan_at_step), ("debug.stop_at_step", dbg.stop_at_step),
                       ("debug.die_in_save_at_step", dbg.die_in_save_at_step),
                       ("debug.hang_rank", dbg.hang_rank), ("debug.crash_rank", dbg.crash_rank),
                       ("debug.nan_rank", dbg.nan_rank)]:
        if setting is not None:
            _require(setting >= 0, where, key, "a non-negative integer", setting)
    _require(dbg.slow_data_s >= 0, where, "debug.slow_data_s", "a non-negative number", dbg.slow_data_s)
    pol = cfg.on_failure
    _require(pol.max_restarts >= 0, where, "on_failure.max_restarts", "a non-negative integer",
             pol.max_restarts)
    _require(pol.backoff_s >= 0, where, "on_failure.backoff_s", "a non-negative number of seconds",
             pol.backoff_s)
    _require(pol.grace_s > 0, where, "on_failure.grace_s", "a positive number of seconds", pol.grace_s)
