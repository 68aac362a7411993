"""Strict configs (docs/lessons.md#strict-config): every kind of mistake is a ConfigError that names the
key and the file; every shipped config loads and builds."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import msgspec
import pytest
import torch
import yaml

from nsa.config import Config, ConfigError, Origin, known_keys, load_config, validate
from nsa.config import to_dict as config_to_dict
from nsa.model import build_model

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(CONFIGS.glob("*.yaml"))


def _write(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load((CONFIGS / "tiny-cpu.yaml").read_text())
    mutate(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _error(path: Path, overrides=()) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(path, overrides)
    return str(exc.value)


def test_unknown_key(tmp_path: Path) -> None:
    path = _write(tmp_path, lambda r: r["model"]["attention"].update(windw=64))
    msg = _error(path)
    assert "model.attention.windw" in msg and str(path) in msg and "known keys" in msg
    path = _write(tmp_path, lambda r: r["train"].update(max_grad_norm=1.0))  # a key another code base used
    assert "train.max_grad_norm" in _error(path)


def test_wrong_type(tmp_path: Path) -> None:
    path = _write(tmp_path, lambda r: r["model"].update(dim="128"))
    msg = _error(path)
    assert "model.dim" in msg and str(path) in msg and "int" in msg
    path = _write(tmp_path, lambda r: r["model"]["attention"].update(kind="sparse"))
    msg = _error(path)
    assert "model.attention.kind" in msg and "'nsa'" in msg
    path = _write(tmp_path, lambda r: r["model"].update(tie_embeddings=1))
    assert "model.tie_embeddings" in _error(path)


def test_missing_required(tmp_path: Path) -> None:
    path = _write(tmp_path, lambda r: r["model"].pop("n_heads"))
    msg = _error(path)
    assert "missing" in msg and "model.n_heads" in msg and str(path) in msg
    path = _write(tmp_path, lambda r: r["model"].pop("attention"))
    assert "model.attention" in _error(path)


def test_bad_values(tmp_path: Path) -> None:
    path = _write(tmp_path, lambda r: r["model"]["attention"].update(compress_block=12))  # not % stride 8
    msg = _error(path)
    assert "model.attention.compress_block" in msg and str(path) in msg
    path = _write(tmp_path, lambda r: r["model"]["attention"].update(num_selected=2))  # < 1 + 2
    assert "model.attention.num_selected" in _error(path)
    path = _write(tmp_path, lambda r: r["model"].update(n_kv_heads=3))
    assert "model.n_kv_heads" in _error(path)



@pytest.mark.parametrize("key,value", [("grad_clip", -1.0), ("weight_decay", -0.1), ("beta1", 1.0),
                                       ("beta2", -0.5), ("pg_timeout_s", 0)])
def test_bad_optimizer_values(tmp_path: Path, key: str, value: float) -> None:
    """A negative clip used to disable clipping silently; these are errors, by name."""
    path = _write(tmp_path, lambda r: r["train"].update({key: value}))
    msg = _error(path)
    assert f"train.{key}" in msg and str(path) in msg

def test_bad_overrides() -> None:
    path = CONFIGS / "tiny-cpu.yaml"
    for override, key in [
        ("train.stepz=5", "train.stepz"),  # unknown key
        ("train.steps=many", "train.steps"),  # wrong type
        ("model.attention.window=-1", "model.attention.window"),  # bad value
        ("model.dim.x=1", "model.dim"),  # not a section
    ]:
        msg = _error(path, [override])
        assert key in msg and str(path) in msg, (override, msg)
    assert "section.key=value" in _error(path, ["train.steps"])
    ok = load_config(path, ["train.steps=7", "model.attention.window=32"])
    assert ok.train.steps == 7 and ok.model.attention.window == 32


def test_no_default_config() -> None:
    with pytest.raises(ConfigError):
        load_config("")
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(CONFIGS / "nope.yaml")


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_configs_load_and_build(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.source_path == str(path.resolve())
    with torch.device("meta"):
        model = build_model(cfg.model)
    tokens = torch.zeros(1, 5, dtype=torch.long, device="meta")
    assert model(tokens).shape == (1, 5, cfg.model.vocab_size)


def test_errors_name_the_users_file_and_line(tmp_path: Path) -> None:
    """A YAML error says path:line:column, not PyYAML's "<unicode string>"; a wrong key says the
    line it is on; a copy (an upload's temporary file) is named by the user's own path."""
    path = tmp_path / "mine.yaml"
    path.write_text("name: x\nmodel:\n  dim: 1\n  n_layers: 2: 3\ntrain: {}\n")
    msg = _error(path)
    assert msg.startswith(f"{path}:4:") and "not valid YAML" in msg and "<unicode string>" not in msg
    text = (CONFIGS / "tiny-cpu.yaml").read_text().replace("  n_layers: 4", "  n_layer: 4")
    path.write_text(text)
    line = text.splitlines().index("  n_layer: 4") + 1
    msg = _error(path)
    assert msg.startswith(f"{path}:{line}: unknown key 'model.n_layer' (did you mean 'n_layers'?)"), msg
    copy = tmp_path / ".upload-qvxtwcp1.yaml"
    copy.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(copy, shown_as="configs/mine.yaml")
    msg = str(exc.value)
    assert msg.startswith(f"configs/mine.yaml:{line}: unknown key") and ".upload" not in msg
    path.write_text(text.replace("n_layer: 4", "n_layers: 4").replace("  dim: 128", "  dim: big"))
    assert _error(path).startswith(f"{path}:{text.splitlines().index('  dim: 128') + 1}: key 'model.dim'")


def test_an_override_error_says_it_came_from_set(tmp_path: Path) -> None:
    path = CONFIGS / "tiny-cpu.yaml"
    msg = _error(path, ["train.stepz=5"])
    assert msg.startswith(f"--set train.stepz=5 (over {path}): unknown key 'train.stepz'"), msg
    msg = _error(path, ["model.attention.window=-1"])
    assert msg.startswith(f"--set model.attention.window=-1 (over {path}): key 'model.attention.window'"), msg
    # a file's own error stays the file's when another key is overridden
    bad = _write(tmp_path, lambda r: r["model"].update(n_kv_heads=3))
    line = bad.read_text().splitlines().index("  n_kv_heads: 3") + 1
    assert _error(bad, ["train.steps=5"]).startswith(f"{bad}:{line}: key 'model.n_kv_heads'")


# ----------------------------------------------------------------- the declarative schema


def _bounded_keys() -> list[tuple[str, type, list[msgspec.Meta]]]:
    """Every key whose annotation carries bounds: (dotted key, base type, its Metas)."""
    out = []

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            if f.metadata.get("internal"):
                continue
            key, tp = f"{prefix}{f.name}", hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, key + ".")
                continue
            for arg in (tp, *typing.get_args(tp)):  # the type itself, or a member of its union
                if typing.get_origin(arg) is typing.Annotated:
                    base, *metas = typing.get_args(arg)
                    out.append((key, base, [m for m in metas if isinstance(m, msgspec.Meta)]))

    walk(Config, "")
    return out


BOUNDED = _bounded_keys()


def _outside(meta: msgspec.Meta, base: type) -> object:
    """A value of type ``base`` that breaks ``meta`` (and only the bound ``meta`` states)."""
    if meta.multiple_of is not None:
        return base(meta.multiple_of * 8 + 1)
    if meta.gt is not None:
        return base(meta.gt)
    if meta.lt is not None:
        return base(meta.lt)
    if meta.le is not None:
        return base(meta.le + 1)
    assert meta.ge is not None
    return base(meta.ge - 1)


def test_every_bound_is_worded() -> None:
    """An error says the bound in words: each Meta has a description or one of the forms that
    nsa.config words itself (positive, non-negative, [0, hi))."""
    assert len(BOUNDED) > 30
    for key, _base, metas in BOUNDED:
        assert metas, key
        for meta in metas:
            assert meta.description or meta.gt == 0 or (meta.ge == 0 and meta.le is None), (key, meta)
            assert not (meta.description and meta.description[0].isupper()), key


@pytest.mark.parametrize("key,base,metas", BOUNDED, ids=[k for k, _, _ in BOUNDED])
def test_every_declared_bound_is_enforced_by_name(key: str, base: type, metas: list[msgspec.Meta]) -> None:
    """A bound stated in the annotation is checked on load, blamed on its key and the --set item,
    and msgspec, reading the same annotation, rejects the value too."""
    path = CONFIGS / "tiny-cpu.yaml"
    for meta in metas:
        value = _outside(meta, base)
        item = f"{key}={value}"
        msg = _error(path, [item])
        assert msg.startswith(f"--set {item} (over {path}): key {key!r}: expected "), msg
        raw = config_to_dict(load_config(path))
        raw.pop("source_path")
        section, _, leaf = key.rpartition(".")
        node = raw
        for part in section.split("."):
            node = node[part]
        node[leaf] = value
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(raw, Config, strict=True)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_msgspec_reads_the_same_schema(path: Path) -> None:
    """The loader and msgspec agree: a loaded config converts back through msgspec unchanged."""
    cfg = load_config(path)
    raw = config_to_dict(cfg)
    raw.pop("source_path")
    again = msgspec.convert(raw, Config, strict=True)
    again.source_path = cfg.source_path
    assert again == cfg


def test_validate_checks_a_config_changed_in_code() -> None:
    """A config built in code (dataclasses.replace) gets the loader's errors from validate()."""
    cfg = load_config(CONFIGS / "tiny-cpu.yaml")
    validate(cfg, Origin("mine"))
    bad = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, beta1=1.0))
    with pytest.raises(ConfigError, match=r"^mine: key 'train.beta1': expected a number in \[0, 1\), got 1"):
        validate(bad, Origin("mine"))
    bad = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_kv_heads=3))
    with pytest.raises(ConfigError, match=r"^mine: key 'model.n_kv_heads': expected a divisor of model"):
        validate(bad, Origin("mine"))


def test_known_keys_name_the_type_not_the_annotation() -> None:
    """Bounds do not leak into the --set field's completions: they read as before."""
    keys = known_keys()
    assert keys["train.steps"] == "int, required"
    assert keys["model.attention.window"] == "int, default 512"
    assert keys["debug.hang_at_step"] == "int or null, default None"
    assert keys["train.beta1"] == "float, default 0.9"
