"""train.cuda_graph, checked on the CPU: what a graph of the micro-step relies on, the proof
that decides whether a run uses one, and the trainer's graphed path.

A CUDA graph replays the launches it recorded, with the host arguments they had, on the
buffers they used. So every micro-step must dispatch the same ops with the same shapes and
host arguments (the Triton kernels' included), and the backward must add into the same
gradient buffers in place. Both are checked here on nsa-125m's and dense-125m's layouts.
The capture itself needs a GPU; ``FakeGraphs`` stands in for it (the one thing faked: the
CUDA calls behind ``CudaGraphs``), faithful or with a planted fault, to check the proof
against eager and the trainer's path around it. The real capture is the ``gpu`` test at
the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from nsa.config import load_config
from nsa.contract import CudaGraph, RunInfo, read_json
from nsa.model import build_model
from nsa.syncs import OpTrace
from nsa.train import trainer as trainer_module
from nsa.train.graphed import GraphedMicroStep, graph_refusal
from nsa.train.telemetry import RunRecord
from tests.train.fake_graphs import FakeGraphs
from tests.train.test_step_syncs import trainer_at
from tests.train.trainrun import read_jsonl

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_runs_that_cannot_replay_say_why() -> None:
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert graph_refusal(cuda, "ddp", None) is None  # one process, or several without DDP's wrapper
    assert graph_refusal(cpu, "ddp", None) == "no CUDA graphs on cpu"
    assert "fsdp" in (graph_refusal(cuda, "fsdp", None) or "")
    assert "debug.nan_at_step" in (graph_refusal(cuda, "ddp", 3) or "")


def micro_step(name: str) -> tuple[GraphedMicroStep, int]:
    cfg = load_config(CONFIGS / f"{name}.yaml", ["model.n_layers=2", "model.dim=128"])
    if cfg.model.attention.kind == "nsa":
        cfg.model.attention.backend = "triton"
    torch.manual_seed(0)
    model = build_model(cfg.model)
    vocab = cfg.model.vocab_size

    def loss_fn(tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    return GraphedMicroStep(loss_fn, list(model.parameters()), divisor=2), vocab


@pytest.mark.parametrize("name", ["nsa-125m", "dense-125m"])
def test_every_micro_step_is_the_one_a_graph_records(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Micro-steps on other tokens dispatch the same ops and Triton launches with the same
    arguments, and add into the gradients in place: the buffers a capture would have recorded."""
    step, vocab = micro_step(name)
    traces: list[OpTrace] = []
    if name.startswith("nsa"):
        pytest.importorskip("nsa.ops.triton")
        from triton.runtime.interpreter import InterpretedFunction

        launch = InterpretedFunction.run

        def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
            trace = traces[-1] if traces else None
            before = len(trace.ops) if trace is not None else 0
            try:
                return launch(self, *args, **kwargs)
            finally:
                if trace is not None:  # the launch with its arguments, not the interpreter's own ops
                    del trace.ops[before:]
                    grid = kwargs.get("grid")
                    named = dict(kwargs, grid=grid(kwargs) if callable(grid) else grid)
                    trace.ops.append((self.fn.__name__, *(OpTrace.signature(a, False) for a in args),
                                      *sorted((k, OpTrace.signature(v, False)) for k, v in named.items())))

        monkeypatch.setattr(InterpretedFunction, "run", traced)
    torch.manual_seed(1)
    step.step(torch.randint(0, 256, (1, 129)))  # warm-up, as before a capture (RoPE's table is made)
    step._zero_grads()  # as prepare leaves them: allocated, zero
    buffers = [p.grad.data_ptr() for p in step.params if p.grad is not None]
    batches = [torch.randint(0, 256, (1, 129)) for _ in range(2)]  # other tokens, other blocks chosen
    losses = []
    for tokens in batches:
        with OpTrace(values=False) as trace:  # the loss, a device value, differs
            traces.append(trace)
            losses.append(step.step(tokens))
    assert len(traces[0].ops) > 200 and float(losses[0]) != float(losses[1])
    if name.startswith("nsa"):
        assert any(op[0] == "_sel_bwd_dkdv" for op in traces[0].ops)
    for i, trace in enumerate(traces[1:], 1):
        differs = traces[0].first_difference(trace)
        assert differs is None, f"micro-step {i}: {differs}"
    assert [p.grad.data_ptr() for p in step.params if p.grad is not None] == buffers
    if name.startswith("nsa"):
        return  # accumulating is autograd's, the same for both layouts: checked on the faster one
    # and they accumulate: the same batch again adds the same gradient
    step._zero_grads()
    step.step(batches[-1])
    once = [p.grad.clone() for p in step.params if p.grad is not None]
    assert len(once) == len(step.params) and all(float(g.abs().sum()) > 0 for g in once[:3])
    step.step(batches[-1])
    for p, g1 in zip(step.params, once):
        torch.testing.assert_close(p.grad, 2 * g1)


