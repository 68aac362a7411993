"""``decode_write`` (nsa/ops/triton/step_write.py) against the torch ops it replaces.

A decode step's new token per sequence: q rotated, each key/value pair written at
``pos % n`` of its cache or ring, the keys rotated where the pair says so, the angles read
from RoPE's tables at ``pos``; with a folded RMSNorm, everything first scaled by the row's
``1 / rms(x)`` and the gate logits finished in place. The reference is
``nsa.ops.rope.apply_rope``, the model's ``RMSNorm`` and plain indexing; fp32 and fp16 in
the interpreter. The whole step through the kernel is compared with the forward in
tests/model/test_decode.py.
"""

from __future__ import annotations

import pytest
import torch

import nsa.ops.triton as T_OPS
from nsa.model.layers import RMSNorm
from nsa.ops.rope import apply_rope, rope_angles, rope_table
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err


def _caches(B: int, sizes: list[int], G: int, D: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    return [(torch.randn(B, n, G, D).to(dtype), torch.randn(B, n, G, D).to(dtype)) for n in sizes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("ropes", [(False, True, True), (True,)], ids=["nsa", "dense"])
def test_rotates_and_writes_each_pair_at_its_slot(dtype: torch.dtype, ropes: tuple[bool, ...]) -> None:
    seed = fresh_seed()
    B, H, G, D = 3, 6, 2, 24  # D/2 not a power of two; H, G neither
    sizes = [8, 64, 12][:len(ropes)]  # a ring of l, a cache with room for every position, a window ring
    pos = torch.tensor([0, 17, 63])[:B]
    q = torch.randn(B, 1, H, D).to(dtype)
    kv = torch.randn(B, 1, 2 * len(ropes), G, D).to(dtype)
    cos, sin = rope_angles(pos, D, 10000.0)
    caches = _caches(B, sizes, G, D, dtype)
    want = [(k.clone(), v.clone()) for k, v in caches]
    got_q = T_OPS.decode_write(q, kv, *rope_table(64, D, 10000.0, torch.float32, q.device), pos,
                               [(k, v, r) for (k, v), r in zip(caches, ropes)])
    # the torch ops: RoPE per sequence at its own position, then an index_put per cache
    rows = torch.arange(B)
    want_q = apply_rope(q.transpose(0, 1).float(), cos, sin).transpose(0, 1)
    for j, ((k, v), r, n) in enumerate(zip(want, ropes, sizes)):
        new_k = kv[:, :, 2 * j]
        new_k = apply_rope(new_k.transpose(0, 1).float(), cos, sin).transpose(0, 1).to(dtype) if r else new_k
        k[rows, pos % n], v[rows, pos % n] = new_k[:, 0], kv[:, 0, 2 * j + 1]
    tol = TOL if dtype == torch.float32 else 1e-3
    assert got_q.dtype == dtype and rel_err(got_q, want_q) <= tol, f"seed={seed} q"
    for j, ((k, v), (wk, wv)) in enumerate(zip(caches, want)):
        assert rel_err(k, wk) <= tol, f"seed={seed} keys of pair {j}"
        assert torch.equal(v, wv), f"seed={seed} values of pair {j}"  # copied, never rounded


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dim", [40, 1500])
def test_finishes_a_folded_norm_and_the_gate_logits(dtype: torch.dtype, dim: int) -> None:
    """q, K/V and gate logits projected from the raw x by weights holding the norm's gain:
    written as the projections of the normed x (the gates with their bias), for rows of
    ``dim`` 40 and 1,500 (past one program's chunk)."""
    seed = fresh_seed()
    B, H, G, D = 2, 4, 2, 8
    pos = torch.tensor([5, 30])
    norm = RMSNorm(dim)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = 3.0 * torch.randn(B, 1, dim)
    wq, wkv, wg = (torch.randn(n, dim) / dim**0.5 for n in (H * D, 2 * G * D, 3 * H))
    bias = torch.randn(3 * H)
    w = torch.cat([wq, wkv, wg]) * norm.weight.detach()
    raw = (x @ w.t()).to(dtype)  # the folded GEMM's output: [q | kv | gates] per row
    q_in = raw[..., :H * D].view(B, 1, H, D)
    kv_in = raw[..., H * D:H * D + 2 * G * D].view(B, 1, 2, G, D)
    logits = raw[..., H * D + 2 * G * D:].view(B, 1, H, 3)
    k, v = torch.zeros(B, 32, G, D, dtype=dtype), torch.zeros(B, 32, G, D, dtype=dtype)
    got_q = T_OPS.decode_write(q_in, kv_in, *rope_table(32, D, 10000.0, torch.float32, x.device), pos,
                               [(k, v, True)], norm=(x, norm.eps), gates=(logits, bias))
    h = norm(x)
    cos, sin = rope_angles(pos, D, 10000.0)
    rows = torch.arange(B)
    want_q = apply_rope((h @ wq.t()).view(B, 1, H, D).transpose(0, 1), cos, sin).transpose(0, 1)
    want_k = apply_rope((h @ wkv[:G * D].t()).view(B, 1, G, D).transpose(0, 1), cos, sin).transpose(0, 1)
    tol = TOL if dtype == torch.float32 else 2e-3
    assert rel_err(got_q, want_q) <= tol, f"seed={seed} q"
    assert rel_err(k[rows, pos], want_k[:, 0]) <= tol, f"seed={seed} keys"
    assert rel_err(v[rows, pos], (h @ wkv[G * D:].t()).view(B, G, D)) <= tol, f"seed={seed} values"
    assert rel_err(logits, (h @ wg.t() + bias).view(B, 1, H, 3)) <= tol, f"seed={seed} gate logits"


def test_refuses_what_it_cannot_write() -> None:
    B, H, G, D = 2, 4, 2, 8
    q, kv = torch.randn(B, 1, H, D), torch.randn(B, 1, 2, G, D)
    cos, sin = rope_table(16, D, 10000.0, torch.float32, q.device)
    pos = torch.tensor([3, 4])
    k, v = torch.zeros(B, 16, G, D), torch.zeros(B, 16, G, D)
    with pytest.raises(ValueError, match="2 cache pairs for 2 rows"):
        T_OPS.decode_write(q, kv, cos, sin, pos, [(k, v, True), (k, v, False)])
    with pytest.raises(ValueError, match="cache pair"):
        T_OPS.decode_write(q, kv, cos, sin, pos, [(k, torch.zeros(B, 8, G, D), True)])
    with pytest.raises(ValueError, match="one token per sequence"):
        T_OPS.decode_write(torch.randn(B, 2, H, D), kv, cos, sin, pos, [(k, v, True)])
    with pytest.raises(ValueError, match="pos"):
        T_OPS.decode_write(q, kv, cos, sin, pos[:1], [(k, v, True)])
    with pytest.raises(ValueError, match="RoPE tables"):
        T_OPS.decode_write(q, kv, cos[:, :2], sin[:, :2], pos, [(k, v, True)])
    with pytest.raises(ValueError, match="only with the norm"):
        T_OPS.decode_write(q, kv, cos, sin, pos, [(k, v, True)], gates=(torch.zeros(B, 1, H, 3), None))
    with pytest.raises(ValueError, match="the norm's input"):
        T_OPS.decode_write(q, kv, cos, sin, pos, [(k, v, True)], norm=(torch.randn(2 * B, 1, 16), 1e-5))
    with pytest.raises(ValueError, match="gate bias"):
        T_OPS.decode_write(q, kv, cos, sin, pos, [(k, v, True)], norm=(torch.randn(B, 1, 16), 1e-5),
                           gates=(torch.zeros(B, 1, H, 3), torch.zeros(5)))
    huge = torch.empty(B, 2**27, G, D, device="meta")  # 2**32 elements, nothing allocated
    with pytest.raises(ValueError, match="2\\*\\*31 elements"):
        T_OPS.decode_write(q, kv, cos, sin, pos, [(huge, huge, True)])
