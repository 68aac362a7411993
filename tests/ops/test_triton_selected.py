"""Triton group-centric selected attention (selected.py) against the reference ops.

CPU, TRITON_INTERPRET=1, fp32, fresh random inputs each run (seed in the message). The
forward is also checked against an independent per-query loop (docs/lessons.md#independent-references).
"""

from __future__ import annotations

import pytest
import torch

import nsa.ops.triton as T_OPS
from nsa.ops import reference as R
from nsa.ops.triton.invert import inverted_index
from nsa.ops.triton.selected import (  # noqa: E402
    _sizes,
    dkdv_chunk,
    selected_backward,
    selected_forward,
)
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err


def _naive_selected(q, k, v, idx, block, scale):
    """Per-query, per-group loop over the selected blocks' tokens s <= t."""
    B, T, H, D = q.shape
    G = k.shape[2]
    R_ = H // G
    out = torch.zeros_like(q)
    for b in range(B):
        for t in range(T):
            for g in range(G):
                keys = [s for j in idx[b, t, g].tolist() if j >= 0
                        for s in range(j * block, min((j + 1) * block, t + 1))]
                if not keys:
                    continue
                qq = q[b, t, g * R_:(g + 1) * R_]  # [R, D]
                w = torch.softmax(qq @ k[b, keys, g].T * scale, -1)
                out[b, t, g * R_:(g + 1) * R_] = w @ v[b, keys, g]
    return out


def _random_idx(B, T, G, block, n, n_init, n_local):
    ns = R.num_select_blocks(T, block)
    return R.select_blocks(torch.rand(B, T, G, ns), block, n, n_init, n_local)


SEL_CASES = [  # B, T, H, G, D, l', n, initial, local
    (2, 91, 8, 2, 16, 16, 4, 1, 2),  # 4 heads per group: padded rows
    (2, 131, 16, 1, 32, 32, 3, 1, 1),  # 16 heads per group: one full tile
    (3, 70, 4, 1, 16, 16, 8, 0, 1),  # n larger than the blocks that exist: many -1 slots
    (1, 40, 40, 1, 16, 16, 3, 1, 1),  # 40 heads (padded to 64): dK/dV takes two 32-head tiles per position
    (2, 77, 4, 1, 16, 24, 3, 1, 1),  # blocks of 24 in 32-key tiles: padding columns in unmasked blocks too
    (1, 50, 4, 2, 16, 8, 4, 1, 1),  # blocks of 8 in 16-key tiles, several blocks per program's positions
]


@pytest.mark.parametrize("B,T,H,G,D,block,n,n_init,n_local", SEL_CASES)
def test_selected_attention_matches_reference(B, T, H, G, D, block, n, n_init, n_local):
    seed = fresh_seed()
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, T, G, D), torch.randn(B, T, G, D)
    idx = _random_idx(B, T, G, block, n, n_init, n_local)
    assert (idx == -1).any()  # early queries have fewer eligible blocks than slots

    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = T_OPS.selected_attention(*xs, idx, block)
    out.backward(do)
    rs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = R.selected_attention(*rs, idx, block)
    ref.backward(do)
    assert rel_err(out, ref) <= TOL, f"seed={seed} out"
    for name, a, r in zip("qkv", xs, rs):
        assert rel_err(a.grad, r.grad) <= TOL, f"seed={seed} d{name}"
    if B * T <= 210:
        naive = _naive_selected(q, k, v, idx, block, D**-0.5)
        assert rel_err(out, naive) <= TOL, f"seed={seed} naive"


def test_selected_attention_unsorted_idx_and_scale():
    """The kernel does not rely on slot order; an explicit scale is honoured."""
    seed = fresh_seed()
    B, T, H, G, D, block, n = 1, 80, 4, 2, 16, 16, 3
    q, k, v = torch.randn(B, T, H, D), torch.randn(B, T, G, D), torch.randn(B, T, G, D)
    idx = _random_idx(B, T, G, block, n, 1, 1)
    perm = idx.flip(-1)
    out = T_OPS.selected_attention(q, k, v, perm, block, scale=0.3)
    ref = R.selected_attention(q, k, v, idx, block, scale=0.3)
    assert rel_err(out, ref) <= TOL, f"seed={seed}"


