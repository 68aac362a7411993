"""Periodic long-context evaluation in a real 2-rank torchrun (gloo): rank 0 appends a record
per due step, every rank beats in the ``eval`` phase, and the record is what the weights of
that step give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.train.trainrun import beats, metrics, run_train

pytestmark = pytest.mark.timeout(300)


def test_periodic_eval_writes_records_and_eval_phase_beats(tmp_path: Path) -> None:
    base = ["model.attention.kind=nsa", "train.batch_size=1", "train.steps=6", "train.save_every=3",
            "train.eval_every=1000"]
    sets = [*base, "eval.every_steps=3", "eval.lengths=[32,64]", "eval.depths=[0,1]",
            "eval.trials=2", "eval.loss_sequences=1", "eval.buckets=2", "eval.seed=5"]
    done = run_train(tmp_path / "run", sets, nproc=2, timeout=240)
    assert done.rc == 0, done.output[-3000:]
    lines = (done.run_dir / "eval" / "passkey.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert [r["step"] for r in recs] == [3, 6], done.output[-3000:]
    for r in recs:
        assert r["origin"] == "train" and r["checkpoint"] == "" and r["attention"] == "nsa"
        assert r["lengths"] == [32, 64] and r["depths"] == [0.0, 1.0] and r["trials"] == 2 and r["seed"] == 5
        assert len(r["accuracy"]) == 2 and all(len(row) == 2 for row in r["accuracy"])
        assert r["loss_source"] == "val" and len(r["loss_buckets"]) == 2 and r["trained_context"] == 64
    assert "passkey eval step 3: accuracy" in done.output
    for rank in (0, 1):
        phases = [(b.get("step"), b["phase"]) for b in beats(done.run_dir, rank)]
        assert (3, "eval") in phases, (rank, phases)  # the validation loss is due at step 6 only

    # rank 0 evaluated the weights of step 3: the checkpoint of step 3 gives the same record
    from nsa.infer.evaluate import evaluate, val_windows
    from nsa.infer.load import load_model
    from nsa.train.longeval import plan_of
    from nsa.train.tokenizer import build_tokenizer

    model, cfg, _meta = load_model(done.run_dir / "checkpoints" / "step-3")
    tok = build_tokenizer(cfg.data)
    plan = plan_of(cfg)
    want = evaluate(model, tok, plan, val_windows(cfg, tok, 64))
    assert recs[0]["hits"] == want.hits
    got = [b["loss"] for b in recs[0]["loss_buckets"]]
    assert got == pytest.approx([b.loss for b in want.buckets], rel=1e-4)

    # evaluating changes nothing of the training: the same losses as a run without it
    plain = run_train(tmp_path / "plain", base, nproc=2, timeout=240)
    assert plain.rc == 0, plain.output[-3000:]
    assert not (plain.run_dir / "eval").exists()
    losses = [m["loss"] for m in metrics(done.run_dir)]
    assert len(losses) == 6 and [m["loss"] for m in metrics(plain.run_dir)] == losses
