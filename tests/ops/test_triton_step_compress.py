"""A decode step's compression kernel (nsa/ops/triton/step_compress.py) against the step's
torch ops (``NSACache._append_compressed``), on the same rings and positions.

CPU interpreter, fp32, relative error <= 1e-5 (kernel_testlib.TOL): sequences that complete
a compressed block at their position and sequences that do not (their rows stay as they
were), several KV groups, phi as an MLP and as average pooling.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nsa.infer.cache import NSACache
from nsa.model import build_model
from nsa.ops.triton import step_compress as DC
from nsa.syncs import HostSyncs
from tests.model.nsa_model_testlib import small_cfg
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err


def _cache(mode: str, block: int, stride: int, batch: int, device: str = "cpu",
           dtype: torch.dtype = torch.float32, head_dim: int = 8) -> NSACache:
    cfg = small_cfg("nsa", compress_block=block, compress_stride=stride, select_block=16, window=16)
    attention = dataclasses.replace(cfg.attention, compress_mode=mode)
    cfg = dataclasses.replace(cfg, init_std=0.2, attention=attention, head_dim=head_dim)
    model = build_model(cfg).to(device, dtype).eval()
    cache = NSACache(model.blocks[0].attn, batch, 128)  # room for every position _check writes
    cache.allocate(dtype, torch.device(device))
    for t in cache.tensors.values():
        t.normal_()
    return cache


@pytest.mark.parametrize("mode", ["mlp", "avgpool"])
@pytest.mark.parametrize("block,stride", [(8, 4), (16, 16), (6, 3)])
def test_equals_the_steps_torch_ops(mode: str, block: int, stride: int) -> None:
    _check(_cache(mode, block, stride, batch=4), block, stride, TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_on_gpu() -> None:
    """nsa-125m's phi (l 32, d 16, head dim 64) in bf16 on CUDA against the torch ops: 1e-2."""
    _check(_cache("mlp", 32, 16, batch=4, device="cuda", dtype=torch.bfloat16, head_dim=64), 32, 16, 1e-2)


def _check(cache: NSACache, block: int, stride: int, tol: float) -> None:
    """The kernel's compressed rows against ``_append_compressed``'s on the cache's rings."""
    seed = fresh_seed()
    t = cache.tensors
    # completes a block, too early for any, completes one, between two blocks
    pos = torch.tensor([block - 1, block - 2, block - 1 + 5 * stride, block + 1 + 5 * stride],
                       device=t["k_raw"].device)
    assert cache.rope is not None
    before = {k: t[k].clone() for k in ("k_cmp", "v_cmp")}
    cache._append_compressed(pos, cache.rope, None, cache._slots(pos, None))
    want = {k: t[k].clone() for k in ("k_cmp", "v_cmp")}
    for k in before:
        t[k].copy_(before[k])
    cache.phi_weights = None
    with torch.no_grad(), HostSyncs() as syncs:
        DC.decode_compress(t["k_raw"], t["v_raw"], pos, *cache.rope, t["k_cmp"], t["v_cmp"], stride,
                           *cache._stacked_phi())
    assert not syncs.events, syncs.report()
    start = pos - (block - 1)
    done = (start >= 0) & (start % stride == 0)
    assert done.tolist() == [True, False, True, False]
    for k in want:
        got = t[k]
        assert rel_err(got, want[k]) <= tol, f"seed={seed} {k}"
        assert torch.equal(got[~done], before[k][~done]), f"seed={seed}: a row was written without a block"
        assert not torch.equal(got[done], before[k][done]), "the completed blocks were not written"


def test_refusals() -> None:
    """Mismatched shapes and half a set of phi's weights are refused, naming what is wrong."""
    cache = _cache("mlp", 8, 4, batch=2)
    t, pos = cache.tensors, torch.tensor([7, 11])
    cos = sin = torch.zeros(96, 4)  # RoPE's tables: a row per position
    with pytest.raises(ValueError, match="want \\[B, l, G, D\\]"):
        DC.decode_compress(t["k_raw"], t["v_raw"][:1], pos, cos, sin, t["k_cmp"], t["v_cmp"], 4)
    with pytest.raises(ValueError, match="head dim 8"):
        DC.decode_compress(t["k_raw"], t["v_raw"], pos, cos[:, :3], sin, t["k_cmp"], t["v_cmp"], 4)
    with pytest.raises(ValueError, match="tables"):
        DC.decode_compress(t["k_raw"], t["v_raw"], pos, cos[0], sin[0], t["k_cmp"], t["v_cmp"], 4)
    with pytest.raises(ValueError, match="all of pos_emb"):
        DC.decode_compress(t["k_raw"], t["v_raw"], pos, cos, sin, t["k_cmp"], t["v_cmp"], 4,
                           w1=torch.zeros(2, 32, 64))
