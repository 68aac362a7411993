"""Real torchrun (gloo, CPU) runs of nsa-train: DDP, FSDP2, exact resume, world-size change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsa.train.schedule import lr_at
from tests.train.trainrun import beats, metrics, read_jsonl, run_json, run_train

pytestmark = pytest.mark.timeout(300)

# 2 ranks x batch 1 x accumulation 2 = global batch 4; checkpoints at steps 3 and 6.
BASE = ["train.batch_size=1", "train.grad_accum=2", "train.steps=6", "train.save_every=3",
        "debug.record_rank_state=true"]


def losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run_dir)}


def rank_records(run_dir: Path, rank: int) -> list[dict]:
    return read_jsonl(run_dir / "debug" / f"rank-{rank}.jsonl")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 2-rank DDP run: the yardstick for every resume below."""
    done = run_train(tmp_path_factory.mktemp("ref") / "run", BASE)
    assert done.rc == 0, done.output[-3000:]
    # each rank freed the process group before exiting (the DDP wrapper dropped first): gloo's
    # threads are not left for interpreter shutdown, where they can abort a finished rank
    assert "process group was not freed" not in done.output, done.output[-3000:]
    assert done.output.count("finished 6 steps") >= 1, done.output[-3000:]
    assert "world size 2 (ddp)" in done.output, done.output[-3000:]
    return done.run_dir


def test_two_ranks_batch_one_trains_with_equal_params_and_disjoint_data(reference: Path) -> None:
    run = run_json(reference)
    assert run["status"] == "finished" and run["world_size"] == 2
    assert (run["batch_size"], run["grad_accum"], run["global_batch"]) == (1, 2, 4)
    recs = {r: rank_records(reference, r) for r in (0, 1)}
    digests = {r: [x["param_digest"] for x in recs[r] if "param_digest" in x] for r in (0, 1)}
    assert digests[0] and digests[0] == digests[1], "ranks ended with different parameters"
    seen = {r: [x["digest"] for x in recs[r] if "digest" in x] for r in (0, 1)}
    assert len(seen[0]) == len(seen[1]) == 6 * 2  # 6 steps x 2 micro-batches on each rank
    assert not set(seen[0]) & set(seen[1]), "the two ranks trained on the same batches"
    assert len(set(seen[0])) == 12, "a rank saw the same batch twice"
    m = metrics(reference)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6]
    assert all(x["tokens"] == x["step"] * 4 * 64 for x in m)
    assert m[-1]["loss"] < m[0]["loss"]
    for b in (beats(reference, 0), beats(reference, 1)):
        assert [x["step"] for x in b if x["source"] == "step"] == [1, 2, 3, 4, 5, 6]
        assert b[-1]["phase"] == "done"


def test_lr_schedule_counts_optimizer_steps_with_accumulation(reference: Path) -> None:
    for m in metrics(reference):  # grad_accum 2: still one schedule step per optimizer step
        want = lr_at(m["step"] - 1, lr=3e-3, min_lr=3e-4, warmup_steps=2, total_steps=6)
        assert m["lr"] == pytest.approx(want, rel=1e-12)
    assert metrics(reference)[-1]["lr"] == pytest.approx(3e-4)