def proving(name: str, fault: str | None = None) -> tuple[GraphedMicroStep, FakeGraphs]:
    step, _ = micro_step(name)
    fake = FakeGraphs(fault)
    fake.params = step.params
    step.graphs = fake
    return step, fake


def test_the_proof_passes_a_faithful_graph_and_replays_it() -> None:
    """With a capture that replays the micro-step faithfully, ``prepare`` proves it and leaves
    zero gradients; steps replay it, and give eager's losses and gradients, accumulated."""
    step, fake = proving("dense-125m")
    torch.manual_seed(3)
    assert step.prepare(torch.randint(0, 256, (1, 129)))
    assert step.graphed and "checked against eager" in step.why and fake.captures == 1 and fake.replays == 2
    assert all(float(p.grad.abs().sum()) == 0 for p in step.params)
    eager, _ = micro_step("dense-125m")
    eager._zero_grads()
    torch.manual_seed(4)
    batches = [torch.randint(0, 256, (1, 129)) for _ in range(2)]
    got = [float(step.step(b)) for b in batches]
    want = [float(eager.step(b)) for b in batches]
    assert fake.replays == 4 and got == want
    for a, b in zip(step.params, eager.params):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize(("fault", "said"), [
    ("capture", "the capture failed: RuntimeError: CUDA error: operation not permitted when stream is "
                "capturing"),
    ("loss", "the replayed loss"),
    ("lost", "the replayed gradient of parameter 1 has norm 0,"),
    ("overwrite", "a second replay did not add to the gradients"),
])
def test_a_graph_that_fails_its_proof_is_not_used_and_says_why(fault: str, said: str) -> None:
    step, _ = proving("dense-125m", fault)
    torch.manual_seed(3)
    assert not step.prepare(torch.randint(0, 256, (1, 129)))
    assert not step.graphed and step.why.startswith(said), step.why
    assert all(p.grad is not None and float(p.grad.abs().sum()) == 0 for p in step.params)
    eager, _ = micro_step("dense-125m")
    batch = torch.randint(0, 256, (1, 129))
    assert float(step.step(batch)) == float(eager.step(batch))  # eager, as it would have been


