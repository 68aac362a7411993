"""The interpreter without its per-call re-patching (nsa.ops.interpret): a launch
still patches triton.language and restores it, a nested helper no longer re-patches, and a
kernel full of helper calls computes what it did."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from nsa.ops import interpret


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _helpers_kernel(X, Y, N: tl.constexpr, REPS: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    for _ in tl.static_range(REPS):
        x = _twice(x)  # our helper: sees tl, as the kernel does
    x = x - tl.max(x, 0) + tl.sum(x, 0)  # triton's own helpers: they see tl.core too
    tl.store(Y + offs, x)


@triton.jit
def _failing_kernel(X, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = _twice(tl.load(X + offs))
    tl.static_assert(N < 0, "deliberate")
    tl.store(X + offs, x)


def _want(x: torch.Tensor, reps: int) -> torch.Tensor:
    y = x * 2**reps
    return y - y.max() + y.sum()


@pytest.fixture
def full_patches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the calls that reach Triton's own patching (under the wrapper)."""
    assert interpret.install(), "the suite runs under TRITON_INTERPRET=1"
    original = interpreter._patch_lang.__wrapped__  # Triton's own
    calls: list[str] = []

    def counted(fn):  # type: ignore[no-untyped-def]
        calls.append(fn.__name__)
        return original(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", interpret._wrap(counted, tl))
    return calls


def test_nested_helpers_patch_once_per_module_and_compute_the_same(full_patches: list[str]) -> None:
    x = torch.randint(-8, 9, (16,)).float()  # small integers: every result exact, in any order
    for reps in (1, 40):
        y = torch.empty_like(x)
        full_patches.clear()
        _helpers_kernel[(3,)](x, y, N=16, REPS=reps)
        assert torch.equal(y, _want(x, reps))
        # one patch for the launch, at most one for the first helper that sees tl.core;
        # Triton alone patches again at every helper call (3 programs x (reps + 2) calls)
        assert len(full_patches) <= 2, full_patches


def test_a_launch_restores_the_language_and_a_failed_one_leaves_no_claim() -> None:
    assert interpret.install()
    add = tl.tensor.__add__
    assert tl.core.is_builtin(add)
    x = torch.randint(-8, 9, (8,)).float()
    _helpers_kernel[(1,)](x, torch.empty_like(x), N=8, REPS=2)
    assert tl.tensor.__add__ is add  # the launch restored what it patched
    with pytest.raises(Exception, match="deliberate"):
        _failing_kernel[(1,)](x.abs(), N=8)
    assert tl.tensor.__add__ is add
    y = torch.empty_like(x)  # the next launch patches afresh: not skipped as "nested"
    _helpers_kernel[(2,)](x, y, N=8, REPS=3)
    assert torch.equal(y, _want(x, 3))
