"""bench.decode's loaded-token counts: the paper's Table 4 ratios, and what the decoder
really attends to."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "model"))
from nsa_model_testlib import peaked_model  # noqa: E402

from bench.decode import PAPER, analytic_rows, loaded_tokens, main  # noqa: E402
from nsa.infer import cache as cache_mod  # noqa: E402
from nsa.infer import decode_step, prefill  # noqa: E402


def test_paper_ratios() -> None:
    """arXiv 2502.11089, Table 4: 4.0x, 6.4x, 9.1x, 11.6x at 8k..64k."""
    rows = analytic_rows([8192, 16384, 32768, 65536], {"paper": PAPER})
    assert [round(r["ratio_paper"], 1) for r in rows] == [4.0, 6.4, 9.1, 11.6]
    assert [round(r["ratio_exact"], 1) for r in rows] == [4.0, 6.4, 9.1, 11.6]


def test_analytic_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--analytic", "--contexts", "8192"]) == 0
    out = capsys.readouterr().out
    assert "| paper | 8,192 | 8,192 | 2,048 | 4.0x | 2,047 | 4.00x |" in out


def test_exact_count_is_what_the_decoder_attends_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys each branch's mask lets the decoded query see, counted inside NSACache.step,
    equal loaded_tokens' exact count at every context (one KV group: counts per group)."""
    model = peaked_model("nsa", n_kv_heads=1)
    a = model.blocks[0].attn.cfg
    seen: list[int] = []
    masked, attend = cache_mod._masked_attention, cache_mod._attend

    def count_masked(q, k, v, mask, scale):
        seen.append(int(mask.sum()))
        return masked(q, k, v, mask, scale)

    def count_attend(qg, keys, vals, mask):
        seen.append(int(mask.sum()))
        return attend(qg, keys, vals, mask)

    monkeypatch.setattr(cache_mod, "_masked_attention", count_masked)
    monkeypatch.setattr(cache_mod, "_attend", count_attend)
    _, state = prefill(model, torch.zeros(1, 1, dtype=torch.long), max_new_tokens=60)
    for s in range(2, 62):  # the decoded token is the s-th: its context holds s tokens
        seen.clear()
        decode_step(model, state, torch.zeros(1, dtype=torch.long))
        per_layer = sum(seen[:3])  # compressed, selected, window of the first layer
        assert per_layer == loaded_tokens(s, a)["nsa_exact"], f"context {s}"


def test_measured_json_says_which_decode_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every measured row and the JSON name the decode path: eager on the CPU (a CUDA graph
    needs CUDA), after the warm-up steps, one timed step each."""
    out = tmp_path / "decode.json"
    assert main(["--contexts", "128", "--steps", "1", "--device", "cpu", "--threads", "1",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["decode_path"] == "eager"
    assert [(r["kind"], r["decode_path"], r["replays"]) for r in data["measured"]] == \
        [("dense", "eager", 0), ("nsa", "eager", 0)]
    assert all(r["kernels_per_step"] is None for r in data["measured"])  # counted on CUDA only
    assert "decode path eager" in capsys.readouterr().out


def test_kernels_profiles_each_kind_of_step_on_the_cpu(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``--kernels`` on the CPU: each kind of step's torch operators (NSA's compressing step runs
    phi on top of the plain one's work), their summed self time, and the costliest ten, most
    expensive first, each with its calls; the line printed per row says the same."""
    out = tmp_path / "decode.json"
    assert main(["--contexts", "128", "--steps", "1", "--device", "cpu", "--threads", "1", "--kernels",
                 "--json", str(out)]) == 0
    rows = {r["kind"]: r["kernels_per_step"] for r in json.loads(out.read_text())["measured"]}
    assert set(rows["dense"]) == {"step", "step_us", "step_top"}
    assert set(rows["nsa"]) == {k + x for k in ("plain", "compressing") for x in ("", "_us", "_top")}
    assert rows["nsa"]["compressing"] > rows["nsa"]["plain"] > rows["dense"]["step"] > 12, rows
    for kind, counted in [("step", rows["dense"]), ("plain", rows["nsa"]), ("compressing", rows["nsa"])]:
        top = counted[kind + "_top"]
        assert 0 < len(top) <= 10 and counted[kind + "_us"] > 0
        assert [t["us"] for t in top] == sorted((t["us"] for t in top), reverse=True)
        assert sum(t["us"] for t in top) <= counted[kind + "_us"] + 1e-6
        assert sum(t["calls"] for t in top) <= counted[kind] and all(t["calls"] >= 1 for t in top)
        assert all(t["kernel"].startswith("aten::") for t in top), top
    err = capsys.readouterr().err
    assert "operators per eager step: plain" in err and "compressing" in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernels_per_step_are_counted_for_each_kind_of_step(tmp_path: Path) -> None:
    """``--kernels`` on CUDA: each kind of step's kernels, NSA's compressing step above its
    plain one, and at least seven per layer (docs/kernels.md counts 9-10 for an NSA layer and
    7-8 for a dense one at batch 1); the JSON names the costliest with their device time."""
    out = tmp_path / "decode.json"
    assert main(["--contexts", "1024", "--steps", "2", "--kernels", "--json", str(out)]) == 0
    rows = {r["kind"]: r["kernels_per_step"] for r in json.loads(out.read_text())["measured"]}
    layers = 12  # nsa-125m and dense-125m
    assert rows["nsa"]["compressing"] > rows["nsa"]["plain"] >= 7 * layers, rows
    assert rows["nsa"]["plain"] > rows["dense"]["step"] >= 7 * layers, rows
    assert rows["dense"]["step_top"] and rows["nsa"]["plain_top"]
    assert rows["dense"]["step_us"] > 0 and rows["nsa"]["plain_us"] > 0


