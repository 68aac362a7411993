"""bench/reference_memory.py: the tensor-memory accounting it reports and its table."""

from __future__ import annotations

import torch

from bench import reference_memory as rm


def test_peak_live_bytes_follows_allocations_and_frees():
    """Under the profiler: 4 MiB, then 8 MiB alive together (12), the 4 freed, 2 more
    (10): the peak is 12 MiB, whatever was allocated before profiling."""
    before = torch.empty(1 << 20)  # noqa: F841 - alive during the profile, not counted
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, profile_memory=True) as prof:
        a = torch.empty(1 << 20)
        b = torch.empty(2 << 20)
        del a
        c = torch.empty(1 << 19)
        del b, c
    peak = rm.peak_live_bytes(prof)
    assert 12 << 20 <= peak < (12 << 20) + (64 << 10)


def test_child_measures_a_small_case_and_the_table_reads_it():
    """The per-process measurement on a tiny layout (both modes), and the Markdown table
    with the ratio to the case at half the length."""
    tensors = rm.child("tensors", None, 256, 1, (4, 1, 16))
    timed = rm.child("time", None, 256, 1, (4, 1, 16))
    assert tensors["tensor_peak_bytes"] > 0
    assert timed["fwd_s"] > 0 and timed["bwd_s"] > 0 and timed["cpu_s"] > 0
    rows = [dict(impl="new", seq=128, **timed, tensor_peak_bytes=10 << 20),
            dict(impl="new", seq=256, **timed, tensor_peak_bytes=20 << 20),
            dict(impl="old", seq=256, error="time: timed out after 5 s")]
    table = rm.format_table(rows).splitlines()
    assert table[0].startswith("| impl | seq | fwd s |")
    assert "| 10 MiB | - |" in table[2] and "| 20 MiB | 2.00 |" in table[3]
    assert "| old | 256 | time: timed out after 5 s |" in table[4]