def test_stop_and_resume_equals_uninterrupted(reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = run_train(run_dir, BASE + ["debug.stop_at_step=3"])
    assert first.rc == 0, first.output[-3000:]
    run = run_json(run_dir)
    assert run["status"] == "stopped" and run["step"] == 3
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-3"
    second = run_train(run_dir, BASE, resume="auto")
    assert second.rc == 0, second.output[-3000:]
    assert "resume from" in second.output and "at step 3" in second.output
    assert run_json(run_dir)["status"] == "finished"
    got, want = losses(run_dir), losses(reference)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        assert got[step] == pytest.approx(want[step], rel=1e-6, abs=1e-7), f"step {step}"
    # and the data: the resumed run saw exactly the batches the uninterrupted one did
    for r in (0, 1):
        a = [x["digest"] for x in rank_records(run_dir, r) if "digest" in x]
        b = [x["digest"] for x in rank_records(reference, r) if "digest" in x]
        assert a == b


def test_resume_two_rank_checkpoint_on_one_rank_keeps_global_batch(reference: Path, tmp_path: Path) -> None:
    ckpt = reference / "checkpoints" / "step-3"
    done = run_train(tmp_path / "one", BASE[:-1], nproc=1, resume=str(ckpt))
    assert done.rc == 0, done.output[-3000:]
    assert "grad_accum 2 -> 4 keeps the global batch of 4 sequences" in done.output
    run = run_json(done.run_dir)
    assert (run["world_size"], run["grad_accum"], run["global_batch"]) == (1, 4, 4)
    assert run["resumed_from"] == str(ckpt)
    got, want = losses(done.run_dir), losses(reference)
    assert sorted(got) == [4, 5, 6]  # the step count continues
    for step in (4, 5, 6):  # same sequences per step; only the reduction order differs
        assert got[step] == pytest.approx(want[step], rel=1e-5), f"step {step}"
    assert metrics(done.run_dir)[-1]["tokens"] == 6 * 4 * 64


GRAPHED = BASE + ["train.cuda_graph=true"]
FAKE_GRAPHS = "tests.train.fake_graph_train"  # nsa-train with FakeGraphs for CUDA's capture


def test_cuda_graphs_on_two_ranks_train_as_ddp_does(reference: Path, tmp_path: Path) -> None:
    """train.cuda_graph on 2 ranks, the fake standing in for CUDA's capture: no DDP wrapper (its
    hooks cannot be captured); each rank proves and replays its graph, the gradients are
    averaged in one all-reduce per step, and the run gives DDP's losses and parameters exactly
    (an average of two is exact either way). It stops, saves and resumes as DDP's does."""
    run_dir = tmp_path / "run"
    first = run_train(run_dir, GRAPHED + ["debug.stop_at_step=3"], module=FAKE_GRAPHS)
    assert first.rc == 0, first.output[-3000:]
    assert "world size 2 (ddp: no DDP wrapper, gradients averaged in one all-reduce per step" in first.output
    said = [line for line in first.output.splitlines() if "train.cuda_graph:" in line]
    assert len(said) == 1 and "train.cuda_graph: replayed: one CUDA graph per micro-step" in said[0], said
    assert "gradients averaged over 2 ranks in one all-reduce of" in said[0]
    graph = run_json(run_dir)["cuda_graph"]
    assert graph["replayed"] and "checked against eager" in graph["reason"], graph
    got, want = losses(run_dir), losses(reference)
    assert sorted(got) == [1, 2, 3] and all(got[s] == want[s] for s in got), (got, want)
    second = run_train(run_dir, GRAPHED, resume="auto", module=FAKE_GRAPHS)
    assert second.rc == 0, second.output[-3000:]
    assert "at step 3" in second.output and "train.cuda_graph: replayed" in second.output
    got = losses(run_dir)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    for step in range(4, 7):
        assert got[step] == pytest.approx(want[step], rel=1e-6, abs=1e-7), f"step {step}"
    digests = [[x["param_digest"] for x in rank_records(run_dir, r) if "param_digest" in x] for r in (0, 1)]
    assert digests[0] and digests[0] == digests[1], "ranks ended with different parameters"


def test_a_graph_that_fails_on_one_rank_leaves_every_rank_eager(reference: Path, tmp_path: Path) -> None:
    """Rank 1's capture fails: no rank replays (the log names the rank and why), every rank
    steps eagerly with the same one all-reduce per step, and the run still gives DDP's losses."""
    done = run_train(tmp_path / "run", GRAPHED, module=FAKE_GRAPHS, env={"FAKE_GRAPH_FAULT": "capture:1"})
    assert done.rc == 0, done.output[-3000:]
    said = [line for line in done.output.splitlines() if "train.cuda_graph:" in line]
    assert len(said) == 1, said
    assert "train.cuda_graph: eager micro-steps: rank 1: the capture failed: RuntimeError" in said[0], said
    assert "rank 0:" not in said[0]
    assert run_json(done.run_dir)["cuda_graph"]["replayed"] is False
    got, want = losses(done.run_dir), losses(reference)
    assert sorted(got) == [1, 2, 3, 4, 5, 6] and all(got[s] == want[s] for s in got), (got, want)


def test_fsdp2_trains_and_resumes(reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "fsdp"
    sets = BASE + ["train.strategy=fsdp"]
    first = run_train(run_dir, sets + ["debug.stop_at_step=3"])
    assert first.rc == 0, first.output[-3000:]
    assert run_json(run_dir)["status"] == "stopped"
    meta = json.loads((run_dir / "checkpoints" / "step-3" / "meta.json").read_text())
    assert meta["strategy"] == "fsdp" and meta["world_size"] == 2
    second = run_train(run_dir, sets, resume="auto")
    assert second.rc == 0, second.output[-3000:]
    assert run_json(run_dir)["status"] == "finished"
    got, want = losses(run_dir), losses(reference)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):  # FSDP2 reduce-scatter vs DDP all-reduce: same maths, other order
        assert got[step] == pytest.approx(want[step], rel=1e-5), f"step {step}"
    d0 = [x["param_digest"] for x in rank_records(run_dir, 0) if "param_digest" in x]
    d1 = [x["param_digest"] for x in rank_records(run_dir, 1) if "param_digest" in x]
    assert d0 and d0 == d1


def test_fsdp2_checkpoint_resumes_on_one_rank(tmp_path: Path, reference: Path) -> None:
    src = tmp_path / "fsdp2"
    sets = BASE[:-1] + ["train.strategy=fsdp", "train.steps=6"]
    first = run_train(src, sets + ["debug.stop_at_step=3"])
    assert first.rc == 0, first.output[-3000:]
    done = run_train(tmp_path / "one", sets, nproc=1, resume=str(src))  # a run dir: its newest checkpoint
    assert done.rc == 0, done.output[-3000:]
    assert "grad_accum 2 -> 4" in done.output
    got, want = losses(done.run_dir), losses(reference)
    assert sorted(got) == [4, 5, 6]
    for step in (4, 5, 6):
        assert got[step] == pytest.approx(want[step], rel=1e-5), f"step {step}"


def test_one_rank_checkpoint_resumes_on_two_ranks_by_resharding(tmp_path: Path) -> None:
    src = tmp_path / "one"
    sets = ["train.batch_size=1", "train.grad_accum=2", "train.steps=4", "train.save_every=2"]
    first = run_train(src, sets + ["debug.stop_at_step=2"], nproc=None)
    assert first.rc == 0, first.output[-3000:]
    done = run_train(tmp_path / "two", sets + ["debug.record_rank_state=true"],
                     resume=str(src / "checkpoints" / "step-2"))
    assert done.rc == 0, done.output[-3000:]
    assert "grad_accum 2 -> 1 keeps the global batch of 2 sequences" in done.output
    assert "re-sharding into 2 streams" in done.output
    assert sorted(losses(done.run_dir)) == [3, 4]
    seen = [[x["digest"] for x in rank_records(done.run_dir, r) if "digest" in x] for r in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == 2 and not set(seen[0]) & set(seen[1])
