"""Typed, strict documents from YAML: dataclasses built from parsed YAML, errors that name the place.

Every key must be known (a near miss is suggested), every value must have the declared type
(msgspec, strictly: no "1" for 1) and lie within the bounds declared in its annotation
(``msgspec.Meta``), required keys must be present, and each section's ``relations`` must
hold. Every error names the file and line, or the ``--set`` item, and the dotted key. The
run config (``nsa.config``) and nsa-tui's settings file use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union

import msgspec
import yaml

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # a section: a dataclass


class ConfigError(ValueError):
    """A config file or override is wrong; the message names key, file and expectation."""


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


def build_section(cls: type[T], raw: Any, where: str | Origin, prefix: str = "") -> T:
    """A dataclass ``cls`` from parsed YAML with this module's strictness (unknown keys, wrong
    types and values out of bounds are errors naming ``where``, the key and what was expected).
    Other files with a schema (nsa-tui's settings.yaml) use it too; an ``Origin`` with the file's key lines
    (``Origin(path, key_lines(text))``) makes the errors name the line too."""
    return _build(cls, raw, prefix, where if isinstance(where, Origin) else Origin(where))


def keys_of(root: type) -> dict[str, str]:
    """Every key a document of dataclass ``root`` may set, dotted, with its type and default in
    words (``nsa.config.known_keys``: what the panel's ``--set`` field completes)."""
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

    walk(root, "")
    return out


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


def apply_override(raw: dict[str, Any], item: str, origin: Origin) -> None:
    """Set ``"a.b.c=value"`` in the parsed document ``raw``; ``origin`` remembers which item set it."""
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


def kind(value: Any) -> str:
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
        raise _Mismatch(f"{where.at(prefix)}: {label}: expected a mapping (section), got {kind(raw)}")
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
                    f"got {value!r} ({kind(value)})")
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
