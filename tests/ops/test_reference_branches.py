"""Each reference branch against an independent per-query reference written here.

The references loop over (batch, position, head) in Python on purpose: they share no
code with nsa.ops.reference (a test that reuses the implementation's mask
shares its bugs: docs/lessons.md#independent-references).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from nsa.ops import get_ops, reference


def _rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _softmax_attend(q: torch.Tensor, keys: list[torch.Tensor], vals: list[torch.Tensor], scale: float):
    """One query over an explicit list of keys; returns (out, probs) or zeros if no key."""
    if not keys:
        return torch.zeros_like(q), torch.zeros(0, dtype=q.dtype)
    s = torch.stack([(q @ k) * scale for k in keys])
    p = torch.exp(s - s.max())
    p = p / p.sum()
    return sum(pi * v for pi, v in zip(p, vals)), p


@pytest.mark.parametrize("T,block,stride", [(21, 4, 2), (9, 4, 4), (3, 4, 2), (16, 8, 4)])
def test_compressed_attention_matches_per_query_loop(T: int, block: int, stride: int) -> None:
    B, H, G, D = 2, 4, 2, 8
    R = H // G
    Nc = reference.num_compressed(T, block, stride)
    assert Nc == max(0, len(range(0, T - block + 1, stride)))
    q = _rand(B, T, H, D, seed=1)
    kc, vc = _rand(B, Nc, G, D, seed=2), _rand(B, Nc, G, D, seed=3)
    out, probs = reference.compressed_attention(q, kc, vc, block, stride)
    assert out.shape == (B, T, H, D) and probs.shape == (B, T, H, Nc)
    scale = D**-0.5
    for b in range(B):
        for t in range(T):
            for h in range(H):
                g = h // R
                visible = [i for i in range(Nc) if i * stride + block - 1 <= t]  # block ended
                o, p = _softmax_attend(q[b, t, h], [kc[b, i, g] for i in visible],
                                       [vc[b, i, g] for i in visible], scale)
                torch.testing.assert_close(out[b, t, h], o)
                want = torch.zeros(Nc, dtype=torch.float64)
                for i, pi in zip(visible, p):
                    want[i] = pi
                torch.testing.assert_close(probs[b, t, h], want)
    assert torch.isfinite(out).all() and torch.isfinite(probs).all()


def test_compressed_attention_gradients_finite_with_empty_rows() -> None:
    """Queries before the first block end see nothing: output 0, and no NaN gradients."""
    B, T, H, G, D, block, stride = 1, 12, 2, 1, 4, 8, 4
    q = _rand(B, T, H, D, seed=4).requires_grad_()
    kc = _rand(B, 2, G, D, seed=5).requires_grad_()
    vc = _rand(B, 2, G, D, seed=6).requires_grad_()
    out, _ = reference.compressed_attention(q, kc, vc, block, stride)
    assert (out[:, : block - 1] == 0).all()
    out.sum().backward()
    for t in (q, kc, vc):
        assert torch.isfinite(t.grad).all()
    assert kc.grad.abs().sum() > 0 and vc.grad.abs().sum() > 0  # compressed keys get gradient too


@pytest.mark.parametrize("T,window", [(23, 5), (23, 1), (10, 64)])
def test_window_attention_equals_band_masked_sdpa(T: int, window: int) -> None:
    B, H, G, D = 2, 4, 2, 8
    q, k, v = _rand(B, T, H, D, seed=7), _rand(B, T, G, D, seed=8), _rand(B, T, G, D, seed=9)
    out = reference.window_attention(q, k, v, window)
    band = torch.tensor([[t - window < s <= t for s in range(T)] for t in range(T)])
    qh = q.transpose(1, 2)
    kh = k.repeat_interleave(H // G, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(H // G, dim=2).transpose(1, 2)
    want = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=band).transpose(1, 2)
    torch.testing.assert_close(out, want)
    if window >= T:  # the window covers everything: plain causal attention
        causal = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True).transpose(1, 2)
        torch.testing.assert_close(out, causal)


def _naive_selected(q, k, v, idx, select_block):
    B, T, H, D = q.shape
    G = k.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        for t in range(T):
            for h in range(H):
                g = h // (H // G)
                toks = sorted({s for j in idx[b, t, g].tolist() if j >= 0
                               for s in range(j * select_block, min((j + 1) * select_block, T)) if s <= t})
                out[b, t, h], _ = _softmax_attend(q[b, t, h], [k[b, s, g] for s in toks],
                                                  [v[b, s, g] for s in toks], D**-0.5)
    return out


def test_selected_attention_matches_per_query_loop() -> None:
    B, T, H, G, D, lp, n = 2, 29, 4, 2, 8, 4, 3
    q, k, v = _rand(B, T, H, D, seed=10), _rand(B, T, G, D, seed=11), _rand(B, T, G, D, seed=12)
    g = torch.Generator().manual_seed(13)
    # random blocks per (b, t, group): the query's own block plus random earlier ones or -1
    idx = torch.full((B, T, G, n), -1, dtype=torch.long)
    for b in range(B):
        for t in range(T):
            for gg in range(G):
                own = t // lp
                others = torch.randperm(own + 1, generator=g)[: n - 1].tolist()
                chosen = sorted({own, *[j for j in others if j != own]})[:n]
                drop = int(torch.randint(0, 2, (1,), generator=g))  # sometimes leave a -1 slot
                if drop and len(chosen) > 1:
                    chosen = [c for c in chosen if c != chosen[0]]
                idx[b, t, gg, : len(chosen)] = torch.tensor(chosen)
    out = reference.selected_attention(q, k, v, idx, lp)
    torch.testing.assert_close(out, _naive_selected(q, k, v, idx, lp))


def test_block_view_is_the_blocks() -> None:
    x = _rand(2, 19, 3, 4, seed=14)
    bv = reference.block_view(x, 6, 3)
    assert bv.shape == (2, reference.num_compressed(19, 6, 3), 6, 3, 4)
    assert bv.data_ptr() == x.data_ptr()  # a view, no copy
    for i in range(bv.shape[1]):
        torch.testing.assert_close(bv[:, i], x[:, i * 3 : i * 3 + 6])
    assert reference.block_view(x[:, :5], 6, 3).shape[1] == 0


def test_get_ops_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    import nsa.ops

    monkeypatch.setattr(nsa.ops, "_RESOLVED", {})  # fresh cache, restored afterwards
    assert get_ops("reference", "cpu") is reference
    assert get_ops("reference", torch.device("cpu")) is reference
    assert get_ops("auto", "cpu") is reference
    with pytest.raises(ValueError):
        get_ops("bogus", "cpu")
    try:
        import nsa.ops.triton  # noqa: F401
    except Exception:  # noqa: BLE001 - kernels not importable: auto on CUDA falls back
        assert get_ops("auto", "cuda") is reference
    else:
        assert get_ops("auto", "cuda") is not reference
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        get_ops("triton", "cpu")  # no silent fallback when the kernels were asked for


def test_scale_default_is_inverse_sqrt_head_dim() -> None:
    q, k, v = _rand(1, 6, 2, 16, seed=15), _rand(1, 6, 1, 16, seed=16), _rand(1, 6, 1, 16, seed=17)
    a = reference.window_attention(q, k, v, 3)
    b = reference.window_attention(q, k, v, 3, scale=1 / math.sqrt(16))
    torch.testing.assert_close(a, b)
    c = reference.window_attention(q, k, v, 3, scale=0.5)
    assert not torch.allclose(a, c)


# --- the chunked, gather-based paths (several chunks forced by a small chunk budget) ---


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few queries, so every test below crosses chunk boundaries (and, with
    autograd recording, runs each chunk under a checkpoint). The tests above run each
    call as one chunk (their sizes are far below the budget)."""
    monkeypatch.setattr(reference, "CHUNK_ELEMS", 4096)
    monkeypatch.setattr(reference, "WHOLE_CALL_CHUNKS", 0)


