"""bench.decode_roofline: a decode step's bytes per launch, and a measured step beside them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import decode_roofline as DR
from nsa.config import load_config
from nsa.model import build_model

ROOT = Path(__file__).resolve().parents[1]
B1 = ROOT / "bench" / "results" / "nvidia-h200-2026-11-28-b-decode-b1.json"


def _cfg(name: str):  # noqa: ANN202 - a ModelConfig
    return load_config(ROOT / "configs" / f"{name}.yaml").model


def test_weights_are_every_parameter_once_and_the_compression_mlps_only_when_compressing() -> None:
    for name in ("dense-125m", "nsa-125m"):
        cfg = _cfg(name)
        model = build_model(cfg)
        params = {id(p): p for p in model.parameters()}  # the tied embedding once
        every = 2 * sum(p.numel() for p in params.values())
        mlps = 2 * sum(p.numel() for n, p in model.named_parameters() if ".compress_" in n)
        assert DR.weight_bytes(cfg, compressing=True) == every
        assert DR.weight_bytes(cfg) == every - mlps
        assert (mlps > 0) == (cfg.attention.kind == "nsa")


def test_attention_bytes_count_each_branch_tokens() -> None:
    """Per layer, sequence and token: K and V of 64 dims in bf16, one KV group (256 B)."""
    dense, nsa = _cfg("dense-125m"), _cfg("nsa-125m")
    tok = 12 * 64 * 2  # 12 layers, one K (or V) of 64 bf16
    assert DR.attention_bytes(dense, 65536, 3) == {"_dense_partials": 3 * tok * 2 * 65536}
    # nsa-125m at 64k: 4,095 compressed tokens ((65536 - 32) // 16 + 1), a 512-token window,
    # 16 blocks of 64, the query's own block whole at a context that is a multiple of 64
    got = DR.attention_bytes(nsa, 65536, 2)
    assert got == {"_decode_partials": 2 * tok * 2 * (4095 + 512), "_decode_scores": 2 * tok * 4095,
                   "_decode_selected": 2 * tok * 2 * 16 * 64}
    # a short context: every token visible, nothing past it
    short = DR.attention_bytes(nsa, 100, 1)
    assert short["_decode_selected"] == tok * 2 * 100 and short["_decode_scores"] == tok * 5


def test_measured_kernels_beside_their_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The committed H200 results: each listed launch's time against its bound, the GEMMs'
    kernels (nvjet, cuBLAS's split-K reduction) summed, the rest of the step's device time
    as ``other kernels``, and the measured ratio beside the bound's."""
    out = tmp_path / "bounds.json"
    assert DR.main(["--contexts", "65536", "--batch", "1", "--devices", "H200", "--measured", str(B1),
                    "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = json.loads(B1.read_text())["measured"]
    dense = next(r for r in rows if r["kind"] == "dense" and r["context"] == 65536)
    top = dense["kernels_per_step"]["step_top"]
    gemms = sum(k["us"] for k in top if any(m in k["kernel"].lower() for m in DR.GEMM_MARKS))
    named = {k["kernel"]: k["us"] for k in top}
    nbytes = DR.attention_bytes(_cfg("dense-125m"), 65536, 1)["_dense_partials"]
    bound, us = 1e6 * nbytes / DR.DEVICES["H200"].bandwidth, named["_dense_partials"]
    assert f"| dense-125m | `_dense_partials` | 201.3 | {bound:,.1f} | {us:,.1f} |" in text
    case = json.loads(out.read_text())[0]
    assert case["dense"]["launches"]["GEMMs (weights)"]["measured_us"] == pytest.approx(gemms)
    rest = dense["kernels_per_step"]["step_us"] - gemms - named["_dense_partials"]
    other = "other kernels (writes, norms, merges, activations)"
    assert f"| dense-125m | {other} | - | - | {rest:,.1f} | - |" in text
    nsa = next(r for r in rows if r["kind"] == "nsa" and r["context"] == 65536)
    ratio = dense["wall_ms_per_step"] / nsa["wall_ms_per_step"]
    assert f"measured (NVIDIA H200) {ratio:.2f}x" in text
    bounds = case["dense"]["bound_us"]["H200"], case["nsa"]["bound_us"]["H200"]
    assert case["bound_ratio"] == pytest.approx(bounds[0] / bounds[1])
    assert case["bound_ratio"] > 1  # NSA's step reads less at 64k


def test_without_results_the_bounds_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert DR.main(["--contexts", "8192", "--batch", "64"]) == 0
    text = capsys.readouterr().out
    assert "## context 8,192, batch 64" in text and "| - | - |" in text and "measured (" not in text


def test_a_missing_or_unreadable_results_file_is_refused(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        DR.main(["--measured", str(tmp_path / "nope.json")])
    assert exc.value.code == 2 and "nope.json: no such file" in capsys.readouterr().err
    (tmp_path / "cut.json").write_text('{"measured": [')  # a copy cut short
    with pytest.raises(SystemExit) as exc:
        DR.main(["--measured", str(tmp_path / "cut.json")])
    assert exc.value.code == 2 and "cut.json: not a readable JSON file" in capsys.readouterr().err



def test_one_launch_per_layer_is_one_row_of_the_three_launches_bytes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A step whose NSA attention ran as one launch per layer (``_decode_fused``): one row with
    the three launches' bytes summed, its measured time beside it, and the other kernels'
    time without it. (The H200's batch-1 file with its three launches' times given to one.)"""
    data = json.loads(B1.read_text())
    nsa = next(r for r in data["measured"] if r["kind"] == "nsa" and r["context"] == 65536)
    top = nsa["kernels_per_step"]["plain_top"]
    three = [k for k in top if k["kernel"] in ("_decode_partials", "_decode_scores", "_decode_selected")]
    fused_us = sum(k["us"] for k in three)
    nsa["kernels_per_step"]["plain_top"] = ([k for k in top if k not in three]
                                            + [{"kernel": "_decode_fused", "calls": 12, "us": fused_us}])
    path = tmp_path / "one-launch.json"
    path.write_text(json.dumps(data))
    assert DR.main(["--contexts", "65536", "--batch", "1", "--devices", "H200", "--measured", str(path)]) == 0
    text = capsys.readouterr().out
    nbytes = sum(DR.attention_bytes(_cfg("nsa-125m"), 65536, 1).values())
    bound = 1e6 * nbytes / DR.DEVICES["H200"].bandwidth
    assert f"| nsa-125m | `_decode_fused` | {nbytes / 1e6:,.1f} | {bound:,.1f} | {fused_us:,.1f} |" in text
    assert "`_decode_scores`" not in text.split("| nsa-125m |", 1)[1]
