"""The torch-free parameter count (nsa/size.py) equals the real model's, for every shipped config
and a variant of every term it adds up."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsa.config import load_config
from nsa.size import param_count
from nsa.stats import param_count as meta_count

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
VARIANTS = [[], ["model.tie_embeddings=false"], ["model.ffn_hidden=null"], ["model.n_kv_heads=1"],
            ["model.attention.compress_mode=avgpool"], ["model.attention.kind=dense"],
            ["model.attention.compress_block=32", "model.attention.select_block=64", "model.n_layers=3"]]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(v) or "as-shipped")
@pytest.mark.parametrize("config", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_counts_what_the_model_builds(config: Path, variant: list[str]) -> None:
    cfg = load_config(config, variant)
    assert param_count(cfg.model) == meta_count(cfg.model)
