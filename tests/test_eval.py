"""``nsa-tui eval``: a real tiny NSA run trained by torchrun, evaluated through the CLI, the
real local agent and its worker process; the records written and read back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_tui.cli import main as cli

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke-cpu.yaml")


def own_copy(run: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    """A copy of the session's trained run (tests/conftest.py): evaluations append records to it."""
    root, rid = run
    shutil.copytree(root / rid, tmp_path / rid)
    return tmp_path, rid


def nsa_tui(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_eval_through_the_cli_records_what_the_model_does(trained_nsa_run: tuple[Path, str],
                                                          tmp_path: Path) -> None:
    root, rid = own_copy(trained_nsa_run, tmp_path)
    args = ["eval", "local", rid, "--runs-root", str(root), "--passkey", "--lengths", "32,64",
            "--depths", "0,0.5,1", "--trials", "2", "--seed", "3", "--loss-sequences", "2", "--buckets", "4"]
    r = nsa_tui(*args, "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["checkpoint"] == "step-6" and rec["step"] == 6 and rec["attention"] == "nsa"
    assert rec["lengths"] == [32, 64] and rec["depths"] == [0.0, 0.5, 1.0] and rec["trials"] == 2
    assert rec["trained_context"] == 64 and rec["beyond_context"] == [] and rec["origin"] == "cli"
    assert rec["loss_source"] == "val" and rec["loss_length"] == 64
    assert [(b["start"], b["end"]) for b in rec["loss_buckets"]] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert "[6/14] passkey length 32" in r.stderr and "[12/14] passkey length 64" in r.stderr
    assert "[14/14] loss by position" in r.stderr  # progress

    # the same numbers in this process, from the same checkpoint, plan and held-out text
    from nsa.infer.evaluate import EvalPlan, evaluate, val_windows
    from nsa.infer.load import load_model
    from nsa.train.tokenizer import build_tokenizer

    model, cfg, _meta = load_model(root / rid / "checkpoints" / "step-6")
    tok = build_tokenizer(cfg.data)
    plan = EvalPlan(lengths=[32, 64], depths=[0.0, 0.5, 1.0], trials=2, seed=3, loss_sequences=2, buckets=4)
    want = evaluate(model, tok, plan, val_windows(cfg, tok, 64))
    assert rec["hits"] == want.hits and rec["accuracy"] == want.accuracy
    assert [b["loss"] for b in rec["loss_buckets"]] == pytest.approx([b.loss for b in want.buckets], rel=1e-5)

    again = nsa_tui(*args, "--checkpoint", "3")  # text output, the older checkpoint
    assert again.returncode == 0, again.stderr
    assert "passkey accuracy" in again.stdout and "step-3" in again.stdout
    assert "loss by position" in again.stdout

    lines = (root / rid / "eval" / "passkey.jsonl").read_text().splitlines()
    assert [json.loads(x)["checkpoint"] for x in lines] == \
        ["step-6", "step-3"]
    hist = nsa_tui("eval", "local", rid, "--runs-root", str(root), "--history", "--json")
    assert hist.returncode == 0, hist.stderr
    back = json.loads(hist.stdout)
    assert [h["checkpoint"] for h in back] == ["step-6", "step-3"] and back[0] == rec


@pytest.mark.slow
def test_lengths_beyond_the_trained_context_are_refused_or_marked(trained_nsa_run: tuple[Path, str],
                                                                  tmp_path: Path) -> None:
    root, rid = own_copy(trained_nsa_run, tmp_path)
    base = ["eval", "local", rid, "--runs-root", str(root), "--passkey", "--depths", "0.5", "--trials", "1",
            "--seed", "1", "--loss-sequences", "1"]
    r = nsa_tui(*base, "--lengths", "64,96")
    assert r.returncode == cli.EXIT_USAGE
    assert "96 exceed the context" in r.stderr and "64 tokens" in r.stderr and "--beyond-context" in r.stderr
    r = nsa_tui(*base, "--lengths", "64,96", "--beyond-context")
    assert r.returncode == 0, r.stderr
    assert "96*" in r.stdout and "beyond the trained context (64 tokens)" in r.stdout
    r = nsa_tui(*base, "--lengths", "20", "--json")
    assert r.returncode == cli.EXIT_USAGE
    assert "below 30" in json.loads(r.stdout)["error"]["message"]


def test_refusals_before_anything_runs(tmp_path: Path) -> None:
    rid = "20260101-000000-fresh-0001"
    (tmp_path / rid).mkdir(mode=0o700)
    (tmp_path / rid / "run.json").write_text(json.dumps({"run_id": rid, "status": "running"}))
    root = ["--runs-root", str(tmp_path)]
    r = nsa_tui("eval", "local", rid, *root, "--passkey", "--json")
    assert r.returncode == cli.EXIT_NO_CHECKPOINT
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "no_checkpoint" and "nothing to evaluate" in err["message"]
    r = nsa_tui("eval", "local", rid, *root)
    assert r.returncode == cli.EXIT_USAGE and "--passkey" in r.stderr
    r = nsa_tui("eval", "local", rid, *root, "--passkey", "--depths", "0.5,2")
    assert r.returncode == cli.EXIT_USAGE and "--depths" in r.stderr
    r = nsa_tui("eval", "local", rid, *root, "--passkey", "--lengths", "a,b")
    assert r.returncode == cli.EXIT_USAGE and "whole numbers" in r.stderr
    gone = nsa_tui("eval", "local", "20990101-000000-none-0000", *root, "--passkey")
    assert gone.returncode == cli.EXIT_NO_RUN
    r = nsa_tui("eval", "local", rid, *root, "--history")
    assert r.returncode == 0 and "no evaluations yet" in r.stdout
