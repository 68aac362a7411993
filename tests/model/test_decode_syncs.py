"""The decode step is capturable as a CUDA graph, checked on the CPU.

A CUDA graph replays recorded kernels on fixed buffers: a step may not read a device value
on the host, build a tensor from host data, give an op a data-dependent shape, or hand a
kernel a host value that changes from step to step (it would be frozen at capture). Here:
``nsa.syncs.HostSyncs`` sees no event in decode steps (batch 2 of different lengths, across
steps that complete a compression block) nor in choosing the next token; every step
dispatches the same ops with the same shapes and host arguments (so one captured step
replays any other); the step traces whole under ``torch.compile(fullgraph=True)`` with the
eager logits; ops per token stay under a recorded cap. ``DecodeRunner`` decodes eagerly on
the CPU and says so; the CUDA-graph path itself is checked by the ``gpu`` tests.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch
from nsa_model_testlib import count_triton_launches, peaked_model, small_cfg

from nsa.config import load_config
from nsa.infer import decode_step, generate, prefill, sample_next
from nsa.infer import fused as fused_mod
from nsa.infer import graph as graph_mod
from nsa.infer.decode import DecodeState, advance, compresses
from nsa.infer.graph import CUDA_GRAPH, EAGER, GRAPH_ENV, DecodeRunner, argmax, decode_path
from nsa.model import build_model
from nsa.syncs import HostSyncs, OpCounter, OpTrace

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# Ops dispatched by one decode step (batch 2, reference ops, fp32, torch 2.13 on CPU; views
# included), counted by test_ops_per_token_are_capped with nsa.syncs.OpCounter when the
# step's constants moved to allocate time and RoPE's angles to once per step, then to rows
# of a table made at prefill (two index ops per step where computing them took eight). Before
# that: 4,778 and 1,250. A change that adds ops per token fails here; one that removes some
# should lower the cap.
# ops of one decode step at batch 2, in all and those that run device work (OpCounter.launching:
# about one kernel each on a GPU), by the prompts' lengths: [40, 31] makes the step complete a
# compressed block in the second sequence (NSA then runs phi), [41, 33] in neither
MAX_OPS = {("nsa-125m", (40, 31)): (3942, 1690), ("nsa-125m", (41, 33)): (3150, 1357),
           ("dense-125m", (40, 31)): (1040, 480)}
# The same steps as the CUDA path runs them (``fused.fused_op`` pointed at the interpreter):
# ops with device work plus Triton launches, by the prompts' lengths (batch 2, fp32). Recorded
# when the residual adds moved into the output projections' GEMMs, SwiGLU's activation became
# one kernel, NSA's gated sum moved into its attention's last launch, a completed block's
# compression became ``decode_compress`` (5 launches per layer then, about 27 before) and dense
# attention ``dense_decode``, then when each block's two RMSNorms were folded into the GEMMs
# after them (finished by ``decode_write`` and ``silu_mul``) and RoPE's angles became rows of a
# table that the kernels read at ``pos``. Before, counted the same way: 329, 269 and 245 (the
# 24 norms at 6 ops each here, one kernel each on CUDA, and 8 ops of angles), 664, 331 and 294;
# when only the attention was fused (allocations counted then): 1,168, 835 and 486. On CPU
# the final RMSNorm is its formula (6 ops with device work; one kernel on CUDA), and masked GQA
# SDPA, which dense_decode replaced, was one op here and about a dozen kernels on an H200, so
# a GPU's counts differ. Then phi's GELU and second matmul moved into ``_compress_finish``
# (3 launches per layer where 5): a compressing NSA step 177 before.
MAX_LAUNCHES = {("nsa-125m", (40, 31)): 153, ("nsa-125m", (41, 33)): 117, ("dense-125m", (40, 31)): 93}
# torch.multinomial checks its probabilities on the host (a sync inside the op, which a
# dispatch mode does not see): the next token must be drawn without it.
SYNCING_OPS = {"aten.multinomial.default"}
LENS = [3, 10]  # batch 2 of different lengths
STEPS = 8


def _state(model: torch.nn.Module, steps: int = STEPS, seed: int = 0) -> tuple[DecodeState, torch.Tensor]:
    """Right-padded prompts of LENS tokens, prefilled with room for ``steps`` more, and the
    first new token per sequence (the argmax at each prompt's end)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 64, (len(LENS), max(LENS)), generator=g)
    logits, state = prefill(model, tokens, LENS, max_new_tokens=steps)
    return state, logits[torch.arange(len(LENS)), torch.tensor(LENS) - 1].argmax(-1)


def _completes_a_block(positions: list[int]) -> bool:
    """Whether a token at one of ``positions`` completes a compression block (i*d + l - 1)
    of the test models' NSA layout."""
    c = small_cfg("nsa").attention
    return any(p >= c.compress_block - 1 and (p - c.compress_block + 1) % c.compress_stride == 0
               for p in positions)


def _sampler(seed: int = 0) -> tuple[functools.partial[torch.Tensor], torch.Generator]:
    gen = torch.Generator().manual_seed(seed)
    return functools.partial(sample_next, temperature=0.9, top_k=20, top_p=0.9, generator=gen), gen


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_decode_steps_make_no_host_sync(kind: str) -> None:
    """Every step (all layers, then a temperature / top-k / top-p draw of the next token)
    records no host read, data-dependent shape or upload; some of the steps complete a
    compression block in one sequence and not in the other."""
    model = peaked_model(kind)
    state, tok = _state(model, steps=STEPS + 1)
    choose, gen = _sampler()
    runner = DecodeRunner(model, state, choose, generator=gen)
    completing = 0
    for i in range(STEPS):
        positions = [n + i for n in LENS]
        completing += _completes_a_block(positions)
        with HostSyncs() as syncs:
            tok = runner.step(tok)
        assert not syncs.events, f"step {i}:\n{syncs.report()}"
    assert completing == 3  # position 7 in one sequence, 11 and 15 in the other (l=8, d=4)
    with HostSyncs() as syncs:  # the plain eager step too
        decode_step(model, state, tok)
    assert not syncs.events, syncs.report()


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, None, None), (0.9, None, None), (0.9, 5, None),
                                                     (1.3, 40, 0.9), (0.7, None, 0.5)])