@pytest.fixture(params=["gather", "prefix"])
def selected_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of the selected branch: per-query gather of the n blocks (long sequences)
    and a masked scan of the keys before each chunk's end (short ones)."""
    monkeypatch.setattr(reference, "SELECTED_PATH", request.param)
    return request.param


def _grads(fn, xs: tuple[torch.Tensor, ...], seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    out = fn(*leaves)
    out.backward(_rand(*out.shape, seed=seed))
    return out.detach(), [x.grad for x in leaves]


def _random_idx(B: int, T: int, G: int, n: int, lp: int, seed: int, dup: bool = False) -> torch.Tensor:
    """Random eligible blocks per (b, t, g) in random slot order, the own block always
    in, -1 slots wherever fewer than n blocks are eligible (and at random); optionally a
    block listed twice (the reference treats idx as a set)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.full((B, T, G, n), -1, dtype=torch.long)
    for b in range(B):
        for t in range(T):
            for gg in range(G):
                own = t // lp
                others = torch.randperm(own + 1, generator=g).tolist()
                keep = int(torch.randint(1, n + 1, (1,), generator=g))
                chosen = [own] + [j for j in others if j != own][: keep - 1]
                if dup and len(chosen) < n:
                    chosen.append(chosen[-1])
                perm = torch.randperm(n, generator=g)[: len(chosen)]
                idx[b, t, gg, perm] = torch.tensor(chosen)
    return idx


# (T, l', n, H, G): T not a multiple of l', n above the eligible blocks, T < l', T = 1,
# T a multiple of l'; 2, 1 and 4 query heads per KV group
SELECTED_SHAPES = [(29, 4, 3, 4, 2), (37, 8, 9, 4, 2), (5, 8, 4, 4, 2), (1, 4, 3, 4, 2), (32, 8, 3, 4, 2),
                   (30, 4, 3, 3, 3), (27, 4, 4, 4, 1)]


@pytest.mark.parametrize("T,lp,n,H,G", SELECTED_SHAPES)
def test_chunked_selected_matches_per_query_loop(small_chunks, selected_path, T: int, lp: int,
                                                 n: int, H: int, G: int) -> None:
    B, D = 2, 8
    q, k, v = _rand(B, T, H, D, seed=20), _rand(B, T, G, D, seed=21), _rand(B, T, G, D, seed=22)
    idx = _random_idx(B, T, G, n, lp, seed=23, dup=True)
    if T > 1:
        assert reference._chunk_len(T, B * G * n * lp * D, q.device) < T  # several chunks
    assert (idx == -1).any()
    out = reference.selected_attention(q, k, v, idx, lp)
    want = _naive_selected(q, k, v, idx, lp)
    torch.testing.assert_close(out, want)
    with torch.no_grad():  # the path without checkpoints gives the same
        torch.testing.assert_close(reference.selected_attention(q, k, v, idx, lp), out)


@pytest.mark.parametrize("T,H,G", [(21, 4, 2), (19, 2, 2), (23, 4, 1)])
def test_chunked_selected_gradients_match_per_query_loop(small_chunks, selected_path, T: int, H: int,
                                                         G: int) -> None:
    """Gradients through the chunks (checkpointed) equal autograd through the loop."""
    B, D, lp, n = 1, 4, 4, 3
    xs = (_rand(B, T, H, D, seed=24), _rand(B, T, G, D, seed=25), _rand(B, T, G, D, seed=26))
    idx = _random_idx(B, T, G, n, lp, seed=27)
    out, grads = _grads(lambda a, b, c: reference.selected_attention(a, b, c, idx, lp), xs, seed=28)
    want, want_grads = _grads(lambda a, b, c: _naive_selected(a, b, c, idx, lp), xs, seed=28)
    torch.testing.assert_close(out, want)
    for name, g, w in zip("qkv", grads, want_grads):
        torch.testing.assert_close(g, w, msg=name)


def test_selected_query_without_visible_key_gets_zero(small_chunks, selected_path) -> None:
    """All slots -1, or only a block that starts after the query: output 0, no NaN."""
    B, T, H, G, D, lp = 1, 12, 2, 1, 4, 4
    xs = (_rand(B, T, H, D, seed=29), _rand(B, T, G, D, seed=30), _rand(B, T, G, D, seed=31))
    idx = torch.full((B, T, G, 2), -1, dtype=torch.long)
    idx[0, 1, 0, 0] = 2  # t = 1 selects only block 2 (tokens 8..11): nothing <= t
    out, grads = _grads(lambda a, b, c: reference.selected_attention(a, b, c, idx, lp), xs, seed=32)
    assert (out == 0).all()
    for g in grads:
        assert torch.isfinite(g).all() and (g == 0).all()


def _band_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    T, H, G = q.shape[1], q.shape[2], k.shape[2]
    band = torch.tensor([[t - window < s <= t for s in range(T)] for t in range(T)])
    kh = k.repeat_interleave(H // G, dim=2).transpose(1, 2)
    vh = v.repeat_interleave(H // G, dim=2).transpose(1, 2)
    return F.scaled_dot_product_attention(q.transpose(1, 2), kh, vh, attn_mask=band).transpose(1, 2)


# T not a multiple of the chunk, window 1, T < window, T == window, T = 1; 2, 1 and 4
# query heads per KV group
@pytest.mark.parametrize("T,window,H,G", [(53, 16, 4, 2), (53, 7, 4, 2), (30, 1, 4, 2), (20, 64, 4, 2),
                                          (64, 64, 4, 2), (1, 8, 4, 2), (45, 9, 3, 3), (41, 12, 4, 1)])
def test_chunked_window_matches_band_masked_sdpa_with_gradients(small_chunks, T: int, window: int, H: int,
                                                                G: int) -> None:
    B, D = 2, 8
    xs = (_rand(B, T, H, D, seed=33), _rand(B, T, G, D, seed=34), _rand(B, T, G, D, seed=35))
    out, grads = _grads(lambda a, b, c: reference.window_attention(a, b, c, window), xs, seed=36)
    want, want_grads = _grads(lambda a, b, c: _band_sdpa(a, b, c, window), xs, seed=36)
    torch.testing.assert_close(out, want)
    for name, g, w in zip("qkv", grads, want_grads):
        torch.testing.assert_close(g, w, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(reference.window_attention(*xs, window), out)


@pytest.mark.parametrize("T,block,stride,lp", [(45, 4, 2, 8), (50, 8, 4, 8), (6, 8, 4, 8)])  # last: Nc = 0
def test_chunked_compressed_and_scores_equal_the_composition(small_chunks, T, block, stride, lp) -> None:
    """``compressed_attention_and_scores`` (chunked) == ``compressed_attention`` (checked
    against a per-query loop above) followed by ``selection_scores``, gradients included."""
    B, H, G, D = 2, 4, 2, 8
    Nc = reference.num_compressed(T, block, stride)
    xs = (_rand(B, T, H, D, seed=37), _rand(B, Nc, G, D, seed=38), _rand(B, Nc, G, D, seed=39))

    def chunked(a, b, c):
        out, scores = reference.compressed_attention_and_scores(a, b, c, block, stride, lp, G)
        chunked.scores = scores
        return out

    def composed(a, b, c):
        out, probs = reference.compressed_attention(a, b, c, block, stride)
        composed.scores = reference.selection_scores(probs.detach(), G, block, stride, lp)
        return out

    out, grads = _grads(chunked, xs, seed=40)
    want, want_grads = _grads(composed, xs, seed=40)
    torch.testing.assert_close(out, want)
    assert chunked.scores.shape == (B, T, G, reference.num_select_blocks(T, lp))
    assert not chunked.scores.requires_grad
    torch.testing.assert_close(chunked.scores, composed.scores)
    for name, g, w in zip("qkv", grads, want_grads):
        torch.testing.assert_close(g, w, msg=name)


def _saved_bytes(fn, xs: list[torch.Tensor]) -> int:
    """Bytes autograd keeps for the backward of ``fn(*xs)`` (distinct storages, inputs excluded)."""
    inputs = {x.untyped_storage().data_ptr() for x in xs}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in inputs:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*xs)
    return sum(seen.values())


def test_saved_tensors_grow_linearly_in_T(small_chunks, monkeypatch: pytest.MonkeyPatch) -> None:
    """What autograd keeps for the backward of the selected and window branches grows
    like T (the chunks' temporaries are recomputed, not saved), not like T^2."""
    monkeypatch.setattr(reference, "SELECTED_PATH", "gather")  # the path for long sequences
    H, G, D, lp, n, w = 4, 1, 8, 8, 4, 16
    saved = {}
    for T in (128, 256, 512):
        q = _rand(1, T, H, D, seed=41).requires_grad_()
        k, v = _rand(1, T, G, D, seed=42).requires_grad_(), _rand(1, T, G, D, seed=43).requires_grad_()
        t = torch.arange(T)[None, :, None, None]
        idx = torch.where(torch.arange(n) <= t // lp, t // lp - torch.arange(n), -1)  # own + earlier blocks
        sel = functools.partial(reference.selected_attention, idx=idx, select_block=lp)
        win = functools.partial(reference.window_attention, window=w)
        saved[T] = (_saved_bytes(sel, [q, k, v]), _saved_bytes(win, [q, k, v]))
    for i in range(2):
        assert 0 < saved[128][i]
        assert saved[256][i] <= 2.1 * saved[128][i] and saved[512][i] <= 2.1 * saved[256][i], saved
