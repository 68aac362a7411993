"""``nsa-tui export``: a run's metrics, read through the real local agent, as CSV and as TensorBoard
event files that are read back record by record (framing, CRCs, protobuf) here."""

from __future__ import annotations

import csv
import json
import math
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsa.contract import EpochMetric, EvalMetric, GateShares, JsonlWriter, RunInfo, RunStatus, TrainMetric
from nsa.contract import write_json_atomic as write_json
from nsa_tui.cli import main as cli

RID = "20260101-000000-exported-0001"
STEPS = 15_000  # ~5 MB of metrics lines: more than one 4 MiB read


def make_run(root: Path) -> Path:
    d = root / RID
    d.mkdir(mode=0o700, parents=True)
    write_json(d / "run.json", RunInfo(run_id=RID, name="exported", status=RunStatus.FINISHED, step=STEPS,
                                       total_steps=STEPS, param_count=1234, config={"train": {"lr": 0.001}}))
    w = JsonlWriter(d / "metrics.jsonl")
    t0 = 1_800_000_000.0
    for step in range(1, STEPS + 1):
        loss = float("nan") if step == 7 else 5.0 / step
        w.write(TrainMetric(ts=t0 + step, step=step, loss=loss, lr=1e-3, tokens=step * 512,
                            tokens_per_s=900.0, step_time_s=0.5, grad_norm=1.5, mem_allocated_bytes=2**30,
                            gate_shares=GateShares(compressed=0.2, selected=0.3, window=0.5)))
        if step % 5000 == 0:
            w.write(EvalMetric(ts=t0 + step, step=step, val_loss=3.0 - step / 10_000))
    w.write(EpochMetric(ts=t0 + STEPS, step=STEPS, epoch=1, message="stdlib: epoch 1 ends"))
    w.close()
    with open(d / "metrics.jsonl", "ab") as fh:  # a line still being written: not exported
        fh.write(b'{"kind": "train", "ts": 1, "step": 99999, "lo')
    return d


def read_events(directory: Path) -> list:
    """Every Event of the event files in ``directory``, checking the TFRecord framing and CRCs."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    events = []
    files = sorted(directory.glob("events.out.tfevents.*"))
    assert files, list(directory.iterdir())
    for path in files:
        data = path.read_bytes()
        i = 0
        while i < len(data):
            header = data[i:i + 8]
            (length,) = struct.unpack("<Q", header)
            (len_crc,) = struct.unpack("<I", data[i + 8:i + 12])
            assert len_crc == masked_crc32c(header)
            body = data[i + 12:i + 12 + length]
            (body_crc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
            assert body_crc == masked_crc32c(body)
            ev = Event()
            ev.ParseFromString(body)
            events.append(ev)
            i += 16 + length
    return events


@pytest.mark.timeout(300)
def test_export_csv_and_tensorboard(tmp_path: Path) -> None:
    make_run(tmp_path / "runs")
    out_csv, out_tb = tmp_path / "out" / "m.csv", tmp_path / "tb"
    r = subprocess.run([sys.executable, "-m", "nsa_tui.cli", "export", "local", "exported", "--runs-root",
                        str(tmp_path / "runs"), "--csv", str(out_csv), "--tensorboard", str(out_tb),
                        "--json"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert done["lines"] == STEPS + 3 + 1 and done["csv"] == str(out_csv)  # by name; the cut line left out
    with open(out_csv, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == STEPS + 4
    first = table[0]
    assert (first["kind"], first["step"], float(first["loss"])) == ("train", "1", 5.0)
    assert float(first["gate.window"]) == 0.5
    assert math.isnan(float(table[6]["loss"]))  # step 7: NaN stays NaN
    evals = [row for row in table if row["kind"] == "eval"]
    assert [(e["step"], float(e["val_loss"]), e["loss"]) for e in evals][0] == ("5000", 2.5, "")
    assert table[-1]["kind"] == "epoch" and table[-1]["message"] == "stdlib: epoch 1 ends"

    events = read_events(out_tb / RID)
    scalars = [(v.tag, ev.step, v.simple_value, ev.wall_time) for ev in events if ev.HasField("summary")
               for v in ev.summary.value if v.HasField("simple_value")]
    loss = [(s, x) for tag, s, x, _ in scalars if tag == "train/loss"]
    assert len(loss) == STEPS and loss[0] == (1, 5.0) and math.isnan(loss[6][1])
    assert [(s, round(x, 3)) for tag, s, x, _ in scalars if tag == "eval/val_loss"] == [
        (5000, 2.5), (10000, 2.0), (15000, 1.5)]
    assert {tag for tag, *_ in scalars} >= {"train/lr", "train/grad_norm", "train/tokens_per_s",
                                            "train/gate.selected", "train/mem_allocated_bytes"}
    assert next(w for tag, s, _, w in scalars if tag == "train/loss" and s == 3) == 1_800_000_003.0
    texts = {v.tag.split("/text_summary")[0] for ev in events if ev.HasField("summary")
             for v in ev.summary.value if v.tag.startswith("run/")}
    assert texts == {"run/config", "run/info"}


def test_export_needs_a_target_and_a_run(tmp_path: Path) -> None:
    make_run(tmp_path / "runs")
    root = ["--runs-root", str(tmp_path / "runs")]
    r = subprocess.run([sys.executable, "-m", "nsa_tui.cli", "export", "local", RID, *root],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == cli.EXIT_USAGE and "--tensorboard" in r.stderr
    r = subprocess.run([sys.executable, "-m", "nsa_tui.cli", "export", "local", "nope", *root, "--csv",
                        str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert r.returncode == cli.EXIT_NO_RUN
    started = time.time()
    r = subprocess.run([sys.executable, "-m", "nsa_tui.cli", "export", "local", RID, *root, "--csv",
                        str(tmp_path / "csvdir")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (tmp_path / "csvdir" / f"{RID}.csv").stat().st_mtime >= started - 1