def test_blocks_after_their_query_give_nothing_forward_or_backward():
    """The contract's idx may name a block that starts after its query (``select_blocks``
    never does): its keys are all hidden from that query, in the gradients too. Here every
    query also lists the last block, so its dK/dV list holds more queries before its last key
    than a block has keys, the case where the kernel masks that block's whole chunk."""
    seed = fresh_seed()
    B, T, H, G, D, block, n = 1, 96, 4, 1, 16, 16, 3
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, T, G, D), torch.randn(B, T, G, D)
    idx = _random_idx(B, T, G, block, n, 1, 1)
    last = R.num_select_blocks(T, block) - 1
    idx[..., -1] = torch.where((idx[..., :-1] == last).any(-1), -1, last)  # distinct, -1 where already listed
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    T_OPS.selected_attention(*xs, idx, block).backward(do)
    rs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = R.selected_attention(*rs, idx, block)
    ref.backward(do)
    for name, a, r in zip("qkv", xs, rs):
        assert rel_err(a.grad, r.grad) <= TOL, f"seed={seed} d{name}"


def test_inverted_index_lists_every_selection_once():
    """Segment k of the inverted index holds exactly the queries t that selected block j."""
    seed = fresh_seed()
    B, T, G, block, n = 2, 97, 3, 8, 5
    idx = _random_idx(B, T, G, block, n, 1, 2)
    ns = R.num_select_blocks(T, block)
    tlist, offsets = inverted_index(idx, ns)
    assert offsets.shape == (B * G * ns + 1,)
    assert int(offsets[-1]) == int((idx >= 0).sum())
    for b in range(B):
        for g in range(G):
            for j in range(ns):
                key = (b * G + g) * ns + j
                got = tlist[int(offsets[key]):int(offsets[key + 1])].tolist()
                want = [t for t in range(T) if j in idx[b, t, g].tolist()]
                assert got == want, f"seed={seed} b={b} g={g} j={j}"


@pytest.mark.parametrize("positions", [1, 3, 16])
def test_selected_positions_per_program(positions):
    """Forward/dQ tiles of several query positions (the union of their blocks under a
    per-row mask) equal pure padding (positions=1) and the reference."""
    seed = fresh_seed()
    B, T, H, G, D, block, n = 2, 45, 4, 2, 16, 8, 3
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, T, G, D), torch.randn(B, T, G, D)
    idx = _random_idx(B, T, G, block, n, 1, 1)
    o, lse = selected_forward(q, k, v, idx, block, D**-0.5, positions=positions)
    dq, _, _ = selected_backward(q, k, v, idx, o, lse, do, block, D**-0.5, positions=positions)
    rs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = R.selected_attention(*rs, idx, block)
    ref.backward(do)
    assert rel_err(o, ref) <= TOL, f"seed={seed} out"
    assert rel_err(dq, rs[0].grad) <= TOL, f"seed={seed} dq"


@pytest.mark.parametrize("hpg,d,rows,positions", [(16, 64, 64, 4), (16, 128, 32, 2), (1, 64, 16, 16),
                                                   (4, 128, 32, 8), (64, 64, 64, 1), (64, 128, 64, 1)])
def test_positions_per_program_follow_the_head_dim(hpg: int, d: int, rows: int, positions: int) -> None:
    """64 rows a program (positions x padded heads) up to head dim 64, 32 beyond (an H200
    measured both ways: docs/kernels.md); at most 16 positions, at least one."""
    got = _sizes(hpg, d, 64, None)
    assert (got[0], got[1]) == (rows, positions)


@pytest.mark.parametrize("pairs,n,block,sms,chunk", [
    (1 << 20, 16, 64, 0, 4096),  # off a GPU: 4 n l', as before
    (1 << 20, 16, 64, 132, 256),  # nsa-125m's 64k tokens on an H100/H200: 496 -> 256
    (16384 * 16, 16, 64, 132, 256),  # a training micro-batch (8 x 2048): never below MIN_CHUNK
    (1 << 22, 16, 64, 132, 1024),  # the paper layout's 64k tokens, 4 groups: 1986 -> 1024
    (1 << 30, 16, 64, 132, 4096),  # never above 4 n l'
    (1 << 20, 16, 64, 108, 512),  # fewer SMs (A100): 606 -> 512
    (1 << 20, 4, 32, 132, 256),  # 4 n l' = 512
])
def test_dkdv_chunks_fit_the_gpu(pairs: int, n: int, block: int, sms: int, chunk: int) -> None:
    """The dK/dV chunk: about CHUNKS_PER_SM per SM over the launch, a power of two within
    [MIN_CHUNK, 4 n l'], so that no program's serial loop (the initial block's, which every
    query selects) dwarfs the average one."""
    assert dkdv_chunk(pairs, n, block, sms) == chunk