def test_staggered_lengths_compress_at_every_step(tmp_path: Path) -> None:
    """``--stagger``: from a batch of d on, some sequence completes a compression block at every
    step (nsa-125m: l 32, d 16), and the rows say how the lengths were spread; without it
    all sequences share the context and 1 step in d compresses."""
    from bench.decode import staggered_lengths

    block, d = 32, 16
    for batch, every in ((16, True), (20, True), (8, False)):
        lens = staggered_lengths(batch, 4096, d)
        assert max(lens) == 4096 and len(set(lens)) == min(batch, d)
        compressing = [any(p + k >= block - 1 and (p + k - block + 1) % d == 0 for p in lens)
                       for k in range(2 * d)]
        assert all(compressing) == every and any(compressing)
    assert staggered_lengths(4, 100, 0) == [100] * 4
    out = tmp_path / "decode.json"
    assert main(["--contexts", "128", "--steps", "1", "--batch", "2", "--stagger", "--device", "cpu",
                 "--threads", "1", "--json", str(out)]) == 0
    assert [r["stagger"] for r in json.loads(out.read_text())["measured"]] == [d, d]


def test_the_decode_kernel_sweep_plans_valid_splits_around_the_planned_ones() -> None:
    """``bench.decode_kernel --sweep``'s plans at 8k for a GPU of 132 SMs: the planned splits
    (what tests/ops/test_triton_decode.py checks for an H100), none, and each phase's scaled
    with the others kept, and the planned ones in their own launches (batch 1 plans one),
    every one a valid ``DecodeSplits`` within the shapes, none twice."""
    from bench.decode_kernel import PHASES, setup, sweep_plans
    from nsa.ops.triton import decode as DK

    cache, _, _ = setup(8192, 1, torch.float32, torch.device("cpu"))
    plans = sweep_plans(cache, torch.device("cuda"), sms=132)
    planned = plans["planned"]
    assert planned != DK.DecodeSplits()  # 132 SMs: split
    assert plans["no_split"] == DK.DecodeSplits()
    assert len(set(plans.values())) == len(plans)
    for name, plan in plans.items():
        changed = [p for p in PHASES if getattr(plan, p) != getattr(planned, p)]
        if name == "planned in launches":  # the same splits, each phase in its own launch
            assert not changed and planned.one_launch and not plan.one_launch, (name, plan)
            continue
        assert name in ("planned", "no_split") or changed == [name.split()[0]], (name, plan)
        assert plan.scores <= DK.MAX_SCORE_SPLITS and plan.selected <= 16 and plan.win <= 512
        # one launch where the plan is, while its programs fit on half the SMs
        assert plan.one_launch == (name != "no_split" and plan.programs() <= 66), (name, plan)
    assert {"cmp x2", "win x0.5", "scores x4", "selected x0.5", "planned in launches"} <= set(plans)
    assert planned.one_launch  # batch 1: 21 programs


@pytest.mark.slow
def test_decode_kernel_waves_compile_each_launch_and_start_the_long_parts_first(tmp_path: Path) -> None:
    """``bench.decode_kernel --waves`` compiles the planned launches for sm_90 (no GPU). On a
    GPU of 8 SMs at batch 32 the scores launch is 32 sequences x 3 parts (one scoring
    program, then a merge for each of two branches: 1,024 per-head merges would outnumber
    the 16 programs planned for the SMs), over more than one wave: every sequence's scoring
    program must be among what the first wave starts."""
    from bench.roofline import resident
    from tests.compiled import run_compiled

    out_json = tmp_path / "waves.json"
    out = run_compiled(["-m", "bench.decode_kernel", "--contexts", "4096", "--batch", "32", "--plan-sms", "8",
                        "--waves", "--json", str(out_json)], timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out_json.read_text())[0]["waves"]
    names = [r["launch"].split("[")[0] for r in rows]
    assert names == ["_decode_partials", "_decode_scores", "_decode_selected"]
    for r in rows:
        grid = [int(x) for x in r["launch"][r["launch"].index("[") + 1:-1].split(",")]
        assert grid[0] == 32 and r["programs"] == grid[0] * grid[1] and r["parts"] == grid[1], r
        assert r["per_sm"] == resident(r["registers"], r["shared"], r["warps"]) > 0, r
        assert r["parts_in_first_wave"] == min(r["parts"], 8 * r["per_sm"] // 32), r
    scores = rows[1]
    assert scores["parts"] == 1 + 2 and scores["waves"] > 1, scores
    assert scores["parts_in_first_wave"] >= 1, scores
    assert "the first wave starts" in out.stdout
