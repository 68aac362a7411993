"""Incremental decoding with KV caches equals the full forward, position by position.

The oracle is the model's own forward over the whole sequence (fp32): prefill a prompt,
feed the rest one token at a time, and the logits at every position must match the
forward's (relative error <= 1e-4, the max over positions of max|diff| / max|ref| over the
vocabulary). Tiny blocks (l=8, d=4, l'=8 or 16, w=12 or 20, n < Ns) make 53 tokens cross
many compression, selection and window boundaries; prompts are shorter and longer than a
selection block and than the window. GQA: 4 query heads in 2 groups (and in 1). Weights
are drawn with std 0.2 (not 0.02) so attention is peaked and the block ranking has clear
winners: a wrong selection changes the logits by far more than the tolerance.
"""

from __future__ import annotations

import pytest
import torch
from nsa_model_testlib import peaked_model, set_gates

from nsa.infer import cache as cache_mod
from nsa.infer import decode_step, prefill
from nsa.infer import fused as fused_mod
from nsa.model.layers import RMSNorm
from nsa.ops import reference

SEQ = 53
TOL = 1e-4
VOCAB = 64
CONFIGS = {
    "l'=l": {},  # l=8, d=4, l'=8, n=4, w=12
    "l'=2l": dict(select_block=16, num_selected=3, window=20),  # Eq. 9 spreads over two blocks
}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max over positions of max|got - want| / max|want| (over the last dim)."""
    return float(((got - want).abs().amax(-1) / want.abs().amax(-1)).max())


def decoded_logits(model: torch.nn.Module, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Logits ``[B, T, V]`` at every position: the prefill's for the prompt, then one
    decode step per remaining token."""
    T = tokens.shape[1]
    logits, state = prefill(model, tokens[:, :prompt_len], max_new_tokens=T - prompt_len)
    rows = [logits]
    for t in range(prompt_len, T):
        rows.append(decode_step(model, state, tokens[:, t])[:, None])
    return torch.cat(rows, dim=1)


def _check(model: torch.nn.Module, T: int, prompt_lens: list[int], seed: int = 1) -> float:
    torch.manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        full = model(tokens)
    worst = 0.0
    for p in prompt_lens:
        err = rel_err(decoded_logits(model, tokens, p), full)
        assert err <= TOL, f"prompt {p}: relative error {err:.2e}"
        worst = max(worst, err)
    return worst


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_nsa_decoding_equals_forward(name: str, n_kv_heads: int) -> None:
    # prompts: one token, shorter than l' and w, longer than l' and w, most of the sequence
    _check(peaked_model("nsa", n_kv_heads=n_kv_heads, **CONFIGS[name]), SEQ, [1, 5, 13, 40])


def test_dense_decoding_equals_forward() -> None:
    _check(peaked_model("dense"), SEQ, [1, 5, 13, 40])


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_batch_of_different_lengths_equals_each_alone(kind: str) -> None:
    """Right-padded prompts of lengths 3, 17 and 9 (padded to 20: past the longest too),
    then 20 tokens each: every sequence's logits are those of the forward over that
    sequence alone."""
    model = peaked_model(kind, **CONFIGS["l'=l"])
    lens, new = [3, 17, 9], 20
    torch.manual_seed(2)
    seqs = [torch.randint(0, VOCAB, (n + new,)) for n in lens]
    padded = torch.zeros(len(lens), max(lens) + 3, dtype=torch.long)
    for b, n in enumerate(lens):
        padded[b, :n] = seqs[b][:n]
        padded[b, n:] = 7  # padding: any token
    logits, state = prefill(model, padded, lens, max_new_tokens=new)
    steps = [decode_step(model, state, torch.stack([s[n + i] for s, n in zip(seqs, lens)]))
             for i in range(new)]
    for b, n in enumerate(lens):
        with torch.no_grad():
            alone = model(seqs[b][None])[0]
        got = torch.cat([logits[b, :n], torch.stack([s[b] for s in steps])])
        assert rel_err(got, alone) <= TOL, f"sequence {b} (prompt {n})"