@pytest.mark.parametrize("chunk", [1])
def test_selected_backward_chunked_lists(chunk):
    """Block query lists cut into many chunks (partials summed per block) give the same
    gradients as the reference."""
    seed = fresh_seed()
    B, T, H, G, D, block, n = 2, 75, 4, 2, 16, 16, 3
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, T, G, D), torch.randn(B, T, G, D)
    idx = _random_idx(B, T, G, block, n, 1, 1)
    o, lse = selected_forward(q, k, v, idx, block, D**-0.5)
    grads = selected_backward(q, k, v, idx, o, lse, do, block, D**-0.5, chunk=chunk)
    rs = [x.clone().requires_grad_() for x in (q, k, v)]
    R.selected_attention(*rs, idx, block).backward(do)
    for name, g, r in zip("qkv", grads, rs):
        assert rel_err(g, r.grad) <= TOL, f"seed={seed} d{name}"


def test_selected_backward_is_deterministic():
    fresh_seed()
    B, T, H, G, D, block, n = 1, 90, 16, 1, 16, 16, 3
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, T, G, D), torch.randn(B, T, G, D)
    idx = _random_idx(B, T, G, block, n, 1, 1)
    grads = []
    for _ in range(2):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        T_OPS.selected_attention(*xs, idx, block).backward(do)
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_selected_fp16_path_in_interpreter():
    """16-bit code path on CPU (fp16 dots are right in the interpreter): rel err <= 1e-2."""
    seed = fresh_seed()
    B, T, H, G, D, block, n = 2, 60, 8, 2, 32, 16, 4
    q, do = torch.randn(B, T, H, D).half(), torch.randn(B, T, H, D).half()
    k, v = torch.randn(B, T, G, D).half(), torch.randn(B, T, G, D).half()
    idx = _random_idx(B, T, G, block, n, 1, 2)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = T_OPS.selected_attention(*xs, idx, block)
    out.backward(do)
    rs = [x.float().requires_grad_() for x in (q, k, v)]
    ref = R.selected_attention(*rs, idx, block)
    ref.backward(do.float())
    assert out.dtype == torch.float16
    assert rel_err(out.float(), ref) <= 1e-2, f"seed={seed} out"
    for name, a, r in zip("qkv", xs, rs):
        assert a.grad.dtype == torch.float16
        assert rel_err(a.grad.float(), r.grad) <= 1e-2, f"seed={seed} d{name}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("H,G,D", [(16, 1, 64), (64, 4, 128), (8, 2, 64)])
def test_selected_bf16_on_gpu(H, G, D):
    """bf16 kernel vs the fp32 reference on the same bf16-rounded inputs: rel err <= 1e-2."""
    seed = fresh_seed()
    B, T, block, n = 2, 1000, 64, 16
    dev = "cuda"
    q = torch.randn(B, T, H, D, device=dev).bfloat16()
    k = torch.randn(B, T, G, D, device=dev).bfloat16()
    v = torch.randn(B, T, G, D, device=dev).bfloat16()
    do = torch.randn(B, T, H, D, device=dev).bfloat16()
    idx = R.select_blocks(torch.rand(B, T, G, R.num_select_blocks(T, block), device=dev), block, n, 1, 2)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = T_OPS.selected_attention(*xs, idx, block)
    out.backward(do)
    rs = [x.float().requires_grad_() for x in (q, k, v)]
    ref = R.selected_attention(*rs, idx, block)
    ref.backward(do.float())
    assert rel_err(out.float(), ref) <= 1e-2, f"seed={seed} out"
    for name, a, r in zip("qkv", xs, rs):
        assert rel_err(a.grad.float(), r.grad) <= 1e-2, f"seed={seed} d{name}"
