"""nsa.stats: parameter counts of the shipped configs and FLOPs that count what the
attention masks actually let each query see."""

from __future__ import annotations

from pathlib import Path

import torch
from nsa_model_testlib import small_cfg

from nsa import stats
from nsa.config import load_config
from nsa.model import build_model
from nsa.ops import reference

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_param_count_matches_the_built_model() -> None:
    for kind in ("nsa", "dense"):
        cfg = small_cfg(kind)
        model = build_model(cfg)
        assert stats.param_count(cfg) == sum(p.numel() for p in model.parameters()) == model.param_count()
        assert stats.param_count(cfg, non_embedding=True) == model.param_count() - cfg.vocab_size * cfg.dim


def test_125m_configs_land_near_125m() -> None:
    nsa_cfg = load_config(CONFIGS / "nsa-125m.yaml").model
    dense_cfg = load_config(CONFIGS / "dense-125m.yaml").model
    n = stats.param_count(nsa_cfg)
    assert 110e6 <= n <= 140e6, n
    assert (nsa_cfg.dim, nsa_cfg.n_layers) == (768, 12)
    # the dense baseline is the same model but for attention: fewer parameters, same rest
    assert stats.param_count(dense_cfg) < n
    assert nsa_cfg.ffn_hidden == dense_cfg.ffn_hidden


def test_attention_flops_count_the_visible_keys() -> None:
    """Count visible keys from the reference ops' own masks on a small config."""
    cfg = small_cfg("nsa", num_selected=3)
    a = cfg.attention
    T, G, H, D = 53, cfg.n_kv_heads, cfg.n_heads, 8
    q = torch.zeros(1, T, H, D)
    Nc = reference.num_compressed(T, a.compress_block, a.compress_stride)
    _, probs = reference.compressed_attention(q, torch.zeros(1, Nc, G, D), torch.zeros(1, Nc, G, D),
                                              a.compress_block, a.compress_stride)
    n_cmp = (probs[0, :, 0] > 0).sum().item()
    scores = torch.rand(1, T, G, reference.num_select_blocks(T, a.select_block))
    idx = reference.select_blocks(scores, a.select_block, a.num_selected, a.num_initial, a.num_local)
    n_slc = 0
    for t in range(T):
        blocks = [j for j in idx[0, t, 0].tolist() if j >= 0]
        n_slc += sum(1 for s in range(t + 1) if s // a.select_block in blocks)
    n_win = sum(min(a.window, t + 1) for t in range(T))
    want = 4 * H * cfg.head_dim * (n_cmp + n_slc + n_win) / T * cfg.n_layers
    assert stats.attention_flops_per_token(cfg, T) == want
    dense = small_cfg("dense")
    assert stats.attention_flops_per_token(dense, T) == 4 * H * 8 * (T + 1) / 2 * dense.n_layers


def test_cli_prints_params_and_flops(capsys) -> None:
    assert stats.main([str(CONFIGS / "tiny-cpu.yaml")]) == 0
    out = capsys.readouterr().out
    n = stats.param_count(load_config(CONFIGS / "tiny-cpu.yaml").model)
    assert f"parameters: {n:,}" in out and "attention FLOPs/token" in out and "MFLOP" in out
    assert stats.main([str(CONFIGS / "tiny-cpu.yaml"), "--set", "model.nope=1"]) == 2
    assert "model.nope" in capsys.readouterr().err
