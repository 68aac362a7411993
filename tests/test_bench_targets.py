"""bench.targets: the speed targets against results files, on the GPU results committed in
bench/results (real files) and on copies of them changed to each condition a target is not
set under."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import targets as BT

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
DECODE_B1 = RESULTS / "nvidia-h200-2026-11-28-b-decode-b1.json"  # batch 1, 8k and 64k, H200, graphs
RUN_P4 = RESULTS / "nvidia-h200-2026-11-28-p4.json"  # bench.run: nsa-125m at 2k and 16k


def by_condition(found: list[BT.Finding]) -> dict[tuple[str, str], BT.Finding]:
    return {(f.target.what, f.target.condition): f for f in found}


def test_the_committed_h200_results_against_their_targets() -> None:
    found, skipped = BT.findings([DECODE_B1, RUN_P4])
    assert skipped == []
    got = by_condition(found)
    nsa_speed = got[("decode tokens/s, nsa-125m", "batch 1, 8,192 tokens")]
    assert nsa_speed.value == pytest.approx(1734, abs=1) and nsa_speed.met is True
    ratio = got[("decode tokens/s, nsa-125m vs dense-125m", "batch 1, 8,192 tokens")]
    assert ratio.value == pytest.approx(1734 / 2267, abs=1e-3) and ratio.met is False
    assert "cuda-graph" in ratio.detail and ratio.source == f"{DECODE_B1.name} (NVIDIA H200)"
    # batch 64 is another file's
    assert ("decode tokens/s, nsa-125m vs dense-125m", "batch 64, 65,536 tokens") not in got
    attn = got[("attention fwd+bwd, NSA vs the fastest dense", "nsa-125m, 16,384 tokens")]
    rows = {(r["op"], r["impl"], r["seq_len"]): r["ms"] for r in json.loads(RUN_P4.read_text())["rows"]}
    nsa = rows[("attn_fwd_train", "nsa_triton", 16384)] + rows[("attn_bwd", "nsa_triton", 16384)]
    dense = min(rows[("attn_fwd_train", d, 16384)] + rows[("attn_bwd", d, 16384)]
                for d in ("dense_flash", "dense_cudnn", "dense_efficient"))
    assert attn.value == pytest.approx(dense / nsa) and attn.met is (dense / nsa >= 1.5)
    assert attn.detail.startswith("vs dense_cudnn")  # the fastest dense of that run


def test_a_decode_not_run_as_the_targets_are_set_is_not_judged(tmp_path: Path) -> None:
    """Eager steps, a CPU, fp32: measured, shown, neither met nor missed. Staggered lengths are
    not the targets' batch of one context."""
    data = json.loads(DECODE_B1.read_text())
    cases = {"eager": dict(data, measured=[dict(m, decode_path="eager") for m in data["measured"]]),
             "cpu": dict(data, device="CPU, 2 threads, tokens per second of process CPU time"),
             "fp32": dict(data, dtype="torch.float32"),
             "staggered": dict(data, measured=[dict(m, stagger=16) for m in data["measured"]])}
    for name, case in cases.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(case))
    found, _ = BT.findings(sorted(tmp_path.glob("*.json")))
    assert {f.source.split(" ")[0] for f in found} == {"eager.json", "cpu.json", "fp32.json"}
    assert found and all(f.met is None for f in found), [(f.source, f.met) for f in found]
    why = {f.source.split(" ")[0]: f.detail for f in found}
    assert "decode path eager, not cuda-graph" in why["eager.json"]
    assert why["cpu.json"].endswith("on a CPU") and why["fp32.json"].endswith("torch.float32, not bf16")


