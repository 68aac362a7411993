"""The nsa-train command line and the run-directory contract (docs/run-directory.md)."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.test_train_data import write_fineweb_parquet
from tests.train.trainrun import REPO, SMOKE, beats, metrics, run_json, run_train, train_env

RUN_KEYS = {"run_id", "name", "status", "exit_reason", "config_path", "config", "param_count", "world_size",
            "batch_size", "grad_accum", "global_batch", "seq_len", "dtype", "device", "data_source",
            "command", "versions", "host", "started_at", "updated_at", "ended_at", "step", "total_steps",
            "tokens", "resumed_from", "parent_run", "attention_ops", "train_flops_per_token"}
BEAT_KEYS = {"ts", "run_id", "rank", "local_rank", "world_size", "pid", "host", "device", "phase",
             "phase_since", "step", "source"}
TRAIN_KEYS = {"kind", "ts", "step", "loss", "lr", "tokens", "tokens_per_s", "step_time_s", "grad_norm",
              "gate_shares", "mem_allocated_bytes", "mem_reserved_bytes"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsa.train", *args], cwd=REPO, env=train_env(),
                          capture_output=True, text=True, timeout=60)


def test_no_config_is_an_error_not_a_default(tmp_path: Path) -> None:
    res = cli("--run-dir", str(tmp_path / "r"))
    assert res.returncode == 2 and "--config" in res.stderr
    assert not (tmp_path / "r").exists()


def test_bad_config_names_the_key_and_starts_nothing(tmp_path: Path) -> None:
    res = cli("--config", str(SMOKE), "--run-dir", str(tmp_path / "r"), "--set", "train.max_grad_norm=1")
    assert res.returncode == 2
    assert "train.max_grad_norm" in res.stderr and "unknown key" in res.stderr
    assert not (tmp_path / "r").exists()


def test_a_run_directory_holds_one_run(tmp_path: Path) -> None:
    rd = tmp_path / "r"
    rd.mkdir()
    (rd / "run.json").write_text('{"run_id": "older-run", "status": "finished"}')
    res = cli("--config", str(SMOKE), "--run-dir", str(rd))
    assert res.returncode == 2 and "already holds run older-run" in res.stderr
    assert sorted(p.name for p in rd.iterdir()) == ["run.json"]  # nothing written


@pytest.mark.timeout(120)
def test_single_process_nsa_run_on_fineweb_columns_writes_the_contract(tmp_path: Path) -> None:
    data = tmp_path / "fw.parquet"
    write_fineweb_parquet(data, 80)
    sets = ["model.attention.kind=nsa", "data.source=files", f"data.paths=[{data}]", "train.steps=4",
            "train.eval_every=2", "train.save_every=2", "data.val_every_n_docs=5", "debug.slow_data_s=0.3"]
    done = run_train(tmp_path / "run", sets, nproc=None, env={"NSA_RUN_ID": "run-under-test"})
    assert done.rc == 0, done.output[-3000:]
    out = done.output
    for needle in ("config " + str(SMOKE), "resolved config", "parameters",
                   "world size 1 (ddp: one process, no DDP wrapper)", "global batch 2 sequences",
                   "device cpu", "dtype fp32", "data files (1:"):
        assert needle in out, needle
    rd = done.run_dir
    assert stat.S_IMODE(rd.stat().st_mode) == 0o700
    run = run_json(rd)
    assert RUN_KEYS <= set(run), RUN_KEYS - set(run)
    assert run["run_id"] == "run-under-test" and run["status"] == "finished" and run["step"] == 4
    assert run["param_count"] > 0 and run["global_batch"] == 2 and run["tokens"] == 4 * 2 * 64
    assert run["config"]["model"]["attention"]["kind"] == "nsa"
    # backend auto off CUDA: the reference ops by contract, no self-check, no fallback
    assert run["attention_ops"] == {"backend": "reference", "requested": "auto", "fallback_reason": None,
                                    "self_check": None, "window": "reference", "window_reason": None}
    assert "attention ops: reference" in out
    from nsa.config import load_config
    from nsa.stats import model_stats

    cfg = load_config(str(SMOKE), sets)  # the panel's TFLOP/s and MFU come from this number
    want = model_stats(cfg.model, cfg.train.seq_len).train_flops_per_token
    assert run["train_flops_per_token"] == pytest.approx(want)
    b = beats(rd, 0)
    assert all(BEAT_KEYS <= set(x) for x in b)
    assert {x["phase"] for x in b} >= {"boot", "data", "train", "eval", "checkpoint", "done"}
    assert all(x["run_id"] == "run-under-test" for x in b)
    first_train = next(i for i, x in enumerate(b) if x["phase"] == "train")
    assert any(x["phase"] == "data" for x in b[first_train:])  # slow data: steps wait, visibly
    m = metrics(rd)
    assert [x["step"] for x in m] == [1, 2, 3, 4] and all(TRAIN_KEYS <= set(x) for x in m)
    shares = m[-1]["gate_shares"]
    assert set(shares) == {"compressed", "selected", "window"}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-5)
    assert m[-1]["mem_allocated_bytes"] > 10_000_000  # bytes (process RSS on CPU), not MiB
    ev = metrics(rd, "eval")
    assert [x["step"] for x in ev] == [2, 4] and all(x["val_loss"] > 0 for x in ev)
    assert sorted(p.name for p in (rd / "checkpoints").iterdir()) == ["latest", "step-2", "step-4"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_backend_triton_runs_the_self_check_first_and_records_it(tmp_path: Path) -> None:
    """On CPU the kernels run in the interpreter (TRITON_INTERPRET=1): the check passes,
    the run trains on them and says so in the log and run.json."""
    sets = ["model.attention.kind=nsa", "model.attention.backend=triton", "train.steps=1",
            "train.eval_batches=1"]
    done = run_train(tmp_path / "run", sets, nproc=None, env={"TRITON_INTERPRET": "1"}, timeout=280)
    assert done.rc == 0, done.output[-3000:]
    ops = run_json(done.run_dir)["attention_ops"]
    assert ops["backend"] == "triton" and ops["requested"] == "triton" and ops["fallback_reason"] is None
    # the window branch: the band kernel off CUDA (FlexAttention trains it on a GPU), and why
    assert ops["window"] == "triton" and "need CUDA, not cpu" in ops["window_reason"]
    check = ops["self_check"]
    assert check["ok"] and check["failures"] == []
    assert check["device"] == "cpu" and check["dtype"] == "float32"
    assert check["ops"] == ["compressed_attention_and_scores", "select_blocks",
                            "compressed_attention_and_selection", "selected_attention", "window_attention",
                            "gated_combine", "apply_rope"]
    assert "attention ops: triton (self-check passed on cpu" in done.output
    phases = [b["phase"] for b in beats(done.run_dir, 0)]
    assert phases.index("compile") < phases.index("train")  # the check is visible as its own phase


@pytest.mark.timeout(200)
def test_a_dense_run_checks_the_rope_kernel_and_trains_on_it(tmp_path: Path) -> None:
    """A dense model's one kernel (RoPE) under the interpreter: checked alone before training,
    recorded, and the step runs it (where torch's formula took a dozen ops)."""
    sets = ["model.attention.kind=dense", "model.attention.backend=triton", "train.steps=1",
            "train.eval_batches=1"]
    done = run_train(tmp_path / "run", sets, nproc=None, env={"TRITON_INTERPRET": "1"}, timeout=180)
    assert done.rc == 0, done.output[-3000:]
    ops = run_json(done.run_dir)["attention_ops"]
    assert ops["backend"] == "sdpa" and ops["fallback_reason"] is None
    assert ops["self_check"]["ok"] and ops["self_check"]["ops"] == ["apply_rope"]
    assert "attention ops: sdpa (RoPE kernel checked on cpu, float32, in " in done.output


@pytest.mark.timeout(120)
def test_backend_triton_that_cannot_run_fails_every_rank_at_boot(tmp_path: Path) -> None:
    """Without CUDA or the interpreter the kernels cannot run: an error on both ranks at boot
    (they agree through a collective before building the model), no fallback."""
    sets = ["model.attention.kind=nsa", "model.attention.backend=triton"]
    done = run_train(tmp_path / "run", sets, nproc=2, env={"TRITON_INTERPRET": "0"})
    assert done.rc != 0
    run = run_json(done.run_dir)
    assert run["status"] == "failed" and run["step"] == 0
    assert "needs CUDA or TRITON_INTERPRET=1" in run["exit_reason"], run["exit_reason"]
