"""The benchmark's pure parts: results writer/table on fabricated rows, the no-CUDA exit,
and the NSA attention composition it times (CPU interpreter, tiny, no timing)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import run
from bench.report import COLUMNS, format_markdown, results_stem, write_results


def _row(op: str, impl: str, layout: str, seq: int, ms: float | None, **kw) -> dict:
    r = dict(device="NVIDIA H100 80GB HBM3", torch="2.x", triton="3.x", op=op, impl=impl, layout=layout,
             seq_len=seq, batch=1, ms=ms, tokens_per_s=None, peak_mem_bytes=2**30, status="ok", note="")
    r.update(kw)
    return r


ROWS = [
    _row("attn_fwd", "nsa_triton", "paper", 65536, 2.0),
    _row("attn_bwd", "nsa_triton", "paper", 65536, 6.0),
    _row("attn_fwd", "dense_sdpa", "paper", 65536, 20.0),
    _row("attn_bwd", "dense_sdpa", "paper", 65536, 52.0),
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
    assert "| attn_fwd | nsa_reference | paper | 65536 | 1 | - | - | - | oom |" in md
    # (20 + 52) / (2 + 6) = 9.0; 20 / 2 = 10; 52 / 6 = 8.67; tokens/s 0.9
    assert "| paper | 65536 | attn_fwd 10.00x, attn_bwd 8.67x, fwd+bwd 9.00x |" in md
    assert "| train_step | 2048 | nsa/dense tokens/s 0.90x |" in md
    assert "1.00 GiB" in md and "90,000" in md


def test_write_results_json_and_md(tmp_path):
    jpath, mpath = write_results(ROWS, tmp_path / "results", "NVIDIA H100 80GB HBM3", "2026-11-21",
                                 meta={"quick": False})
    assert jpath.name == "nvidia-h100-80gb-hbm3-2026-11-21.json"
    assert mpath == jpath.with_suffix(".md")
    data = json.loads(jpath.read_text())
    assert data["meta"] == {"quick": False}
    assert data["rows"] == ROWS
    assert set(data["rows"][0]) == set(COLUMNS)
    title = "NSA benchmark: NVIDIA H100 80GB HBM3, 2026-11-21"
    assert mpath.read_text() == format_markdown(ROWS, title=title)


def test_write_results_rejects_incomplete_rows(tmp_path):
    bad = dict(ROWS[0])
    del bad["peak_mem_bytes"]
    with pytest.raises(ValueError, match="peak_mem_bytes"):
        write_results([bad], tmp_path, "dev", "2026-11-21")


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


def test_dense_baseline_variants_are_causal_gqa_attention():
    """Every dense variant the benchmark may pick computes causal GQA attention."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 33, 16), torch.randn(2, 2, 33, 16), torch.randn(2, 2, 33, 16)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q @ kk.transpose(-1, -2)) / 4.0
    s = s.masked_fill(torch.ones(33, 33, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(s, -1) @ vv
    name, picked = run._pick_dense([q, k, v])
    ran = 0
    for vname, fn in run._dense_variants():
        try:
            got = fn(q, k, v)
        except RuntimeError:  # a backend this machine lacks
            assert vname != name
            continue
        ran += 1
        assert ((got - want).norm() / want.norm()).item() <= 1e-5, vname
    assert ran >= 1
    got = picked(q, k, v)
    assert ((got - want).norm() / want.norm()).item() <= 1e-5, name


@pytest.mark.slow
def test_bench_code_paths_run_on_cpu():
    """Smoke test of the benchmark's own code on CPU (interpreter, fp32, tiny): row shapes
    and keys only; the CPU timings are thrown away (the CLI refuses to run without CUDA)."""
    rows = run.bench_attention("nsa_triton", "nsa-125m", 140, 1, 0, 1, device="cpu", dims=(4, 1, 16))
    rows += run.bench_attention("dense_sdpa", "paper", 140, 1, 0, 1, device="cpu", dims=(4, 2, 16))
    rows += run.bench_select("nsa_triton", "paper", 140, 1, 0, 1, device="cpu")
    assert [r["op"] for r in rows] == ["attn_fwd", "attn_bwd", "attn_fwd", "attn_bwd", "select_topn"]
    for r in rows:
        r.update(device="cpu", torch=torch.__version__, triton="-")
        assert set(r) == set(COLUMNS) and r["ms"] > 0 and r["status"] == "ok"
    assert "sdpa" in rows[2]["note"] and "float32" in rows[0]["note"]


@pytest.mark.slow
def test_bench_train_step_runs_on_cpu():
    row = run.bench_train(str(run.ROOT / "configs" / "tiny-cpu.yaml"), 64, 1, 0, 1, device="cpu")
    row.update(device="cpu", torch=torch.__version__, triton="-")
    assert set(row) == set(COLUMNS)
    assert row["op"] == "train_step" and row["impl"] == "nsa_triton" and row["layout"] == "tiny-cpu"
    assert row["tokens_per_s"] == pytest.approx(64 / (row["ms"] / 1000.0))