def test_train_step_rows_eager_and_from_graphs(tmp_path: Path) -> None:
    row = dict(op="train_step", seq_len=2048, batch=8, status="ok", device="NVIDIA H100")
    rows = [dict(row, impl="nsa_triton", layout="nsa-125m", tokens_per_s=70_000.0, ms=234.0),
            dict(row, impl="dense_sdpa", layout="dense-125m", tokens_per_s=100_000.0, ms=164.0),
            dict(row, impl="nsa_triton_graph", layout="nsa-125m", tokens_per_s=90_000.0, ms=182.0),
            dict(row, impl="dense_sdpa_graph", layout="dense-125m", tokens_per_s=100_000.0, ms=164.0),
            dict(row, impl="nsa_triton", layout="nsa-125m", tokens_per_s=1.0, ms=1.0, seq_len=16384,
                 status="failed: out of memory")]
    (tmp_path / "run.json").write_text(json.dumps(dict(meta=dict(device="NVIDIA H100"), rows=rows)))
    found, _ = BT.findings([tmp_path / "run.json"])
    train = [f for f in found if f.target.what.startswith("train step")]
    assert [(f.target.condition, f.detail, round(f.value, 2), f.met) for f in train] == [
        ("2,048 tokens", "eager", 0.7, False), ("2,048 tokens", "both from CUDA graphs", 0.9, True)]


def test_cli_reads_a_folder_names_what_it_skips_and_lists_every_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "decode-b1.json").write_text(DECODE_B1.read_text())
    (tmp_path / "tiles.json").write_text(json.dumps(dict(meta={}, rows=[dict(kernel="_band_fwd", ms=1.0)])))
    out = tmp_path / "targets.json"
    assert BT.main([str(tmp_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    table = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    # every target, once or more
    assert len({tuple(line.split(" | ")[:2]) for line in table}) == len(BT.TARGETS)
    decode = "| decode tokens/s, nsa-125m vs dense-125m | batch 1, 8,192 tokens"
    assert f"{decode} | >= 0.90x | 0.76x | no |" in text
    assert "| paper, 65,536 tokens | >= 4.00x | - | not measured |" in text
    assert "skipped: targets.json, tiles.json" not in text and "skipped: tiles.json." in text
    # both speeds met, both ratios (8k, 64k) not
    summary = "targets: 4 measured as set; met in every file that measured them: 2, in some: 2."
    assert f"{len(BT.TARGETS)} {summary}" in text
    data = json.loads(out.read_text())
    assert data["skipped"] == ["tiles.json"] and {f["met"] for f in data["findings"]} == {True, False}


def test_a_missing_or_unreadable_file_is_refused_by_name(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        BT.main([str(tmp_path / "nope.json")])
    assert e.value.code == 2 and "nope.json: no such file" in capsys.readouterr().err
    (tmp_path / "cut.json").write_text('{"measured": [')
    with pytest.raises(SystemExit) as e:
        BT.main([str(tmp_path)])
    assert e.value.code == 2 and "cut.json: not a readable JSON file" in capsys.readouterr().err


def test_the_trainers_step_from_a_real_run_is_shown_and_judged_only_on_a_gpu(tmp_path: Path) -> None:
    """bench.trainer_overhead run for real (smoke-cpu, on this CPU) writes its two steps; the
    target (within 5 % of the bare step) is shown with them and not judged on a CPU, where a
    host sync costs nothing. The same file from a GPU is judged."""
    out = tmp_path / "trainer-overhead.json"
    cmd = ["--config", "smoke-cpu", "--device", "cpu", "--steps", "3", "--warmup", "1", "--json", str(out)]
    subprocess.run([sys.executable, "-m", "bench.trainer_overhead", *cmd], check=True, capture_output=True,
                   cwd=RESULTS.parents[1], timeout=300)
    r = json.loads(out.read_text())["trainer_overhead"]
    assert r["config"] == "smoke-cpu" and r["device"].startswith("CPU") and r["cuda_graph"] is None
    assert r["ratio"] == pytest.approx(r["trainer_ms"] / r["bare_ms"])
    (f,), _ = BT.findings([out])
    assert f.target is BT.TRAINER and f.met is None and f.detail.endswith("eager, on a CPU")
    on_gpu = tmp_path / "gpu.json"
    for ratio, met in ((1.04, True), (1.06, False)):
        on_gpu.write_text(json.dumps(dict(trainer_overhead=dict(r, device="NVIDIA H100", ratio=ratio))))
        (f,), _ = BT.findings([on_gpu])
        assert (f.met, f.target.wanted()) == (met, "<= 1.05x")
