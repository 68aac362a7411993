"""bench.report's derived lines for the train_step rows: NSA against dense, eager and both from
CUDA graphs, and each layout's graph against its eager step (rows as bench.run writes them)."""

from __future__ import annotations

from bench.report import _speedups


def row(impl: str, layout: str, ms: float | None, status: str = "ok") -> dict:
    tokens = None if ms is None else 8 * 2048 / (ms / 1000)
    return dict(op="train_step", impl=impl, layout=layout, seq_len=2048, batch=8, ms=ms, tokens_per_s=tokens,
                status=status)


def test_train_step_lines_compare_nsa_with_dense_and_the_graph_with_eager() -> None:
    rows = [row("nsa_triton", "nsa-125m", 123.0), row("dense_sdpa", "dense-125m", 63.0),
            row("nsa_triton_graph", "nsa-125m", 41.0), row("dense_sdpa_graph", "dense-125m", 32.8)]
    lines = _speedups(rows)
    assert "| train_step | 2048 | dense-125m | nsa/dense tokens/s 0.51x |" in lines
    assert "| train_step | 2048 | dense-125m | nsa/dense tokens/s 0.80x (both from CUDA graphs) |" in lines
    assert "| train_step | 2048 | nsa-125m eager | CUDA graph 3.00x |" in lines
    assert "| train_step | 2048 | dense-125m eager | CUDA graph 1.92x |" in lines


def test_a_graph_whose_proof_failed_gives_no_ratio() -> None:
    rows = [row("nsa_triton", "nsa-125m", 123.0), row("dense_sdpa", "dense-125m", 63.0),
            row("nsa_triton_graph", "nsa-125m", None, "failed: the replayed loss 5.1 differs"),
            row("dense_sdpa_graph", "dense-125m", 32.8)]
    lines = _speedups(rows)
    assert not [line for line in lines if line.startswith("| train_step | 2048 | nsa-125m eager |")]
    assert "| train_step | 2048 | dense-125m eager | CUDA graph 1.92x |" in lines
    assert not [line for line in lines if "both from CUDA graphs" in line]
