"""The poison the self-check fills kernel outputs with (nsa.ops.poison)."""

from __future__ import annotations

import pytest
import torch

from nsa.ops import poison

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32]


@pytest.mark.parametrize("dtype", DTYPES)
def test_within_poisoned_every_buffer_holds_the_poison(dtype: torch.dtype) -> None:
    like = torch.zeros(3, 5, dtype=dtype)
    with poison.poisoned():
        bufs = [poison.empty(3, 5, dtype=dtype), poison.empty((3, 5), dtype=dtype), poison.empty_like(like)]
    for buf in bufs:
        assert buf.shape == (3, 5) and buf.dtype == dtype
        assert poison.unwritten(buf) == 15
        if dtype.is_floating_point:
            assert buf.isnan().all()  # no computed comparison can pass on it
    bufs[0][1] = 0  # a kernel writes one row
    assert poison.unwritten(bufs[0]) == 10


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_a_value_computed_from_the_poison_is_not_unwritten(dtype: torch.dtype) -> None:
    """The float poison is a signalling NaN: arithmetic quiets it, so only an element never
    written (or copied unchanged) counts; a kernel that computed NaN from it wrote it."""
    buf = poison.fill(torch.empty(8, dtype=dtype))
    assert poison.unwritten(buf.clone()) == 8
    for computed in (buf * 1, buf + 0, buf.exp()):
        assert computed.isnan().all() and poison.unwritten(computed) == 0


def test_poisoned_nests_and_restores() -> None:
    with poison.poisoned():
        with poison.poisoned():
            pass
        assert poison.unwritten(poison.empty(4)) == 4  # still on after the inner block
    assert not poison._on
    with pytest.raises(RuntimeError), poison.poisoned():
        raise RuntimeError("a kernel failed")
    assert not poison._on  # off again, however the block ends


def test_a_dtype_without_a_poison_is_refused() -> None:
    with pytest.raises(TypeError, match="no poison for dtype torch.bool"):
        poison.fill(torch.empty(2, dtype=torch.bool))
