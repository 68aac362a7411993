"""train.cuda_graph, checked on the CPU: what a graph of the micro-step relies on, and the
trainer's graphed path.

A CUDA graph replays the launches it recorded, with the host arguments they had, on the
buffers they used. So every micro-step must dispatch the same ops with the same shapes and
host arguments (the Triton kernels' included), and the backward must add into the same
gradient buffers in place. Both are checked here on nsa-125m's and dense-125m's layouts.
The trainer's graphed path (gradients zeroed in place, the loss over the accumulation) must
train exactly as the eager one. The capture and its proof against eager need a GPU: the
``gpu`` test at the end.
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
from nsa.train.graphed import GraphedMicroStep, graph_refusal
from nsa.train.telemetry import RunRecord
from tests.train.test_step_syncs import trainer_at
from tests.train.trainrun import read_jsonl

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_runs_that_cannot_replay_say_why() -> None:
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert graph_refusal(cuda, 1, "ddp", None) is None
    assert graph_refusal(cpu, 1, "ddp", None) == "no CUDA graphs on cpu"
    assert "2 processes" in (graph_refusal(cuda, 2, "ddp", None) or "")
    assert "fsdp" in (graph_refusal(cuda, 1, "fsdp", None) or "")
    assert "debug.nan_at_step" in (graph_refusal(cuda, 1, "ddp", 3) or "")


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
    step._zero_grads()  # as prepare leaves them: allocated, zero
    buffers = [p.grad.data_ptr() for p in step.params if p.grad is not None]
    torch.manual_seed(1)
    batches = [torch.randint(0, 256, (1, 129)) for _ in range(3)]
    losses = []
    for tokens in batches:
        with OpTrace(values=False) as trace:  # the loss, a device value, differs
            traces.append(trace)
            losses.append(step.step(tokens))
    assert len(traces[0].ops) > 200 and len(set(float(x) for x in losses)) == 3
    if name.startswith("nsa"):
        assert any(op[0] == "_sel_bwd_dkdv" for op in traces[0].ops)
    for i, trace in enumerate(traces[1:], 1):
        differs = traces[0].first_difference(trace)
        assert differs is None, f"micro-step {i}: {differs}"
    assert [p.grad.data_ptr() for p in step.params if p.grad is not None] == buffers
    # and they accumulate: the same batch again adds the same gradient
    step._zero_grads()
    step.step(batches[-1])
    once = [p.grad.clone() for p in step.params if p.grad is not None]
    assert len(once) == len(step.params) and all(float(g.abs().sum()) > 0 for g in once[:3])
    step.step(batches[-1])
    for p, g1 in zip(step.params, once):
        torch.testing.assert_close(p.grad, 2 * g1)


def test_the_trainers_graphed_path_trains_as_the_eager_one(tmp_path: Path) -> None:
    """The trainer's graphed branch (the step's micro-steps through ``GraphedMicroStep``,
    gradients zeroed in place) gives the eager loop's losses exactly, with accumulation; on the
    CPU train.cuda_graph says why it steps eagerly."""
    sets = ["train.grad_accum=2"]
    logs: list[str] = []
    with trainer_at(tmp_path / "eager", sets + ["train.cuda_graph=true"]) as trainer:
        trainer.log = logs.append
        trainer.record = RunRecord(trainer.run_dir, RunInfo(run_id="rid"))
        assert trainer.run() == "finished"
        assert trainer.micro is None
    assert [m for m in logs if m.startswith("train.cuda_graph")] == \
        ["train.cuda_graph: eager micro-steps: no CUDA graphs on cpu"]
    info = read_json(tmp_path / "eager" / "run" / "run.json", RunInfo)
    assert info is not None and info.cuda_graph == CudaGraph(replayed=False, reason="no CUDA graphs on cpu")
    eager = [r["loss"] for r in read_jsonl(tmp_path / "eager" / "run" / "metrics.jsonl")
             if r.get("kind", "train") == "train"]
    with trainer_at(tmp_path / "graphed", sets) as trainer:
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        trainer.micro = GraphedMicroStep(trainer._loss, params, trainer.grad_accum)  # its eager fallback
        trainer.micro._zero_grads()
        assert trainer.run() == "finished"
        assert all(p.grad is not None for p in params)  # zeroed in place, never freed
    graphed = [r["loss"] for r in read_jsonl(tmp_path / "graphed" / "run" / "metrics.jsonl")
               if r.get("kind", "train") == "train"]
    assert len(eager) == len(graphed) >= 5 and eager == graphed


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nsa-125m", "dense-125m"])
def test_the_graph_replays_eagers_micro_steps(name: str) -> None:
    """On CUDA: ``prepare`` captures and proves the graph; replayed micro-steps with
    accumulation give eager's losses and gradients."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cfg = load_config(CONFIGS / f"{name}.yaml", ["model.n_layers=2"])
    if cfg.model.attention.kind == "nsa":
        cfg.model.attention.backend = "triton"
    vocab = cfg.model.vocab_size
    runs = []
    for graphed in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg.model).cuda()

        def loss_fn(tokens: torch.Tensor, model: Any = model) -> torch.Tensor:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(tokens[:, :-1])
            return F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))

        step = GraphedMicroStep(loss_fn, list(model.parameters()), divisor=2)
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
