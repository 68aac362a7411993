"""bench.tiles: every tunable launch of one NSA fwd+bwd, relaunched with each of its configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.tiles import _disagreement, capture, describe, main, sweep
from nsa.ops.triton import band, tuning

TUNED = {("_band_fwd", "compressed"), ("_scores_topn", "compressed"), ("_sel_fwd", "selected"),
         ("_band_fwd", "window"), ("_band_bwd_dq", "window"), ("_band_bwd_dkdv", "window"),
         ("_sel_bwd_dq", "selected"), ("_band_bwd_dq", "compressed"), ("_band_bwd_dkdv", "compressed")}


def test_meta_lists_every_tunable_launch_with_its_configs(tmp_path: Path) -> None:
    """Nothing runs on meta tensors; each launch is listed once per config its prune keeps
    on sm_90, the default first (the compressed dK/dV at D 64: band.DKDV_TILES_SM90[64])."""
    launches, batch = capture("nsa-125m", 16384, 65536, "meta")
    assert batch == 4
    assert {(x.name, x.branch) for x in launches} == TUNED
    out = tmp_path / "tiles.json"
    assert main(["--device", "meta", "--layouts", "nsa-125m", "--seqs", "16384", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    for n, launch in enumerate(launches):
        mine = [r for r in rows if r["launch"] == n]
        with tuning.assumed_capability(90):
            kept = tuning.candidates(launch.kernel, launch.args, launch.kwargs)
        assert [r["config"] for r in mine] == [describe(c) for c in kept]
        assert [r["default"] for r in mine] == [True] + [False] * (len(mine) - 1)
        assert all(r["ms"] is None for r in mine)
    dkdv = [r["config"] for r in rows if r["kernel"] == "_band_bwd_dkdv" and r["branch"] == "compressed"]
    assert [c.split(" warps")[0] for c in dkdv] == [f"BM={m} BN={n}" for m, n, _ in band.DKDV_TILES_SM90[64]]


def test_interpreted_sweep_relaunches_each_config_and_checks_it(tmp_path: Path) -> None:
    """On CPU (the interpreter) each config of both dK/dV launches runs on the captured
    arguments and agrees with the default's outputs; the default's ratio is 1."""
    out = tmp_path / "tiles.json"
    assert main(["--device", "cpu", "--layouts", "nsa-125m", "--seqs", "96", "--tokens", "96",
                 "--kernels", "_band_bwd_dkdv", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["branch"] for r in rows} == {"window", "compressed"}
    assert len(rows) == 2 * len(band.DKDV_TILES[64])
    assert all(r["agrees"] and r["ms"] > 0 and r["rel_diff"] <= 1e-5 for r in rows)
    assert [r["vs_default"] for r in rows if r["default"]] == [1.0, 1.0]


def test_disagreement_flags_changed_outputs() -> None:
    a = torch.randn(64)
    assert _disagreement([a.clone()], [a]) == 0.0
    assert _disagreement([a * 1.02], [a]) == pytest.approx(0.02)
    assert _disagreement([torch.tensor([1, 2])], [torch.tensor([1, 3])]) == float("inf")
    inf = torch.tensor([float("inf"), 1.0])  # a row LSE of +inf (no key seen) compares as equal
    assert _disagreement([inf.clone()], [inf]) == 0.0


def test_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu"])
    assert exc.value.code == 2
    assert "TRITON_INTERPRET=1" in capsys.readouterr().err


def test_a_split_launch_is_compared_by_the_sum_of_its_partials(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """The compressed dK/dV split over query tiles (as on a GPU's SMs): each config cuts the
    split elsewhere, so its per-split partials differ while their sum, what the wrapper
    keeps, agrees. Compared whole, every non-default config would be reported wrong."""
    import nsa.ops.triton as ops

    monkeypatch.setattr(ops, "_sm_count", lambda device: 132)
    launches, _ = capture("nsa-125m", 96, 96, "cpu")
    (dkdv,) = [x for x in launches if x.name == "_band_bwd_dkdv" and x.branch == "compressed"]
    assert dkdv.kwargs["NSPLIT"] > 1
    rows = sweep(dkdv, 1)
    assert len(rows) == len(band.DKDV_TILES[64]) and all(r["agrees"] for r in rows), rows
    # whole, the partials of the second config differ from the default's
    configs = dkdv.configs()
    named = dict(zip(dkdv.kernel.arg_names, dkdv.args))
    dkdv.run(configs[0])
    whole = named["DK"].clone()
    dkdv.run(configs[1])
    assert _disagreement([named["DK"]], [whole]) > 1e-5
    assert _disagreement([named["DK"].sum(0)], [whole.sum(0)]) <= 1e-5
