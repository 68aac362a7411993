"""Which kernel costs what: device time per kernel name of one call, from torch.profiler."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def device_events(events: Iterable[Any], device: str) -> list[tuple[str, float]]:
    """``(name, microseconds)`` of the profiler events that ran on ``device``.

    CUDA: every kernel, memcpy and memset on the GPU (they do not nest). CPU (only where
    no GPU exists, to exercise this code): each operator's self time, so nested
    operators are not counted twice."""
    from torch.autograd import DeviceType

    if device == "cuda":
        return [(e.name, float(e.device_time_total)) for e in events if e.device_type == DeviceType.CUDA]
    return [(e.name, float(e.self_cpu_time_total)) for e in events
            if e.device_type == DeviceType.CPU and e.self_cpu_time_total > 0]


def profile_kernels(fn: Callable[[], None], device: str) -> list[tuple[str, float]]:
    """Run ``fn`` once under the profiler; its per-event device times."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    return device_events(prof.events(), device)


def kernel_breakdown(events: Iterable[tuple[str, float]]) -> list[dict[str, Any]]:
    """Aggregate ``(name, us)`` events by name: ``kernel``, ``calls``, ``device_ms``, ``share``
    (of the total time), most expensive first (ties by name)."""
    total: dict[str, list[float]] = {}
    for name, us in events:
        acc = total.setdefault(name, [0.0, 0])
        acc[0] += us
        acc[1] += 1
    grand = sum(us for us, _ in total.values()) or 1.0
    return [dict(kernel=name, calls=int(n), device_ms=us / 1e3, share=us / grand)
            for name, (us, n) in sorted(total.items(), key=lambda kv: (-kv[1][0], kv[0]))]