def test_capacity_is_enforced() -> None:
    model = peaked_model("nsa")
    _, state = prefill(model, torch.zeros(1, 4, dtype=torch.long), max_new_tokens=1)
    decode_step(model, state, torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode_step(model, state, torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("wrong", ["no local block", "no initial block", "per-head scores"])
def test_a_wrong_selection_rule_fails(monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    """The equivalence test can fail: decoding with a perturbed selection (the local or
    initial block not forced, or each group ranking blocks by its first head's scores
    instead of the sum over its heads) gives logits outside the tolerance."""
    rule, scores_of = reference.select_blocks_at, cache_mod.group_scores

    def rule_off(scores, t, select_block, num_selected, num_initial, num_local):
        if wrong == "no local block":
            num_local -= 1
        else:
            num_initial -= 1
        return rule(scores, t, select_block, num_selected, num_initial, num_local)

    def first_head(probs, n_kv_heads, *band):
        B, C, H, Nc = probs.shape
        grouped = probs.view(B, C, n_kv_heads, H // n_kv_heads, Nc)
        return scores_of(grouped[:, :, :, :1].expand_as(grouped).reshape(probs.shape), n_kv_heads, *band)

    if wrong == "per-head scores":
        monkeypatch.setattr(cache_mod, "group_scores", first_head)
    else:
        monkeypatch.setattr(cache_mod, "select_blocks_at", rule_off)
    with pytest.raises(AssertionError, match="relative error"):
        _check(peaked_model("nsa", **CONFIGS["l'=l"]), SEQ, [5])


@pytest.mark.parametrize("kind,ties", [("nsa", False), ("nsa", True), ("dense", False)])
def test_triton_path_decoding_equals_forward(kind: str, ties: bool) -> None:
    """The Triton ops (the interpreter on CPU): prefill and the forward use the kernels
    (the fused compressed attention + top-n among them); the one-query step uses the
    kernels' RoPE and gated combine. ``ties``: q = 0, whole blocks tie exactly (see
    test_exact_ties_break_as_in_training), and the kernels' choice is the decoder's.
    Short: the interpreter is slow."""
    pytest.importorskip("triton")
    model = peaked_model(kind, backend="triton")
    if ties:
        for block in model.blocks:
            torch.nn.init.zeros_(block.attn.q_proj.weight)
    _check(model, 33, [5, 13])

# the fused ops each kind of step asks for: NSA's compression, its attention and gated sum in
# the branches' launches (``nsa_decode_gated``), or with forced gates the branches then the combine
FUSED_OPS = {"nsa": {"decode_compress", "nsa_decode_gated"},
             "nsa, forced gates": {"decode_compress", "nsa_decode_gated", "nsa_decode_branches",
                                   "gated_combine_logits"},
             "dense": {"dense_decode"}}


@pytest.mark.parametrize("kind", list(FUSED_OPS))
def test_the_steps_fused_kernels_decode_as_the_forward(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The kernels a step runs on CUDA (``fused.fused_op``: the rotations and cache writes in
    one ``decode_write``, NSA's compression of a completed block (``decode_compress``), its
    branches and their gated sum or dense's ``dense_decode``,
    SwiGLU's ``silu_mul``, the norms folded into the GEMMs after them and the residual adds
    inside the GEMMs), run here by the interpreter on CPU tensors: decoding still equals the
    forward at every position, across compression blocks and the window ring's wrap-around
    (short: the interpreter is slow). The norms' gains are not ones and the gates' biases not
    zeros (a fold that dropped either would pass with those). Forced gates (a test's
    override) take the branches, then the model's own combine."""
    triton_ops = pytest.importorskip("nsa.ops.triton")
    used: set[str] = set()

    def on_cpu(backend: str, x: torch.Tensor, name: str) -> object:
        used.add(name)
        return getattr(triton_ops, name)

    monkeypatch.setattr(fused_mod, "fused_op", on_cpu)
    model = peaked_model(kind.split(",")[0], backend="triton")
    _uneven_norms_and_biases(model)
    if kind == "nsa, forced gates":
        set_gates(model, (0.2, 0.5, 0.3))
    _check(model, 27, [5])
    assert used == {"decode_write", "silu_mul"} | FUSED_OPS[kind]


def _uneven_norms_and_biases(model: torch.nn.Module) -> None:
    """Gains that are not ones and biases that are not zeros: a fold that dropped either would
    pass on a freshly initialised model."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.weight.uniform_(0.5, 1.5)
            elif isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.uniform_(-1.0, 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_bf16_fused_decoding_is_as_close_to_the_forward_as_the_torch_ops(monkeypatch: pytest.MonkeyPatch,
                                                                         kind: str) -> None:
    """bf16 on CUDA, where a step's norms are folded into its GEMMs and the kernels round
    where the torch ops do not: the fused step's logits stay within twice the distance of the
    same model's torch-ops decoding from the bf16 forward (1e-2 at least), at every position."""
    pytest.importorskip("triton")
    model = peaked_model(kind, backend="triton")
    _uneven_norms_and_biases(model)
    model = model.to("cuda", torch.bfloat16)
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 27), device="cuda")
    with torch.no_grad():
        full = model(tokens).float()
    fused = decoded_logits(model, tokens, 5).float()
    monkeypatch.setattr(fused_mod, "fused_op", lambda backend, x, name: None)
    torch_ops = decoded_logits(model, tokens, 5).float()
    got, theirs = rel_err(fused, full), rel_err(torch_ops, full)
    assert got <= max(2 * theirs, 1e-2), f"fused {got:.2e}, torch ops {theirs:.2e}"


def test_a_joint_projection_is_its_linears_side_by_side() -> None:
    """``JointProjection`` (the step's one GEMM for q, K/V and gates on CUDA): each view is
    its linear's output, with and without biases, as views of one output."""
    torch.manual_seed(0)
    linears = [torch.nn.Linear(12, 8, bias=False), torch.nn.Linear(12, 6, bias=False), torch.nn.Linear(12, 9)]
    x = torch.randn(3, 1, 12)
    for mods, shapes in ((linears, [(2, 4), (3, 2), (3, 3)]), (linears[:2], [(8,), (2, 3)])):
        views = fused_mod.JointProjection(mods).project(x, shapes)
        for m, shape, got in zip(mods, shapes, views, strict=True):
            assert got.shape == (3, 1, *shape)
            torch.testing.assert_close(got.reshape(3, 1, -1), m(x), rtol=1e-6, atol=1e-6)
        assert views[0].untyped_storage().data_ptr() == views[1].untyped_storage().data_ptr()


def test_a_joint_projection_folds_the_norm_before_it() -> None:
    """With the RMSNorm folded in, the GEMM takes the raw input and its views lack only the
    row's ``1 / rms(x)`` and the last linear's bias (what ``decode_write`` and ``silu_mul``
    add); a bias on another linear is refused (nothing would add it)."""
    torch.manual_seed(0)
    linears = [torch.nn.Linear(12, 8, bias=False), torch.nn.Linear(12, 9)]
    norm = RMSNorm(12)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = 3.0 * torch.randn(3, 1, 12)
    rms = x.pow(2).mean(-1, keepdim=True).add(norm.eps).sqrt()
    views = fused_mod.JointProjection(linears, norm).project(x, [(8,), (9,)])
    for m, got in zip(linears, views, strict=True):
        want = (m(norm(x)) - (0.0 if m.bias is None else m.bias)) * rms
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="only the last linear"):
        fused_mod.JointProjection(linears[::-1], norm)


@pytest.mark.parametrize("block,d,lp", [(8, 4, 8), (8, 4, 16), (32, 16, 64), (16, 4, 8), (6, 3, 4),
                                        (5, 5, 7)])
def test_banded_scores_equal_the_reference(block: int, d: int, lp: int) -> None:
    """The decoder's Eq. 9 band holds exactly the nonzero overlap weights of the reference's
    dense matrix, and its group scores equal ``_scores_from_probs`` (fp64, up to rounding)."""
    T = 97
    cols, vals = cache_mod.overlap_band(T, block, d, lp, torch.device("cpu"))
    W = reference._overlap_matrix(T, block, d, lp, torch.device("cpu"))
    dense = torch.zeros_like(W).index_put_((torch.arange(W.shape[0])[:, None].expand_as(cols), cols), vals,
                                           accumulate=True)
    assert torch.equal(dense, W)
    torch.manual_seed(0)
    probs = torch.rand(2, 5, 4, W.shape[0], dtype=torch.float64)
    got = cache_mod.group_scores(probs, 2, cols, vals, W.shape[1])
    torch.testing.assert_close(got, reference._scores_from_probs(probs, 2, W), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tie_break", ["lower block (the rule)", "higher block"])
def test_exact_ties_break_as_in_training(monkeypatch: pytest.MonkeyPatch, tie_break: str) -> None:
    """With q = 0 the compressed attention is uniform and whole selection blocks get exactly
    equal scores: which of them is chosen is decided by the tie-break alone. Decoding
    matches the forward with the rule's tie-break (towards the lower block) and not with
    the opposite one (ties nudged towards the higher block in fp64, below any real gap)."""
    model = peaked_model("nsa", **CONFIGS["l'=l"])
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.q_proj.weight)
    if tie_break == "higher block":
        rule = reference.select_blocks_at

        def to_higher(scores, t, *args):
            bump = 1e-12 * torch.arange(scores.shape[-1], dtype=torch.float64)
            return rule(scores.double() + bump, t, *args)

        monkeypatch.setattr(cache_mod, "select_blocks_at", to_higher)
        with pytest.raises(AssertionError, match="relative error"):
            _check(model, SEQ, [5])
    else:
        _check(model, SEQ, [1, 5, 13, 40])
