"""Kernel tests run with the kernels' output buffers poisoned (nsa.ops.poison).

Why: the kernels write their outputs into ``torch.empty`` buffers, and a test compares
them with the reference. Poisoned, an element a kernel leaves unwritten is NaN (a
failure), never whatever the allocator handed back, which may hold the right answer.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nsa.ops import poison


@pytest.fixture(autouse=True)
def _poisoned_kernel_outputs(request: pytest.FixtureRequest) -> Iterator[None]:
    if not request.module.__name__.rsplit(".", 1)[-1].startswith("test_triton_"):
        yield
        return
    with poison.poisoned():
        yield