def test_the_trainers_graphed_path_trains_as_the_eager_one(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """train.cuda_graph on the CPU: refused, said in the log and run.json, eager steps. With the
    fake standing in for a GPU's capture, the trainer's own path (the proof on random tokens
    before the first step, micro-steps replayed with accumulation, gradients zeroed in place)
    gives exactly the eager run's losses: the proof leaves nothing behind."""
    sets = ["train.grad_accum=2", "train.cuda_graph=true"]
    runs = {}
    for kind in ("eager", "graphed"):
        logs: list[str] = []
        with trainer_at(tmp_path / kind, sets) as trainer:
            trainer.log = logs.append
            trainer.record = RunRecord(trainer.run_dir, RunInfo(run_id="rid"))
            if kind == "graphed":  # this machine has no CUDA: the fake stands in for it
                monkeypatch.setattr(trainer_module, "graph_refusal", lambda *a: None)
                trainer.graphs = fake = FakeGraphs()
            assert trainer.run() == "finished"
            graphed = trainer.micro is not None
            assert all(p.grad is not None for p in trainer.model.parameters()) == graphed  # zeroed in place
        info = read_json(tmp_path / kind / "run" / "run.json", RunInfo)
        assert info is not None and info.cuda_graph is not None
        said = [m for m in logs if m.startswith("train.cuda_graph")]
        runs[kind] = [r["loss"] for r in read_jsonl(tmp_path / kind / "run" / "metrics.jsonl")
                      if r.get("kind", "train") == "train"]
        if kind == "eager":
            assert said == ["train.cuda_graph: eager micro-steps: no CUDA graphs on cpu"]
            assert info.cuda_graph == CudaGraph(replayed=False, reason="no CUDA graphs on cpu")
        else:
            assert graphed and len(said) == 1
            assert said[0].startswith("train.cuda_graph: replayed: one CUDA graph"), said
            assert info.cuda_graph.replayed and "checked against eager" in info.cuda_graph.reason
            assert fake.replays == 2 + 2 * len(runs[kind])  # the proof's two, then two micro-steps a step
    assert len(runs["eager"]) >= 5 and runs["eager"] == runs["graphed"]


def cuda_micro_step(name: str) -> GraphedMicroStep:
    """A seeded two-layer model of ``name``'s layout on CUDA and its micro-step (bf16 autocast,
    fp32 loss, accumulation 2)."""
    cfg = load_config(CONFIGS / f"{name}.yaml", ["model.n_layers=2"])
    if cfg.model.attention.kind == "nsa":
        cfg.model.attention.backend = "triton"
    vocab = cfg.model.vocab_size
    torch.manual_seed(0)
    model = build_model(cfg.model).cuda()

    def loss_fn(tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))

    return GraphedMicroStep(loss_fn, list(model.parameters()), divisor=2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nsa-125m", "dense-125m"])
def test_the_graph_replays_eagers_micro_steps(name: str) -> None:
    """On CUDA: ``prepare`` captures and proves the graph; replayed micro-steps with
    accumulation give eager's losses and gradients."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    runs = []
    for graphed in (False, True):
        step = cuda_micro_step(name)
        g = torch.Generator(device="cuda").manual_seed(1)
        if graphed:
            example = torch.randint(0, 256, (4, 1025), device="cuda", generator=g)
            assert step.prepare(example), step.why
        else:
            step._zero_grads()
        g.manual_seed(2)
        losses = [float(step.step(torch.randint(0, 256, (4, 1025), device="cuda", generator=g)))
                  for _ in range(2)]
        runs.append((losses, [p.grad.float().clone() for p in step.params]))
    (want_loss, want), (got_loss, got) = runs
    assert got_loss == pytest.approx(want_loss, rel=1e-3)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_on_cuda_the_trainer_replays_its_micro_steps_with_eagers_losses(tmp_path: Path, kind: str) -> None:
    """On CUDA: a one-process trainer with train.cuda_graph proves its graph, says so, and trains
    (bf16 autocast, accumulation 2) to the eager trainer's losses."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    runs = {}
    for graph in (False, True):
        logs: list[str] = []
        sets = ["train.grad_accum=2", f"model.attention.kind={kind}",
                f"train.cuda_graph={str(graph).lower()}"]
        with trainer_at(tmp_path / str(graph), sets, device="cuda") as trainer:
            trainer.log = logs.append
            assert trainer.run() == "finished"
            assert (trainer.micro is not None) == graph, logs
        runs[graph] = [r["loss"] for r in read_jsonl(tmp_path / str(graph) / "run" / "metrics.jsonl")
                       if r.get("kind", "train") == "train"]
        if graph:
            assert [m for m in logs if m.startswith("train.cuda_graph: replayed: ")], logs
    assert len(runs[False]) >= 5
    assert runs[True] == pytest.approx(runs[False], rel=2e-2)


@pytest.mark.gpu
def test_a_graph_adds_into_flat_gradient_views() -> None:
    """On CUDA: gradients that are views of ``FlatGrads``' buffer (DDP ranks with
    train.cuda_graph) are what the captured backward adds into: replayed micro-steps leave
    eager's gradients in the buffer, and its all-reduce (a one-rank gloo group here) keeps them."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import torch.distributed as dist

    from nsa.train.gradsync import FlatGrads

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        runs = []
        for graphed in (False, True):
            step = cuda_micro_step("dense-125m")
            flat = FlatGrads(step.params, world_size=1)
            g = torch.Generator(device="cuda").manual_seed(1)
            if graphed:
                assert step.prepare(torch.randint(0, 256, (4, 513), device="cuda", generator=g)), step.why
            g.manual_seed(2)
            for _ in range(2):
                step.step(torch.randint(0, 256, (4, 513), device="cuda", generator=g))
            flat.average()  # raises if a gradient left the buffer
            runs.append(flat.flats[0].clone())
        want, got = runs
        assert float(got.abs().sum()) > 0
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-5)
    finally:
        dist.destroy_process_group()
