"""The benchmark's pure parts: results writer/table on fabricated rows, the no-CUDA exit,
the per-kernel breakdown (synthetic events and a real CPU profile), the correctness check
against the reference, and the NSA attention composition it times (CPU interpreter, tiny,
no timing)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import run
from bench.breakdown import device_events, kernel_breakdown, profile_kernels
from bench.check import check_nsa, verdict
from bench.report import COLUMNS, KERNEL_COLUMNS, format_markdown, results_stem, write_results


def _row(op: str, impl: str, layout: str, seq: int, ms: float | None, **kw) -> dict:
    r = dict(device="NVIDIA H100 80GB HBM3", torch="2.x", triton="3.x", op=op, impl=impl, layout=layout,
             seq_len=seq, batch=1, ms=ms, tokens_per_s=None, peak_mem_bytes=2**30, max_err=None, status="ok",
             note="")
    r.update(kw)
    return r


ROWS = [
    _row("attn_fwd", "nsa_triton", "paper", 65536, 2.0, max_err=3e-3),
    _row("attn_fwd_train", "nsa_triton", "paper", 65536, 2.5, max_err=3e-3),
    _row("attn_bwd", "nsa_triton", "paper", 65536, 6.0, max_err=4e-3),
    _row("attn_fwd", "dense_flash", "paper", 65536, 20.0),
    _row("attn_fwd_train", "dense_flash", "paper", 65536, 21.0),
    _row("attn_bwd", "dense_flash", "paper", 65536, 52.0),
    _row("attn_fwd", "dense_cudnn", "paper", 65536, 15.0),
    _row("attn_fwd_train", "dense_cudnn", "paper", 65536, 16.0),
    _row("attn_bwd", "dense_cudnn", "paper", 65536, 40.0),
    _row("attn_fwd", "dense_efficient", "paper", 65536, None, status="skipped: no kernel"),
    _row("attn_fwd", "nsa_reference", "paper", 65536, None, status="oom", peak_mem_bytes=None),
    _row("train_step", "nsa_triton", "nsa-125m", 2048, 100.0, tokens_per_s=90_000.0, batch=8),
    _row("train_step", "dense_sdpa", "dense-125m", 2048, 80.0, tokens_per_s=100_000.0, batch=8),
]


def test_results_stem_is_file_safe():
    assert results_stem("NVIDIA H100 80GB HBM3", "2026-11-21") == "nvidia-h100-80gb-hbm3-2026-11-21"


def test_markdown_table_and_ratios():
    md = format_markdown(ROWS)
    lines = md.splitlines()
    table = [ln for ln in lines if ln.startswith("| attn") or ln.startswith("| train_step | ")]
    assert len([ln for ln in table if ln.count("|") > 8]) == len(ROWS)
    assert "| attn_fwd | nsa_reference | paper | 65536 | 1 | - | - | - | - | oom |" in md
    assert "| attn_bwd | nsa_triton | paper | 65536 | 1 | 6.000 | - | 1.00 GiB | 4.0e-03 | ok |" in md
    # fwd+bwd uses the training forward: flash (21 + 52) / (2.5 + 6) = 8.59; cuDNN 56 / 8.5 = 6.59
    assert ("| paper | 65536 | dense_flash | attn_fwd 10.00x, attn_fwd_train 8.40x, attn_bwd 8.67x, "
            "fwd+bwd 8.59x |") in md
    assert ("| paper | 65536 | dense_cudnn | attn_fwd 7.50x, attn_fwd_train 6.40x, attn_bwd 6.67x, "
            "fwd+bwd 6.59x |") in md
    assert "| paper | 65536 | fastest dense (dense_cudnn) | fwd+bwd 6.59x |" in md
    assert "dense_efficient | attn" not in md  # skipped: no ratio
    assert "| train_step | 2048 | dense-125m | nsa/dense tokens/s 0.90x |" in md
    assert "1.00 GiB" in md and "90,000" in md
    assert "Per-kernel" not in md  # no breakdown given


def test_train_step_ratios_eager_and_from_cuda_graphs():
    """nsa/dense for the eager and the graphed train steps, and each layout's graph against its
    eager step; a graph whose proof failed (a row without time) gives no ratio."""
    rows = [_row("train_step", "nsa_triton", "nsa-125m", 2048, 123.0, tokens_per_s=133_203.0),
            _row("train_step", "dense_sdpa", "dense-125m", 2048, 63.0, tokens_per_s=260_063.0),
            _row("train_step", "nsa_triton_graph", "nsa-125m", 2048, 41.0, tokens_per_s=399_610.0),
            _row("train_step", "dense_sdpa_graph", "dense-125m", 2048, 32.8, tokens_per_s=499_512.0)]
    md = format_markdown(rows)
    assert "| train_step | 2048 | dense-125m | nsa/dense tokens/s 0.51x |" in md
    assert "| train_step | 2048 | dense-125m | nsa/dense tokens/s 0.80x (both from CUDA graphs) |" in md
    assert "| train_step | 2048 | nsa-125m eager | CUDA graph 3.00x |" in md
    assert "| train_step | 2048 | dense-125m eager | CUDA graph 1.92x |" in md
    rows[2] = _row("train_step", "nsa_triton_graph", "nsa-125m", 2048, None, status="failed: loss differs")
    md = format_markdown(rows)
    assert "nsa-125m eager | CUDA graph" not in md and "both from CUDA graphs" not in md
    assert "| train_step | 2048 | dense-125m eager | CUDA graph 1.92x |" in md


def _kernels(n: int) -> list[dict]:
    events = [(f"_kernel_{i:02d}", 100.0 * (n - i)) for i in range(n)] + [("_kernel_00", 50.0)]
    rows = kernel_breakdown(events)
    for r in rows:
        r.update(impl="nsa_triton", layout="paper", seq_len=65536, batch=1)
    return rows


def test_kernel_breakdown_aggregates_by_name():
    """Synthetic profiler-like events: summed per name, calls counted, shares of the
    total, most expensive first (ties by name)."""
    rows = kernel_breakdown([("b", 30.0), ("a", 10.0), ("b", 20.0), ("c", 50.0), ("a", 40.0)])
    assert [(r["kernel"], r["calls"]) for r in rows] == [("a", 2), ("b", 2), ("c", 1)]
    assert [r["device_ms"] for r in rows] == pytest.approx([0.05, 0.05, 0.05])
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert kernel_breakdown([]) == []


def test_device_events_from_a_real_cpu_profile():
    """The adapter reads real profiler events: on CPU each operator's self time (what a
    GPU run reads as kernel device time), no nesting counted twice."""
    from nsa.ops import reference
    xs = run.attention_inputs("nsa_reference", 1, 70, 4, 1, 8, "cpu", torch.float32)
    xs = [x.requires_grad_() for x in xs]

    def step():
        run.nsa_attention(reference, *xs).sum().backward()

    rows = kernel_breakdown(profile_kernels(step, "cpu"))
    names = {r["kernel"] for r in rows}
    assert "aten::bmm" in names and "aten::_softmax" in names
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert all(r["calls"] >= 1 and r["device_ms"] >= 0 for r in rows)
    assert device_events([], "cuda") == []


def test_markdown_kernel_tables():
    kernels = _kernels(15)
    md = format_markdown(ROWS, kernels=kernels)
    assert "## Per-kernel device time (torch.profiler)" in md
    total = sum(k["device_ms"] for k in kernels)
    assert f"### nsa_triton, paper, seq 65536, batch 1: one fwd+bwd, {total:.3f} ms on the device" in md
    assert "| `_kernel_00` | 2 | 1.550 |" in md  # 1500 + 50 us over two calls
    assert "| `_kernel_11` | 1 |" in md and "_kernel_12`" not in md
    assert "| `(3 other kernels)` | 3 | 0.600 |" in md  # 300 + 200 + 100 us


def test_write_results_json_and_md(tmp_path):
    kernels = _kernels(3)
    jpath, mpath = write_results(ROWS, tmp_path / "results", "NVIDIA H100 80GB HBM3", "2026-11-21",
                                 meta={"quick": False}, kernels=kernels)
    assert jpath.name == "nvidia-h100-80gb-hbm3-2026-11-21.json"
    assert mpath == jpath.with_suffix(".md")
    data = json.loads(jpath.read_text())
    assert data["meta"] == {"quick": False}
    assert data["rows"] == ROWS
    assert data["kernels"] == kernels
    assert set(data["rows"][0]) == set(COLUMNS) and set(data["kernels"][0]) == set(KERNEL_COLUMNS)
    title = "NSA benchmark: NVIDIA H100 80GB HBM3, 2026-11-21"
    assert mpath.read_text() == format_markdown(ROWS, title=title, kernels=kernels)


def test_write_results_rejects_incomplete_rows(tmp_path):
    bad = dict(ROWS[0])
    del bad["peak_mem_bytes"]
    with pytest.raises(ValueError, match="peak_mem_bytes"):
        write_results([bad], tmp_path, "dev", "2026-11-21")
    k = _kernels(1)[0]
    del k["calls"]
    with pytest.raises(ValueError, match="calls"):
        write_results(ROWS, tmp_path, "dev", "2026-11-21", kernels=[k])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_run_without_cuda_exits_nonzero_with_message(capsys, tmp_path):
    assert run.main(["--quick", "--out-dir", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_benchmarked_nsa_attention_matches_reference_on_cpu():
    """The composition the benchmark times gives the same output with both op modules."""
    import nsa.ops.triton as t_ops
    from nsa.ops import reference
    torch.manual_seed(0)
    xs = run.attention_inputs("nsa_triton", 1, 140, 16, 1, 16, dev="cpu", dt=torch.float32)
    out = run.nsa_attention(t_ops, *xs)
    ref = run.nsa_attention(reference, *xs)
    assert ((out - ref).norm() / ref.norm()).item() <= 1e-5


def test_dense_backend_variants_are_causal_gqa_attention():
    """Every variant of every dense backend that runs here computes causal GQA attention;
    a backend this machine lacks (cuDNN and efficient on CPU) is unavailable with a reason."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 33, 16), torch.randn(2, 2, 33, 16), torch.randn(2, 2, 33, 16)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q @ kk.transpose(-1, -2)) / 4.0
    s = s.masked_fill(torch.ones(33, 33, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(s, -1) @ vv
    available = []
    for impl in run.DENSE_BACKENDS:
        try:
            name, picked = run._pick_dense(impl, [q, k, v])
        except run.BackendUnavailable as exc:
            assert "enable_gqa" in str(exc) and "K/V repeated" in str(exc)
            continue
        available.append(impl)
        assert ((picked(q, k, v) - want).norm() / want.norm()).item() <= 1e-5, (impl, name)
        for vname, fn in run._dense_variants(impl):
            try:
                got = fn(q, k, v)
            except RuntimeError:  # this variant does not run on this backend here
                assert vname != name
                continue
            assert ((got - want).norm() / want.norm()).item() <= 1e-5, (impl, vname)
    if not torch.cuda.is_available():
        assert available == ["dense_flash"]  # torch's CPU flash attention


def test_check_passes_the_kernels_and_catches_a_wrong_branch():
    """The correctness check on CPU in fp32: the interpreter kernels match the reference
    (output, scores, every gradient); a composition whose window branch is off by 1%
    (a negative control) is a mismatch."""
    import types

    import nsa.ops.triton as t_ops
    from nsa.ops import reference
    torch.manual_seed(0)
    xs = run.attention_inputs("nsa_triton", 1, 140, 4, 1, 16, dev="cpu", dt=torch.float32)
    grad_out = torch.randn(1, 140, 4, 16)
    res = check_nsa(t_ops, xs, grad_out)
    assert res["checked_len"] == 140 and res["tolerance"] == 1e-5
    assert set(res["errors"]) == {"out", "scores", "dq", "dk_cmp", "dv_cmp", "dk_slc", "dv_slc", "dk_win",
                                  "dv_win", "dgates"}
    assert res["fwd_err"] <= 1e-5 and res["bwd_err"] <= 1e-5, res
    assert verdict(res["fwd_err"], res["tolerance"], "out") == "ok"

    wrong = types.SimpleNamespace(**{n: getattr(reference, n) for n in reference.__all__})
    wrong.window_attention = lambda q, k, v, w: reference.window_attention(q, k, v, w) * 1.01
    bad = check_nsa(wrong, xs, None, max_len=100)  # the check on the first 100 positions
    assert bad["checked_len"] == 100 and bad["bwd_err"] is None
    assert bad["errors"]["scores"] == 0.0 and bad["fwd_err"] > 1e-3
    assert verdict(bad["fwd_err"], 1e-5, "out").startswith("mismatch: out rel err")
    assert verdict(float("nan"), 1e-5, "out").startswith("mismatch")


@pytest.mark.slow
def test_bench_code_paths_run_on_cpu():
    """Smoke test of the benchmark's own code on CPU (interpreter, fp32, tiny): rows, keys,
    the check's verdicts, skipped dense backends, the kernel profile; the CPU timings are
    thrown away (the CLI refuses to run without CUDA). 96 tokens: three compressed and two
    selection blocks, at a third of 140's interpreter time (the check at full length is
    test_check_passes_the_kernels_and_catches_a_wrong_branch's)."""
    rows = run.bench_attention("nsa_triton", "nsa-125m", 96, 1, 0, 1, device="cpu", dims=(4, 1, 16),
                               check_max_len=64)
    assert [r["op"] for r in rows] == list(run.ATTN_OPS)
    for r in rows:
        assert r["status"] == "ok" and 0 <= r["max_err"] <= 1e-5, r
        assert "checked vs reference (first 64 positions)" in r["note"], r["note"]
    dense = run.bench_attention("dense_flash", "paper", 140, 1, 0, 1, device="cpu", dims=(4, 2, 16))
    assert all(r["max_err"] is None and r["status"] == "ok" and "sdpa flash" in r["note"] for r in dense)
    if not torch.cuda.is_available():
        skipped = run.bench_attention("dense_cudnn", "paper", 140, 1, 0, 1, device="cpu", dims=(4, 2, 16))
        assert [r["op"] for r in skipped] == list(run.ATTN_OPS)
        assert all(r["status"].startswith("skipped: ") and r["ms"] is None for r in skipped)
        rows += skipped
    rows += dense + run.bench_select("nsa_triton", "paper", 140, 1, 0, 1, device="cpu")
    for r in rows:
        r.update(device="cpu", torch=torch.__version__, triton="-")
        assert set(r) == set(COLUMNS)
        assert r["status"].startswith("skipped") or r["ms"] > 0
    assert "float32" in rows[0]["note"]
    kernels = run.profile_case("nsa-125m", 96, 1, device="cpu", dims=(4, 1, 16))
    assert kernels and all(set(k) == set(KERNEL_COLUMNS) for k in kernels)
    assert sum(k["share"] for k in kernels) == pytest.approx(1.0)
    # the profiled fwd+bwd starts from fresh gradients, as the timed rows do: accumulating into
    # the warm-up's took an in-place add per input (8), which on a GPU read as kernel time
    calls = {k["kernel"]: k["calls"] for k in kernels}
    assert calls.get("aten::add_", 0) < 8, calls.get("aten::add_")


@pytest.mark.slow
def test_bench_train_step_runs_on_cpu():
    row = run.bench_train(str(run.ROOT / "configs" / "tiny-cpu.yaml"), 64, 1, 0, 1, device="cpu")
    row.update(device="cpu", torch=torch.__version__, triton="-")
    assert set(row) == set(COLUMNS)
    assert row["op"] == "train_step" and row["impl"] == "nsa_triton" and row["layout"] == "tiny-cpu"
    assert row["tokens_per_s"] == pytest.approx(64 / (row["ms"] / 1000.0))