def test_choosing_the_next_token_makes_no_host_sync(temperature: float, top_k: int | None,
                                                     top_p: float | None) -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 320) * 3
    gen = torch.Generator().manual_seed(0)
    with HostSyncs() as syncs, OpCounter() as ops:
        sample_next(logits, temperature, top_k, top_p, gen)
    assert not syncs.events, syncs.report()
    assert not SYNCING_OPS & set(ops.ops), ops.ops


def test_a_draw_is_the_one_multinomial_makes() -> None:
    """The sync-free draw (argmax of p / Exp(1) noise) picks the token torch.multinomial
    picks for the same generator state: same distribution, same samples for a seed."""
    torch.manual_seed(1)
    logits = torch.randn(3, 64) * 2
    ours, ref = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _ in range(50):
        got = sample_next(logits, 0.8, generator=ours)
        want = torch.multinomial(torch.softmax(logits.float() / 0.8, -1), 1, generator=ref)[:, 0]
        assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_every_step_dispatches_the_same_ops(kind: str) -> None:
    """Steps of one kind (an NSA step that completes a compression block in some sequence,
    or one that completes none: each kind has its own graph) at other positions dispatch the
    same ops on the same shapes with the same host arguments: what one captured step records
    is right for every later step of its kind. Steps that complete a block in one sequence
    and not in the other are of the first kind."""
    model = peaked_model(kind)
    state, tok = _state(model)
    choose, gen = _sampler()
    runner = DecodeRunner(model, state, choose, generator=gen)
    traces: dict[bool, list[OpTrace]] = {True: [], False: []}
    for _ in range(STEPS):
        step_kind = compresses(model, state)
        with OpTrace() as trace:
            tok = runner.step(tok)
        traces[step_kind].append(trace)
    # nsa: both kinds occur (a compressing step runs phi: more ops); dense: one kind
    assert [len(traces[k]) > 0 for k in (True, False)] == ([True, True] if kind == "nsa" else [True, False])
    if kind == "nsa":
        assert len(traces[True][0].ops) > len(traces[False][0].ops)
    for same in traces.values():
        for i, t in enumerate(same[1:], 1):
            assert len(same[0].ops) > 100
            differs = same[0].first_difference(t)
            assert differs is None, f"step {i} of its kind differs from the first at {differs}"


@pytest.mark.parametrize("name,lens", list(MAX_OPS))
def test_ops_per_token_are_capped(name: str, lens: tuple[int, int]) -> None:
    """configs/nsa-125m.yaml and configs/dense-125m.yaml (random weights): the ops one decode
    step dispatches, against MAX_OPS; no host sync there either."""
    torch.manual_seed(0)
    model = build_model(load_config(CONFIGS / f"{name}.yaml").model).eval()
    tokens = torch.randint(0, 320, (2, max(lens)))
    _, state = prefill(model, tokens, list(lens), max_new_tokens=2)  # past l = 32
    assert compresses(model, state) == (lens == (40, 31) or name == "dense-125m")
    tok = torch.zeros(2, dtype=torch.long)
    with HostSyncs() as syncs, OpCounter() as ops:
        decode_step(model, state, tok)
    assert not syncs.events, syncs.report()
    total, launching = MAX_OPS[name, lens]
    assert ops.total <= total, f"{name} {lens}: {ops.total} ops per token, cap {total}"
    assert ops.launching <= launching, f"{name} {lens}: {ops.launching} ops with device work, cap {launching}"


