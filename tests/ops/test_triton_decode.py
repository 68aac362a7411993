"""The fused decode kernels (nsa/ops/triton/decode.py) against the KV-cache decoder's maths.

The oracle is ``NSACache.step`` itself: a small NSA model (reference backend) prefills a
batch of prompts of different lengths and decodes with ``decode_step``, and the three
branch outputs the step hands to ``NSAAttention.mix`` (and the query it projected, and the
blocks ``select_blocks_at`` chose) are recorded; the kernels then run on the same query
and the cache as the step left it. Random caches longer than a model test can afford
(several key tiles, several blocks tiles, every split) go through ``_step_branches``, the
step's lines for the three branches applied to given tensors with the same reference
primitives; the model tests check that it equals what the step computes.

CPU interpreter, fp32, relative error <= 1e-5 (kernel_testlib.TOL). The choice of blocks
is discontinuous: where it differs from the reference's it must be one the reference
could make up to rounding (``_check_choice``), and the selected branch is then compared
with the reference's maths on the kernels' own choice. The GPU tests (bf16, a CUDA graph,
speed) are skipped without CUDA.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
import triton
import triton.language as tl

from nsa.config import AttentionConfig, ModelConfig
from nsa.infer import cache as cache_mod
from nsa.infer import decode_step, prefill
from nsa.model import build_model
from nsa.ops import reference as R
from nsa.ops.triton import decode as DK
from nsa.syncs import HostSyncs
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err


@dataclasses.dataclass(frozen=True)
class Layout:
    """NSA hyperparameters of a test (the kernels' integer arguments)."""

    block: int
    stride: int
    select_block: int
    num_selected: int
    num_initial: int
    num_local: int
    window: int

    def args(self) -> tuple[int, int, int, int, int, int]:
        return (self.block, self.stride, self.select_block, self.num_selected, self.num_initial,
                self.num_local)


def _step_branches(q: torch.Tensor, t: dict[str, torch.Tensor], pos: torch.Tensor, lay: Layout
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``NSACache.step``'s three branches for ``q [B, 1, H, D]`` at ``pos [B]`` over the cache
    tensors ``t`` (its lines, its primitives) -> (o_cmp, o_slc, o_win, idx [B, G, n], scores
    [B, G, Ns])."""
    B, _, H, D = q.shape
    S, G = t["k_slc"].shape[1], t["k_slc"].shape[2]
    n_cmp, dev = t["k_cmp"].shape[1], q.device
    scale = D**-0.5
    ends = torch.arange(n_cmp, device=dev) * lay.stride + (lay.block - 1)
    visible = (ends[None, :] <= pos[:, None])[:, None, None, None, :]
    o_cmp, probs = R._masked_attention(q, t["k_cmp"], t["v_cmp"], visible, scale)
    probs = probs.permute(0, 3, 1, 2, 4).reshape(B, 1, H, n_cmp)
    cols, vals = cache_mod.overlap_band(S, lay.block, lay.stride, lay.select_block, dev)
    n_blocks = R.num_select_blocks(S, lay.select_block)
    scores = cache_mod.group_scores(probs, G, cols, vals.to(R._acc_dtype(q)), n_blocks)
    idx = R.select_blocks_at(scores, pos[:, None], lay.select_block, lay.num_selected, lay.num_initial,
                             lay.num_local)
    o_slc = _selected(q, t["k_slc"], t["v_slc"], idx[:, 0], pos, lay.select_block)
    size = t["k_win"].shape[1]
    held = torch.arange(size, device=dev)[None, :] <= pos[:, None]  # slot s holds a position iff s <= pos
    qg = q.reshape(B, 1, G, H // G, D).to(R._acc_dtype(q)) * scale
    keys, vals_w = t["k_win"].permute(0, 2, 1, 3)[:, None], t["v_win"].permute(0, 2, 1, 3)[:, None]
    o_win = R._attend(qg, keys, vals_w, held[:, None, None, :].expand(B, 1, G, size))
    return o_cmp, o_slc, o_win.reshape(B, 1, H, D).to(q.dtype), idx[:, 0], scores[:, 0]


def _selected(q: torch.Tensor, k_slc: torch.Tensor, v_slc: torch.Tensor, idx: torch.Tensor, pos: torch.Tensor,
              lp: int) -> torch.Tensor:
    """The step's selected branch over the blocks ``idx [B, G, n]`` (-1: unused)."""
    B, _, H, D = q.shape
    G = k_slc.shape[2]
    rows, groups = torch.arange(B, device=q.device), torch.arange(G, device=q.device)
    qg = q.reshape(B, 1, G, H // G, D).to(R._acc_dtype(q)) * D**-0.5
    blk = idx.clamp_min(0)
    n = blk.shape[-1]
    kb = k_slc.view(B, -1, lp, G, D).permute(0, 3, 1, 2, 4)
    vb = v_slc.view(B, -1, lp, G, D).permute(0, 3, 1, 2, 4)
    keys = kb[rows[:, None, None], groups[None, :, None], blk].reshape(B, 1, G, n * lp, D)
    vals = vb[rows[:, None, None], groups[None, :, None], blk].reshape(B, 1, G, n * lp, D)
    tok = blk[..., None] * lp + torch.arange(lp, device=q.device)
    seen = (idx[..., None] >= 0) & (tok <= pos[:, None, None, None])
    return R._attend(qg, keys, vals, seen.reshape(B, 1, G, n * lp)).reshape(B, 1, H, D).to(q.dtype)


def _check_choice(idx: torch.Tensor, want: torch.Tensor, scores: torch.Tensor, pos: torch.Tensor, lay: Layout,
                  tol: float) -> None:
    """``idx [B, G, n]`` is ``want`` or a choice the rule could make on ``scores [B, G, Ns]``
    up to rounding: distinct eligible blocks, ascending, -1 after, as many as ``want``, whose
    keys (forced blocks +inf, others their score), sorted, match ``want``'s within ``tol``
    times the row's largest score."""
    if torch.equal(idx, want):
        return
    ns = scores.shape[-1]
    j = torch.arange(ns)[None, None, :]
    own = (pos // lay.select_block)[:, None, None]
    eligible = j <= own
    forced = eligible & ((j < lay.num_initial) | (j > own - lay.num_local))
    sc = scores.double()
    key = torch.where(forced, torch.inf, torch.where(eligible, sc, -torch.inf))

    def keys(choice: torch.Tensor) -> torch.Tensor:
        k = torch.gather(key, -1, choice.clamp(0, ns - 1))
        return torch.where(choice >= 0, k, -torch.inf).sort(-1, descending=True).values

    used = idx >= 0
    assert torch.equal(used.sum(-1), (want >= 0).sum(-1)), (idx, want)
    assert ((idx[..., 1:] > idx[..., :-1]) | ~used[..., 1:]).all() and (used[..., 1:] <= used[..., :-1]).all()
    assert (~used | (torch.gather(key, -1, idx.clamp(0, ns - 1)) > -torch.inf)).all(), "an ineligible block"
    mine, theirs = keys(idx), keys(want)
    finite = torch.isfinite(mine) & torch.isfinite(theirs)
    scale = sc.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    close = torch.where(finite, (mine - theirs).abs() <= tol * scale, mine == theirs)
    assert close.all(), f"not a near-tie: {idx.tolist()} vs {want.tolist()}"


def _kernel(q: torch.Tensor, t: dict[str, torch.Tensor], pos: torch.Tensor, lay: Layout,
            splits: DK.DecodeSplits | None = None) -> tuple[torch.Tensor, ...]:
    return DK.nsa_decode_with_selection(q, t["k_cmp"], t["v_cmp"], t["k_slc"], t["v_slc"], t["k_win"],
                                        t["v_win"], pos, *lay.args(), splits=splits)


def _compare(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], q: torch.Tensor,
             t: dict[str, torch.Tensor], pos: torch.Tensor, lay: Layout, tol: float, what: str) -> None:
    """Kernel outputs (o_cmp, o_slc, o_win, idx) against the reference's (the same, and
    scores), computed in the kernels' dtype or (16-bit kernels) in fp32."""
    o_cmp, o_slc, o_win, idx = got
    r_cmp, r_slc, r_win, r_idx, r_scores = want
    for a, b in ((o_cmp, r_cmp), (o_slc, r_slc), (o_win, r_win)):
        assert a.shape == b.shape and (a.dtype == b.dtype or b.dtype == torch.float32), what
    _check_choice(idx, r_idx, r_scores, pos, lay, tol)
    if not torch.equal(idx, r_idx):  # a near-tie: the reference's maths on the kernels' choice
        r_slc = _selected(q, t["k_slc"], t["v_slc"], idx, pos, lay.select_block)
    for name, a, b in (("o_cmp", o_cmp, r_cmp), ("o_slc", o_slc, r_slc), ("o_win", o_win, r_win)):
        assert torch.isfinite(a).all(), f"{what} {name}"
        if b.abs().max() == 0:  # nothing visible (e.g. no compressed token yet): exactly 0
            assert a.abs().max() == 0, f"{what} {name}"
        else:
            assert rel_err(a.float(), b.float()) <= tol, f"{what} {name}: {rel_err(a.float(), b.float()):.2e}"


# ----------------------------------------------------------------------------- the decoder's own step


def _model(lay: Layout, n_heads: int, n_kv_heads: int, head_dim: int) -> torch.nn.Module:
    """One NSA layer (reference ops), fp32, weights of std 0.2: peaked attention, so the
    block ranking has clear winners (as tests/model/test_decode.py)."""
    acfg = AttentionConfig(kind="nsa", backend="reference", compress_block=lay.block,
                           compress_stride=lay.stride, select_block=lay.select_block,
                           num_selected=lay.num_selected, num_initial=lay.num_initial,
                           num_local=lay.num_local, window=lay.window)
    cfg = ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      head_dim=head_dim, ffn_hidden=64, attention=acfg, init_std=0.2)
    return build_model(cfg).eval()


def _decode_and_compare(model: torch.nn.Module, lay: Layout, lens: list[int], steps: int,
                        monkeypatch: pytest.MonkeyPatch, seed: int, exact_choice: bool = False) -> None:
    """Prefill right-padded prompts of lengths ``lens``, decode ``steps`` tokens, and after
    every step compare the kernels with what the step computed (``exact_choice``: the very
    blocks the step chose, no near-tie allowed)."""
    attn = model.blocks[0].attn
    seen: dict[str, object] = {}
    project, mix, rule = attn.project, attn.mix, cache_mod.select_blocks_at

    def record_project(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
        out = project(*args, **kwargs)
        seen["q"] = out[0]
        return out

    def record_mix(x: torch.Tensor, *branches: torch.Tensor, **kwargs: object) -> torch.Tensor:
        seen["branches"] = branches
        return mix(x, *branches, **kwargs)

    def record_rule(scores: torch.Tensor, *args: object) -> torch.Tensor:
        seen["scores"] = scores
        seen["idx"] = out = rule(scores, *args)
        return out

    tokens = torch.randint(0, 64, (len(lens), max(lens)))
    _, state = prefill(model, tokens, lens, max_new_tokens=steps)
    monkeypatch.setattr(attn, "project", record_project)
    monkeypatch.setattr(attn, "mix", record_mix)
    monkeypatch.setattr(cache_mod, "select_blocks_at", record_rule)
    cache = state.caches[0]
    for step in range(steps):
        pos = state.lengths.clone()
        decode_step(model, state, torch.randint(0, 64, (len(lens),)))
        q, t = seen["q"], cache.tensors
        assert isinstance(q, torch.Tensor)
        o_cmp, o_slc, o_win = seen["branches"]  # type: ignore[misc]
        idx, scores = seen["idx"], seen["scores"]
        assert isinstance(idx, torch.Tensor) and isinstance(scores, torch.Tensor)
        want = (o_cmp, o_slc, o_win, idx[:, 0], scores[:, 0])
        what = f"seed={seed} step {step} at {pos.tolist()}"
        # the replica used by the random-cache tests is the step's maths
        mine = _step_branches(q, t, pos, lay)
        assert torch.equal(mine[3], want[3]), f"{what}: _step_branches drifted from NSACache.step"
        for a, b in zip(mine, want):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"{what}: _step_branches drifted")
        got = _kernel(q, t, pos, lay)
        if exact_choice:
            assert torch.equal(got[3], want[3]), f"{what}: {got[3].tolist()} vs {want[3].tolist()}"
        _compare(got, want, q, t, pos, lay, TOL, what)


LAYOUT = Layout(block=8, stride=4, select_block=8, num_selected=4, num_initial=1, num_local=2, window=12)


def test_batch_of_different_positions_short_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positions 1..3, 7..9 (compressed token 0 completes at 7) and 21..23 (token 4 at 23):
    contexts shorter than the window, than n blocks, than one compression block; 2 heads per
    group."""
    seed = fresh_seed()
    _decode_and_compare(_model(LAYOUT, 4, 2, 16), LAYOUT, [1, 7, 21], 3, monkeypatch, seed)


def test_gqa_longer_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 heads per group (padded rows), head dim 8 (masked columns), l' = 2l (Eq. 9 spreads a
    token over two blocks), more blocks than n, positions across compression and selection
    block ends."""
    seed = fresh_seed()
    lay = Layout(block=8, stride=4, select_block=16, num_selected=3, num_initial=1, num_local=1, window=20)
    _decode_and_compare(_model(lay, 6, 2, 8), lay, [46, 30], 3, monkeypatch, seed)


def test_exact_ties_break_as_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """q = 0: the compressed attention is uniform and whole selection blocks tie exactly; the
    kernels sum each block's tokens in the reference's order, so they tie too and the
    tie-break (the lower block) alone decides: the same blocks as the step."""
    seed = fresh_seed()
    model = _model(LAYOUT, 4, 1, 16)
    torch.nn.init.zeros_(model.blocks[0].attn.q_proj.weight)
    _decode_and_compare(model, LAYOUT, [41, 57], 2, monkeypatch, seed, exact_choice=True)


# ----------------------------------------------------------------------------- random caches


def _random_cache(B: int, S: int, G: int, D: int, lay: Layout, dtype: torch.dtype = torch.float32
                  ) -> dict[str, torch.Tensor]:
    nc = R.num_compressed(S, lay.block, lay.stride)
    sizes = {"cmp": nc, "slc": S, "win": min(lay.window, S)}
    return {f"{kv}_{name}": torch.randn(B, n, G, D, dtype=dtype) for name, n in sizes.items() for kv in "kv"}


# every phase in one launch (decode_fused.py): unsplit (its selected program writes the
# output itself), split, and 33 scoring programs
ONE_LAUNCH = [DK.DecodeSplits(one_launch=True),
              DK.DecodeSplits(cmp=3, win=2, scores=3, selected=2, one_launch=True),
              DK.DecodeSplits(cmp=9, win=3, scores=33, selected=3, one_launch=True)]
LONG = Layout(block=8, stride=4, select_block=8, num_selected=5, num_initial=1, num_local=2, window=80)
# none; a few per phase; more than one chunk of partials merged at once (CA) and a deeper
# tree of candidate lists (33 scoring programs: 64 lists, most of them empty, 6 levels)
# the selected branch in one program, merged by its launch's last program (2, 3), or by a
# merge launch (more than MAX_FUSED_SLOTS); the branches' partials merged one program per
# head, or one per branch for all heads (as at a large batch)
SPLITS = [DK.DecodeSplits(), DK.DecodeSplits(cmp=3, win=2, scores=3, selected=2),
          DK.DecodeSplits(cmp=9, win=3, scores=33, selected=3),
          DK.DecodeSplits(cmp=2, win=2, scores=2, selected=DK.MAX_FUSED_SLOTS + 1),
          DK.DecodeSplits(cmp=3, win=2, scores=3, selected=2, head_merges=False),
          *ONE_LAUNCH]
SPLIT_IDS = ["one", "split", "many", "wide", "per-branch", "one-launch", "one-launch-split",
             "one-launch-many"]


@pytest.mark.parametrize("splits", SPLITS, ids=SPLIT_IDS)
def test_long_random_cache(splits: DK.DecodeSplits) -> None:
    """Long enough for several key tiles (79 compressed tokens, an 80-slot ring: 64-key
    tiles), 40 blocks (one score tile unsplit, 16-block tiles split), a full ring; and one
    sequence at position 9. Every phase split, or none."""
    seed = fresh_seed()
    B, S, H, G, D = 2, 320, 4, 2, 16
    t = _random_cache(B, S, G, D, LONG)
    q = 2 * torch.randn(B, 1, H, D)  # peaked: clear winners
    pos = torch.tensor([S - 3, 9])
    _compare(_kernel(q, t, pos, LONG, splits), _step_branches(q, t, pos, LONG), q, t, pos, LONG, TOL,
             f"seed={seed}")


@pytest.mark.parametrize("peaked", [True, False], ids=["peaked", "uniform"])
def test_a_share_of_several_score_tiles(peaked: bool) -> None:
    """81 selection blocks scored by one program: two tiles of ``MAX_SCORE_TILE`` (64) blocks,
    the second mostly past the share, merged into the running top-n one after the other;
    by three programs a 32-block tile each. Peaked queries (clear winners in either tile) and
    q = 0 (every interior block ties: the lowest must win across the tiles' boundary)."""
    seed = fresh_seed()
    B, S, H, G, D = 2, 648, 4, 2, 16
    assert -(-S // LONG.select_block) > DK.MAX_SCORE_TILE
    t = _random_cache(B, S, G, D, LONG)
    q = 2 * torch.randn(B, 1, H, D) if peaked else torch.zeros(B, 1, H, D)
    pos = torch.tensor([S - 1, 600])
    want = _step_branches(q, t, pos, LONG)
    for splits in SPLITS[:2]:
        got = _kernel(q, t, pos, LONG, splits)
        if not peaked:  # exact ties: exactly the step's blocks (peaked: a near-tie may differ)
            what = f"seed={seed} {splits}: {got[3].tolist()} vs {want[3].tolist()}"
            assert torch.equal(got[3], want[3]), what
        _compare(got, want, q, t, pos, LONG, TOL, f"seed={seed} {splits}")


@pytest.mark.parametrize("splits", SPLITS, ids=SPLIT_IDS)
def test_gated_sum_in_the_last_launch(splits: DK.DecodeSplits) -> None:
    """``nsa_decode_gated`` equals ``gated_combine_logits`` of the branches' outputs, the gate
    logits read in place from a slice of a wider projection (the step's) whose sequences
    are not adjacent; both ends of the selected branch's store (one program, or the
    combine of its split) write the gated sum."""
    from nsa.ops.triton.glue import gated_combine_logits

    seed = fresh_seed()
    B, S, H, G, D = 3, 320, 4, 2, 16
    t = _random_cache(B, S, G, D, LONG)
    q = 2 * torch.randn(B, 1, H, D)
    pos = torch.tensor([S - 3, 9, 150])
    joint = torch.randn(B, 1, 5 + 3 * H)
    logits = joint[..., 5:].view(B, 1, H, 3)
    args = (t["k_cmp"], t["v_cmp"], t["k_slc"], t["v_slc"], t["k_win"], t["v_win"], pos)
    got = DK.nsa_decode_gated(q, *args, logits, *LONG.args(), splits=splits)
    want = gated_combine_logits(logits, *DK.nsa_decode_branches(q, *args, *LONG.args(), splits=splits))
    assert got.shape == want.shape and got.dtype == want.dtype
    assert rel_err(got, want) <= TOL, f"seed={seed}"
    with pytest.raises(ValueError, match="each sequence's 4 x 3 contiguous"):
        DK.nsa_decode_gated(q, *args, logits.transpose(2, 3).contiguous().transpose(2, 3), *LONG.args())


def test_merge_tickets_serve_step_after_step() -> None:
    """A cache's counters for the selected launch's own merge, passed step after step: every
    launch leaves them zero (else the next would merge at the wrong program, before all
    partials are in), the gated sum and the branches both; each step equals the step's
    reference."""
    from nsa.ops.triton.decode_flash import decode_tickets
    from nsa.ops.triton.glue import gated_combine_logits

    seed = fresh_seed()
    B, S, H, G, D = 2, 320, 4, 2, 16
    t = _random_cache(B, S, G, D, LONG)
    tickets = decode_tickets(B * G, torch.device("cpu"))
    args = (t["k_cmp"], t["v_cmp"], t["k_slc"], t["v_slc"], t["k_win"], t["v_win"])
    for p in (S - 3, 100, 40):
        q = 2 * torch.randn(B, 1, H, D)
        pos = torch.tensor([p, p // 3])
        logits = torch.randn(B, 1, H, 3)
        got = DK.nsa_decode_branches(q, *args, pos, *LONG.args(), splits=SPLITS[1], tickets=tickets)
        assert torch.equal(tickets, torch.zeros_like(tickets))
        for name, a, b in zip(("cmp", "slc", "win"), got, _step_branches(q, t, pos, LONG)):
            assert rel_err(a, b) <= TOL, f"seed={seed} pos={pos.tolist()} {name}: {rel_err(a, b):.2e}"
        gated = DK.nsa_decode_gated(q, *args, pos, logits, *LONG.args(), splits=SPLITS[1], tickets=tickets)
        assert torch.equal(tickets, torch.zeros_like(tickets))
        assert rel_err(gated, gated_combine_logits(logits, *got)) <= TOL, f"seed={seed}"
    with pytest.raises(ValueError, match="want a contiguous int32 vector of at least 4"):
        DK.nsa_decode_branches(q, *args, pos, *LONG.args(), splits=SPLITS[1], tickets=tickets[:3])


def test_one_launch_counters_serve_step_after_step() -> None:
    """The one launch's four counters per (sequence, group) (decode_fused.COUNTERS), a cache's,
    passed step after step: each launch leaves them zero (else the next launch's programs
    would stop waiting too early), and each step equals the step's reference. Too few are
    refused, not overrun."""
    from nsa.infer.cache import NSACache
    from nsa.ops.triton.decode_fused import COUNTERS

    seed = fresh_seed()
    B, S, H, G, D = 2, 320, 4, 2, 16
    t = _random_cache(B, S, G, D, LONG)
    counters = torch.zeros(COUNTERS * B * G, dtype=torch.int32)
    args = (t["k_cmp"], t["v_cmp"], t["k_slc"], t["v_slc"], t["k_win"], t["v_win"])
    for p, splits in ((S - 3, ONE_LAUNCH[1]), (100, ONE_LAUNCH[0]), (40, ONE_LAUNCH[2])):
        q = 2 * torch.randn(B, 1, H, D)
        pos = torch.tensor([p, p // 3])
        got = DK.nsa_decode_branches(q, *args, pos, *LONG.args(), splits=splits, tickets=counters)
        assert torch.equal(counters, torch.zeros_like(counters)), f"{splits}: {counters.tolist()}"
        for name, a, b in zip(("cmp", "slc", "win"), got, _step_branches(q, t, pos, LONG)):
            assert rel_err(a, b) <= TOL, f"seed={seed} pos={pos.tolist()} {name}: {rel_err(a, b):.2e}"
        DK.nsa_decode_gated(q, *args, pos, torch.randn(B, 1, H, 3), *LONG.args(), splits=splits,
                            tickets=counters)
        assert torch.equal(counters, torch.zeros_like(counters)), f"{splits}: {counters.tolist()}"
    with pytest.raises(ValueError, match=f"want a contiguous int32 vector of at least {COUNTERS * B * G}"):
        DK.nsa_decode_branches(q, *args, pos, *LONG.args(), splits=ONE_LAUNCH[1], tickets=counters[:-1])
    # what a cache keeps for its steps serves either way
    from nsa.model import build_model
    from tests.model.nsa_model_testlib import small_cfg

    cfg = small_cfg("nsa", compress_block=8, compress_stride=4, select_block=16, window=16)
    attn = build_model(cfg).blocks[0].attn
    cache = NSACache(attn, 3, 64)
    cache.allocate(torch.float32, torch.device("cpu"))
    assert cache.tickets is not None and cache.tickets.numel() == COUNTERS * 3 * attn.n_kv_heads


def test_splits_agree_and_uniform_scores_tie() -> None:
    """q = 0 on a long random cache: every interior block ties exactly; split or not, the
    kernels choose the step's blocks (initial, local, then the lowest)."""
    seed = fresh_seed()
    B, S, H, G, D = 1, 256, 2, 1, 16
    t = _random_cache(B, S, G, D, LONG)
    q = torch.zeros(B, 1, H, D)
    pos = torch.tensor([S - 1])
    want = _step_branches(q, t, pos, LONG)
    for splits in SPLITS:
        got = _kernel(q, t, pos, LONG, splits)
        assert torch.equal(got[3], want[3]), f"seed={seed} {splits}: {got[3].tolist()} vs {want[3].tolist()}"
        _compare(got, want, q, t, pos, LONG, TOL, f"seed={seed} {splits}")


def test_blocks_are_ranked_by_the_group_sum() -> None:
    """Eq. 10 decides: compressed keys one-hot, so each head's logits are set token by token.
    Head 0 puts 0.45 on block 3 and 0.35 on block 5, head 1 0.35 on block 5 and 0.5 on block
    9: by the group's sum the two free slots go to blocks 5 and 9; by the largest head, or by
    head 0 alone, another pair would win."""
    lay = Layout(block=8, stride=4, select_block=8, num_selected=4, num_initial=1, num_local=1, window=8)
    B, S, H, G, D = 1, 128, 2, 1, 32
    t = _random_cache(B, S, G, D, lay)
    nc = t["k_cmp"].shape[1]
    t["k_cmp"] = torch.zeros(B, nc, G, D)
    t["k_cmp"][0, :D, 0] = torch.eye(nc, D)  # token i's key: e_i (token 2j lies in block j alone)
    logits = torch.zeros(H, D)
    logits[0, 6], logits[0, 10] = 4.17, 3.93  # blocks 3 and 5
    logits[1, 10], logits[1, 18] = 4.21, 4.57  # blocks 5 and 9
    q = (logits * D**0.5)[None, None]  # the kernels scale q.k by D**-0.5
    pos = torch.tensor([S - 1])
    want = _step_branches(q, t, pos, lay)
    assert want[3].tolist() == [[[0, 5, 9, 15]]]
    got = _kernel(q, t, pos, lay)
    assert torch.equal(got[3], want[3]), got[3].tolist()
    _compare(got, want, q, t, pos, lay, TOL, "group sum")


def test_odd_layout_and_capacity_below_a_compression_block() -> None:
    """A stride that divides neither block (l=10, d=6, l' = 4 < l: a token spreads over up to
    four blocks), n larger than the blocks that exist; then a cache too short to hold any
    compressed token (o_cmp = 0, scores 0: the forced blocks, then the lowest)."""
    seed = fresh_seed()
    lay = Layout(block=10, stride=6, select_block=4, num_selected=20, num_initial=2, num_local=1, window=7)
    B, S, H, G, D = 2, 72, 4, 1, 16
    t = _random_cache(B, S, G, D, lay)
    q = 2 * torch.randn(B, 1, H, D)
    pos = torch.tensor([S - 1, 33])
    _compare(_kernel(q, t, pos, lay), _step_branches(q, t, pos, lay), q, t, pos, lay, TOL, f"seed={seed}")
    short = _random_cache(B, 8, G, D, lay)
    assert short["k_cmp"].shape[1] == 0
    pos = torch.tensor([7, 2])
    got = _kernel(q, short, pos, lay)
    assert got[0].abs().max() == 0
    _compare(got, _step_branches(q, short, pos, lay), q, short, pos, lay, TOL, f"seed={seed} short")


def test_fp16_path_in_interpreter() -> None:
    """The 16-bit code path (tensor-core precision, the P cast) on CPU: fp16 dots are right
    in the interpreter (bf16 ones are not); the fp32 maths on the same fp16 inputs, 1e-2."""
    seed = fresh_seed()
    B, S, H, G, D = 2, 160, 4, 2, 16
    t = _random_cache(B, S, G, D, LONG, torch.float16)
    q = (2 * torch.randn(B, 1, H, D)).half()
    pos = torch.tensor([S - 1, 50])
    got = _kernel(q, t, pos, LONG)
    assert all(x.dtype == torch.float16 for x in got[:3])
    t32 = {k: v.float() for k, v in t.items()}
    _compare(got, _step_branches(q.float(), t32, pos, LONG), q.float(), t32, pos, LONG, 1e-2,
             f"seed={seed}")


class _Launches:
    """Stands in for a kernel: records ``kernel[grid](...)`` instead of running it."""

    def __init__(self, name: str, log: list[tuple[str, tuple[int, ...]]]) -> None:
        self.name, self.log = name, log

    def __getitem__(self, grid: tuple[int, ...]):  # noqa: ANN204 - a launcher
        return lambda *args, **kwargs: self.log.append((self.name, grid))


@pytest.mark.parametrize("splits,expected", [(DK.DecodeSplits(), 3), (SPLITS[1], 3), (SPLITS[3], 4),
                                             (SPLITS[4], 3), (ONE_LAUNCH[1], 1)])
def test_no_host_sync_and_launch_count(monkeypatch: pytest.MonkeyPatch, splits: DK.DecodeSplits,
                                       expected: int) -> None:
    """The wrapper reads nothing back from the device and builds nothing from host data (a
    CUDA graph can hold it): three launches, four when the selected branch is split more
    ways than its launch merges itself, one when every phase runs in one."""
    log: list[tuple[str, tuple[int, ...]]] = []
    launches = ("_decode_partials", "_decode_scores", "_decode_selected", "_decode_combine", "_decode_fused")
    for name in launches:
        monkeypatch.setattr(DK, name, _Launches(name, log))
    B, S, H, G, D = 2, 96, 4, 2, 16
    t = _random_cache(B, S, G, D, LAYOUT)
    q, pos = torch.randn(B, 1, H, D), torch.tensor([40, 9])
    with HostSyncs() as syncs:
        _kernel(q, t, pos, LAYOUT, splits)
    assert not syncs.events, syncs.report()
    assert len(log) == expected
    if splits.one_launch:  # partials, scoring programs, two merges, selected shares
        parts = splits.cmp + splits.win + splits.scores + 2 + splits.selected
        assert log == [("_decode_fused", (B * G, parts))]
        return
    # the (sequence, group) on axis 0, the part on axis 1: the GPU hands out every sequence's
    # scoring programs before the merges (per head, or per branch) that follow them on axis 1
    merges = 2 * (H // G) if splits.head_merges else 2
    assert log[:3] == [("_decode_partials", (B * G, splits.cmp + splits.win)),
                       ("_decode_scores", (B * G, splits.scores + merges)),
                       ("_decode_selected", (B * G, splits.selected))]


def test_plan_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """No split off CUDA; on a GPU, splits only while the batch leaves SMs idle, never below
    the minimum work per program; the partials merged per head until those merges alone
    would outnumber the programs planned per SM."""
    cpu = torch.device("cpu")
    assert DK.plan_splits(1, 1, 4095, 512, 1024, 16, cpu, heads_per_group=16) == DK.DecodeSplits()
    saved = DK._sm_count
    try:
        DK._sm_count = lambda device: 132  # type: ignore[assignment]
        gpu = torch.device("cuda")
        one = DK.plan_splits(1, 1, 4095, 512, 1024, 16, gpu, heads_per_group=16)
        # 16 compressed chunks at most (MAX_CMP_SPLITS), where 128 keys a chunk would give 31
        # and all of it in one launch: 62 programs, on at most half of the 132 SMs
        assert one == DK.DecodeSplits(cmp=16, win=4, scores=32, selected=8, one_launch=True)
        monkeypatch.setenv(DK.ONE_LAUNCH_ENV, "0")
        assert DK.plan_splits(1, 1, 4095, 512, 1024, 16, gpu, heads_per_group=16) == DK.DecodeSplits(
            cmp=16, win=4, scores=32, selected=8)
        monkeypatch.delenv(DK.ONE_LAUNCH_ENV)
        # two sequences: 124 programs, more than half the SMs: the phases in their own launches
        assert not DK.plan_splits(2, 1, 4095, 512, 1024, 16, gpu, heads_per_group=16).one_launch
        assert DK.plan_splits(3, 1, 511, 512, 128, 16, gpu, heads_per_group=16).one_launch  # 3 x 21 at 8k
        assert not DK.plan_splits(4, 1, 511, 512, 128, 16, gpu, heads_per_group=16).one_launch
        # nsa-125m at batch 64 and 64k: 2,048 per-head merges against 264 planned programs
        assert DK.plan_splits(64, 1, 4095, 512, 1024, 16, gpu, heads_per_group=16) == DK.DecodeSplits(
            cmp=5, win=4, scores=5, selected=5, head_merges=False)
        assert DK.plan_splits(8, 1, 4095, 512, 1024, 16, gpu, heads_per_group=16).head_merges  # 256 merges
        # a branch split past what one merge program reads at once (a 4k window in 22 chunks)
        # stays merged per head
        wide = DK.plan_splits(12, 1, 4095, 4096, 1024, 16, gpu, heads_per_group=16)
        assert wide.win == 22 and wide.head_merges, wide
        assert not DK.plan_splits(12, 1, 4095, 512, 1024, 16, gpu, heads_per_group=16).head_merges
        assert DK.plan_splits(512, 1, 4095, 512, 1024, 16, gpu, heads_per_group=16) == DK.DecodeSplits(
            head_merges=False)
        # a million-token context: the candidate lists' merge tree stays MAX_SCORE_SPLITS wide
        long = DK.plan_splits(1, 1, 65535, 512, 16384, 16, gpu, heads_per_group=16)
        assert long.scores == DK.MAX_SCORE_SPLITS
    finally:
        DK._sm_count = saved  # type: ignore[assignment]
    with pytest.raises(ValueError, match="at most 64 scoring programs"):
        DK.DecodeSplits(scores=DK.MAX_SCORE_SPLITS + 1)
    # the one rule plan_splits, the wrapper and bench.decode_kernel share: at most half the SMs
    # (66 programs of 132: 3 x 22, not 2 x 34) and one merge of the selected partials
    sp = DK.DecodeSplits(cmp=9, win=4, scores=3, selected=4)
    assert sp.programs() == 22 and sp.fits_one_launch(3, 132) and not sp.fits_one_launch(4, 132)
    assert not DK.DecodeSplits(cmp=16, win=4, scores=8, selected=4).fits_one_launch(2, 132)  # 34
    assert DK.DecodeSplits(selected=16).fits_one_launch(1, 132)
    assert not DK.DecodeSplits(selected=17).fits_one_launch(1, 132)
    assert not DK.DecodeSplits().fits_one_launch(1, 0)  # no SMs (off CUDA): never


# ----------------------------------------------------------------------------- GPU


NSA125 = Layout(block=32, stride=16, select_block=64, num_selected=16, num_initial=1, num_local=2, window=512)


def _gpu_case(B: int, S: int, H: int, G: int, D: int, dtype: torch.dtype
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    t = {k: v.to("cuda", dtype) for k, v in _random_cache(B, S, G, D, NSA125).items()}
    q = (2 * torch.randn(B, 1, H, D)).to("cuda", dtype)
    pos = torch.randint(S // 2, S, (B,), device="cuda")
    return q, t, pos


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("B,S,H,G", [(1, 8192, 16, 1), (3, 4096, 8, 2)])
def test_bf16_on_gpu(B: int, S: int, H: int, G: int) -> None:
    """bf16 kernels vs the step's fp32 maths on the same bf16-rounded inputs: 1e-2."""
    seed = fresh_seed()
    q, t, pos = _gpu_case(B, S, H, G, 64, torch.bfloat16)
    got = tuple(x.cpu() for x in _kernel(q, t, pos, NSA125))
    t32 = {k: v.float().cpu() for k, v in t.items()}
    want = _step_branches(q.float().cpu(), t32, pos.cpu(), NSA125)
    _compare(got, want, q.float().cpu(), t32, pos.cpu(), NSA125, 1e-2, f"seed={seed}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("splits", [None, *SPLITS], ids=["planned", *SPLIT_IDS])
def test_bf16_on_gpu_with_each_split(splits: DK.DecodeSplits | None) -> None:
    """Every way the launches split and merge, compiled and run by the hardware at batch 16
    (the interpreter runs one program at a time: an order of stores and loads between
    programs that a GPU need not keep); one launch at batch 1, which it fits. The plan for 16
    sequences of nsa-125m's layout merges per branch on any GPU of under 256 SMs, a path no
    other GPU test takes."""
    seed = fresh_seed()
    one = splits is not None and splits.one_launch  # one launch: as many sequences as fit the GPU
    B = 1 if one else 16
    q, t, pos = _gpu_case(B, 4096, 16, 1, 64, torch.bfloat16)
    if splits is None:
        n_cmp, n_blocks = t["k_cmp"].shape[1], -(-4096 // NSA125.select_block)
        plan = DK.plan_splits(16, 1, n_cmp, t["k_win"].shape[1], n_blocks, NSA125.num_selected, q.device,
                              heads_per_group=16)
        assert not plan.head_merges or DK._sm_count(q.device) >= 256, plan
    got = tuple(x.cpu() for x in _kernel(q, t, pos, NSA125, splits))
    t32 = {k: v.float().cpu() for k, v in t.items()}
    want = _step_branches(q.float().cpu(), t32, pos.cpu(), NSA125)
    _compare(got, want, q.float().cpu(), t32, pos.cpu(), NSA125, 1e-2, f"seed={seed} splits={splits}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_launch_on_gpu_step_after_step_and_from_a_graph() -> None:
    """Every phase in one launch at batch 1 (what plan_splits gives an H100 or H200 at 8k and
    64k): programs that wait on each other's counters, which only the hardware runs at the
    same time. Against the same splits in their own launches, eager and replayed from a CUDA
    graph with a cache's counters, the counters zero after every launch; too large a grid is
    refused before it could hold every SM."""
    fresh_seed()
    args = NSA125.args()
    for S in (8192, 65536):
        q, t, pos = _gpu_case(1, S, 16, 1, 64, torch.bfloat16)
        n_blocks = -(-S // NSA125.select_block)
        plan = DK.plan_splits(1, 1, t["k_cmp"].shape[1], t["k_win"].shape[1], n_blocks,
                              NSA125.num_selected, q.device, heads_per_group=16)
        assert plan.one_launch, plan
        kv = (t["k_cmp"], t["v_cmp"], t["k_slc"], t["v_slc"], t["k_win"], t["v_win"])
        counters = torch.zeros(4, dtype=torch.int32, device="cuda")
        in_launches = dataclasses.replace(plan, one_launch=False)
        launches = DK.nsa_decode_branches(q, *kv, pos, *args, splits=in_launches)
        static_pos = pos.clone()
        for _ in range(3):
            got = DK.nsa_decode_branches(q, *kv, static_pos, *args, splits=plan, tickets=counters)
            assert torch.equal(counters.cpu(), torch.zeros(4, dtype=torch.int32))
            for a, b in zip(got, launches):
                assert (a.float() - b.float()).abs().max().item() <= 1e-2 * b.float().abs().max().item()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            DK.nsa_decode_branches(q, *kv, static_pos, *args, splits=plan, tickets=counters)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = DK.nsa_decode_branches(q, *kv, static_pos, *args, splits=plan, tickets=counters)
        for _ in range(20):
            static_pos.copy_(torch.randint(S // 2, S, (1,), device="cuda"))
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(counters.cpu(), torch.zeros(4, dtype=torch.int32))
        fresh = DK.nsa_decode_branches(q, *kv, static_pos, *args, splits=in_launches)
        for a, b in zip(out, fresh):
            assert (a.float() - b.float()).abs().max().item() <= 1e-2 * b.float().abs().max().item()
    big = DK.DecodeSplits(cmp=16, win=4, scores=64, selected=16, one_launch=True)  # 102 programs
    assert big.programs() > DK._sm_count(q.device) // 2
    with pytest.raises(ValueError, match="does not fit on half"):
        DK.nsa_decode_branches(q, *kv, pos, *args, splits=big)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replays_the_kernels() -> None:
    """Captured once, a graph replays the launches with new positions and cache contents:
    no host sync inside, no shape that depends on them."""
    fresh_seed()
    q, t, pos = _gpu_case(2, 4096, 16, 1, 64, torch.bfloat16)
    static_pos = pos.clone()
    out = _kernel(q, t, static_pos, NSA125)  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _kernel(q, t, static_pos, NSA125)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _kernel(q, t, static_pos, NSA125)
    for _ in range(2):
        static_pos.copy_(torch.randint(100, 4096, (2,), device="cuda"))
        for v in t.values():
            v.normal_()
        graph.replay()
        fresh = _kernel(q, t, static_pos, NSA125)
        for a, b in zip(out, fresh):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_faster_than_the_torch_step_on_gpu() -> None:
    """nsa-125m's layer (16 heads, 1 group, dim 64, the paper's NSA settings) at 64k, batch
    1, bf16: the kernels take less time than the step's torch maths for the branches."""
    fresh_seed()
    q, t, pos = _gpu_case(1, 65536, 16, 1, 64, torch.bfloat16)

    def timed(fn) -> float:  # noqa: ANN001
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / 20

    kernels = timed(lambda: _kernel(q, t, pos, NSA125))
    torch_step = timed(lambda: _step_branches(q, t, pos, NSA125))
    print(f"\nbranches at 64k: kernels {kernels * 1e6:.0f} us, torch {torch_step * 1e6:.0f} us")
    assert kernels < torch_step


@triton.jit
def _start_order(TICKETS, SINK, SPIN: tl.constexpr):
    """Each program draws a ticket as it starts and stores it at its linear index (axis 0
    fastest), then keeps its slot busy for a while, so later programs wait for slots."""
    lin = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    ticket = tl.atomic_add(TICKETS, 1)
    tl.store(TICKETS + 1 + lin, ticket)
    acc = ticket.to(tl.float32)
    for _ in range(SPIN):
        acc = acc * 0.999 + 1.0
    tl.store(SINK + lin, acc)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gpu_starts_programs_in_linear_order_axis_0_fastest() -> None:
    """What the decode grids' order rests on (docs/kernels.md, "The order programs are
    handed out"): a launch of several waves starts its programs in the order of their
    linear index, axis 0 fastest. Tickets drawn at start against that index: a rank
    correlation near 1 (programs of one wave start together, in any order among them);
    axis 1 first would give about 0 on this grid."""
    nx, ny = 64, 256  # 16,384 one-warp programs: several times what 132 SMs hold
    tickets = torch.zeros(1 + nx * ny, dtype=torch.int32, device="cuda")
    sink = torch.empty(nx * ny, dtype=torch.float32, device="cuda")
    _start_order[(nx, ny)](tickets, sink, SPIN=4096, num_warps=1)
    got = tickets[1:].double()
    lin = torch.arange(nx * ny, dtype=torch.float64, device="cuda")
    assert sorted(got.long().tolist()) == list(range(nx * ny))  # each program drew one ticket
    rho = torch.corrcoef(torch.stack([lin, got]))[0, 1].item()
    print(f"\nstart order vs linear index (axis 0 fastest): rank correlation {rho:.3f}")
    assert rho > 0.9, rho
