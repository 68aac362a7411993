"""Strict configs (docs/lessons.md#strict-config): every kind of mistake is a ConfigError that names the
key and the file; every shipped config loads and builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from nsa.config import ConfigError, load_config
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