@pytest.mark.parametrize("name,lens", list(MAX_LAUNCHES))
def test_the_cuda_paths_launches_are_capped(monkeypatch: pytest.MonkeyPatch, name: str,
                                            lens: tuple[int, int]) -> None:
    """The step's fused kernels (decode_write, the decode attention, the gate-logit combine)
    and the joint projection, as a step on CUDA runs them, with the interpreter on CPU: the
    ops with device work plus the Triton launches per token, against MAX_LAUNCHES (the ops
    the interpreter itself dispatches inside a launch are not counted)."""
    triton_ops = pytest.importorskip("nsa.ops.triton")

    monkeypatch.setattr(fused_mod, "fused_op", lambda backend, x, op: getattr(triton_ops, op))
    torch.manual_seed(0)
    model = build_model(load_config(CONFIGS / f"{name}.yaml").model).eval()
    # one token short: a first step (not counted) builds the joint projection's weights
    _, state = prefill(model, torch.randint(0, 320, (2, max(lens) - 1)), [n - 1 for n in lens],
                       max_new_tokens=2)
    counter = OpCounter()
    kernels = count_triton_launches(monkeypatch, counter)
    tok = torch.zeros(2, dtype=torch.long)
    decode_step(model, state, tok)
    kernels.clear()
    assert compresses(model, state) == (lens == (40, 31) or name == "dense-125m")
    with HostSyncs() as syncs, counter:
        decode_step(model, state, tok)
    assert not syncs.events, syncs.report()
    layers = len(model.blocks)
    assert kernels["_step_write"] == layers, kernels
    got = counter.launching + sum(kernels.values())
    cap = MAX_LAUNCHES[name, lens]
    assert got <= cap, f"{name} {lens}: {counter.launching} ops + {sum(kernels.values())} launches, cap {cap}"


@pytest.mark.skipif(not torch._dynamo.is_dynamo_supported(), reason="torch.compile does not run here")
@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_decode_step_compiles_fullgraph(kind: str) -> None:
    """``advance`` (the device work of a step) traces as one graph (a graph break is an
    error), once for all positions (no recompilation as they move), and gives the eager
    logits and positions at every step."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = peaked_model(kind)
    eager, tok = _state(model)
    compiled, _ = _state(model)
    step = torch.compile(advance, fullgraph=True, backend="aot_eager")
    for i in range(6):
        want = advance(model, eager.caches, eager.lengths, tok)
        got = step(model, compiled.caches, compiled.lengths, tok)
        torch.testing.assert_close(got, want, msg=f"step {i}")
        assert torch.equal(compiled.lengths, eager.lengths)
        tok = want.argmax(-1)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_decode_path_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GRAPH_ENV, raising=False)
    assert decode_path("cuda")[0] == CUDA_GRAPH
    assert decode_path("cuda:1", graph=True)[0] == CUDA_GRAPH
    assert decode_path("cuda", graph=False) == (EAGER, "graph turned off by the caller")
    assert decode_path("cpu") == (EAGER, "no CUDA graphs on cpu")
    assert decode_path("cpu", graph=True)[0] == EAGER
    monkeypatch.setenv(GRAPH_ENV, "0")
    assert decode_path("cuda") == (EAGER, f"{GRAPH_ENV}=0")


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_runner_decodes_eagerly_on_cpu_as_decode_step_does(kind: str) -> None:
    """On the CPU the runner is the eager path (and says so): its tokens and logits are
    decode_step's followed by the argmax, step for step."""
    model = peaked_model(kind)
    state, tok = _state(model)
    ref_state, ref_tok = _state(model)
    runner = DecodeRunner(model, state, graph=True)
    assert runner.path == EAGER and "cpu" in runner.describe()
    for _ in range(STEPS):
        tok = runner.step(tok)
        logits = decode_step(model, ref_state, ref_tok)
        ref_tok = argmax(logits)
        assert torch.equal(runner.logits, logits) and torch.equal(tok, ref_tok)
    assert (runner.steps, runner.replays, state.longest) == (STEPS, 0, ref_state.longest)


