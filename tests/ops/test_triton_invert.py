"""The selected dK/dV's inverted index and chunk map (invert.py) against the torch ops they
replaced. CPU, TRITON_INTERPRET=1, fresh random selections each run (seed in the message),
every output buffer poisoned first so that an element a kernel leaves unwritten fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nsa.ops import poison
from nsa.ops.triton import invert
from tests.ops.kernel_testlib import fresh_seed


def _selection(B: int, T: int, G: int, n: int, ns: int, seed: int, full: float = 0.5) -> torch.Tensor:
    """[B, T, G, n] distinct blocks per row in random slots, -1 in the empty ones; with
    probability ``full`` a row chooses n blocks (capped at ns)."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.full((B, T, G, n), -1, dtype=torch.int64)
    for b in range(B):
        for t in range(T):
            for g in range(G):
                count = min(n, ns) if torch.rand(1, generator=gen).item() < full else \
                    int(torch.randint(0, min(n, ns) + 1, (1,), generator=gen))
                slots = torch.randperm(n, generator=gen)[:count]
                idx[b, t, g, slots] = torch.randperm(ns, generator=gen)[:count]
    return idx


def _check(idx: torch.Tensor, ns: int, chunks: list[int], seed: int) -> None:
    with poison.poisoned():
        tlist, offsets = invert.inverted_index(idx, ns)
        want_t, want_off = invert.inverted_index_torch(idx, ns)
        assert poison.unwritten(tlist) == 0 and poison.unwritten(offsets) == 0, f"seed={seed}"
        assert torch.equal(offsets, want_off), f"seed={seed}: {offsets} != {want_off}"
        valid = int(offsets[-1])
        assert valid == int((idx >= 0).sum())
        assert torch.equal(tlist[:valid], want_t[:valid]), f"seed={seed}"
        for ch in chunks:
            max_chunks = offsets.numel() - 1 + -(-idx.numel() // ch)
            start, key = invert.chunk_map(offsets, ch, max_chunks)
            want_start, want_key = invert.chunk_map_torch(offsets, ch, max_chunks)
            assert poison.unwritten(start) == 0 and poison.unwritten(key) == 0, f"seed={seed} ch={ch}"
            assert torch.equal(start, want_start), f"seed={seed} ch={ch}"
            assert torch.equal(key, want_key), f"seed={seed} ch={ch}"


@pytest.mark.parametrize("shape", [(2, 97, 3, 5, 13), (1, 300, 1, 16, 40), (3, 40, 2, 4, 3)])
def test_the_index_and_chunks_equal_the_torch_ops(shape: tuple[int, int, int, int, int]) -> None:
    seed = fresh_seed()
    B, T, G, n, ns = shape
    _check(_selection(B, T, G, n, ns, seed), ns, [1, 3, 8, 4 * T], seed)


def test_more_elements_than_one_program_and_one_block_in_many_chunks() -> None:
    """Several programs of BLOCK elements, several tiles of blocks in the chunk planner,
    and a block that every query selects cut into many chunks."""
    seed = fresh_seed()
    B, T, G, n, ns = 1, 1500, 1, 2, 1100
    idx = _selection(B, T, G, n, ns, seed, full=1.0)
    idx[0, :, 0, 0] = 0
    idx[0, :, 0, 1] = torch.where(idx[0, :, 0, 1] == 0, 1, idx[0, :, 0, 1])
    _check(idx, ns, [5, 64], seed)


def test_empty_selections_and_a_single_position() -> None:
    seed = fresh_seed()
    _check(torch.full((2, 7, 2, 3), -1, dtype=torch.int64), 4, [1, 2], seed)
    _check(torch.tensor([[[[0]]]]), 1, [1], seed)
    _check(_selection(1, 1, 1, 1, 1, seed), 1, [1], seed)


def test_keys_that_overflow_int32_sort_as_int64(monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed()
    monkeypatch.setattr(invert, "INT32_KEYS", 0)
    _check(_selection(2, 50, 2, 4, 9, seed), 9, [3], seed)


def test_a_non_contiguous_selection() -> None:
    seed = fresh_seed()
    idx = _selection(2, 30, 3, 4, 6, seed).transpose(1, 2).contiguous().transpose(1, 2)
    assert not idx.is_contiguous()
    _check(idx, 6, [2], seed)


def test_the_benchmark_checks_both_ways_agree(tmp_path: Path) -> None:
    """``python -m bench.inverted_index`` off a GPU: one small interpreted case per layout,
    the model-like selection built both ways and compared (the timings mean nothing here)."""
    from bench import inverted_index

    out = tmp_path / "index.json"
    assert inverted_index.main(["--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["layout"] for r in rows] == ["nsa-125m", "paper"] and all(r["agree"] for r in rows)
    idx = inverted_index.selection(1, 200, 2, "cpu")
    assert idx.shape == (1, 200, 2, 16)
    own = torch.arange(200) // 64
    assert ((idx == 0).sum(-1) == 1).all() and ((idx == own[None, :, None, None]).sum(-1) == 1).all()
    assert (idx <= own[None, :, None, None]).all()