def test_runner_checks_capacity_on_the_host() -> None:
    """The cache holds max(lengths) + max_new_tokens positions: one step more is refused
    from the host's count, with no device read."""
    model = peaked_model("nsa")
    state, tok = _state(model, steps=2)
    runner = DecodeRunner(model, state)
    tok = runner.step(runner.step(tok))
    with HostSyncs() as syncs, pytest.raises(ValueError, match="max_new_tokens"):
        runner.step(tok)
    assert not syncs.events, syncs.report()


def test_a_failed_capture_warns_and_decodes_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced onto the graph path on the CPU, the capture fails (no CUDA graphs here): the
    runner warns, says why, and goes on eagerly with decode_step's results."""
    monkeypatch.setattr(graph_mod, "decode_path", lambda device, graph=None: (CUDA_GRAPH, "forced"))
    model = peaked_model("nsa")
    state, tok = _state(model)
    ref_state, ref_tok = _state(model)
    runner = DecodeRunner(model, state, warmup=0)
    assert runner.path == CUDA_GRAPH
    with pytest.warns(RuntimeWarning, match="capture failed"):
        tok = runner.step(tok)
    assert runner.path == EAGER and "capture failed" in runner.why
    assert torch.equal(tok, argmax(decode_step(model, ref_state, ref_tok)))
    assert state.longest == ref_state.longest and torch.equal(state.lengths, ref_state.lengths)


def test_sampling_logs_its_decode_path(caplog: pytest.LogCaptureFixture) -> None:
    model = peaked_model("dense")
    with caplog.at_level(logging.INFO, logger="nsa.infer.sample"):
        generate(model, [[1, 2, 3]], 4, temperature=0.5, seed=1)
    assert any("decode path: eager (no CUDA graphs on cpu)" in r.getMessage() for r in caplog.records)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cuda_state(model: torch.nn.Module, steps: int) -> tuple[DecodeState, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 64, (len(LENS), max(LENS)), generator=g).cuda()
    logits, state = prefill(model, tokens, LENS, max_new_tokens=steps)
    return state, logits[torch.arange(len(LENS)), torch.tensor(LENS) - 1].argmax(-1)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kind,backend", [("nsa", "reference"), ("nsa", "triton"), ("dense", "reference")])
def test_cuda_graph_replays_the_eager_step(kind: str, backend: str) -> None:
    """On CUDA the runner captures after its warm-up steps and replays: greedy tokens equal
    the eager runner's and the logits agree (fp32), for 20 steps across block boundaries."""
    if backend == "triton":
        pytest.importorskip("triton")
    model = peaked_model(kind, backend=backend).cuda()
    steps = 20
    g_state, g_tok = _cuda_state(model, steps)
    e_state, e_tok = _cuda_state(model, steps)
    graphed = DecodeRunner(model, g_state)
    eager = DecodeRunner(model, e_state, graph=False)
    assert graphed.path == CUDA_GRAPH and eager.path == EAGER
    seen: Counter[bool] = Counter()
    for i in range(steps):
        seen[compresses(model, g_state)] += 1
        g_tok, e_tok = graphed.step(g_tok), eager.step(e_tok)
        assert torch.equal(g_tok, e_tok), f"step {i}"
        torch.testing.assert_close(graphed.logits, eager.logits, rtol=1e-5, atol=1e-5, msg=f"step {i}")
    # each kind of step: its warm-up steps eagerly, then captured and replayed
    warm = sum(min(n, graphed.warmup) for n in seen.values())
    assert graphed.path == CUDA_GRAPH and graphed.warm_steps == warm and graphed.replays == steps - warm
    assert set(graphed.graphs) == {k for k, n in seen.items() if n > graphed.warmup}
    assert len(graphed.graphs) == (2 if kind == "nsa" else 1)
    assert torch.equal(g_state.lengths, e_state.lengths)


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_sampling_is_reproducible() -> None:
    """A draw inside the graph uses the registered generator: the same seed gives the same
    tokens, another seed other tokens, and every replay draws afresh."""
    model = peaked_model("nsa").cuda()

    def run(seed: int) -> list[list[int]]:
        state, tok = _cuda_state(model, 16)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        choose = functools.partial(sample_next, temperature=1.5, generator=gen)
        runner = DecodeRunner(model, state, choose, generator=gen)
        out = [runner.step(tok) for _ in range(16)]
        assert runner.path == CUDA_GRAPH and runner.replays > 0
        return torch.stack(out, 1).tolist()

    a = run(1)
    assert a == run(1) and a != run(2)
