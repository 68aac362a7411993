"""The LR schedule at its corners, in optimizer steps (docs/lessons.md#schedule-in-optimizer-steps)."""

import math

import pytest

from nsa.train.schedule import lr_at

KW = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "total_steps": 110}


def test_step_zero_is_first_warmup_fraction() -> None:
    assert lr_at(0, **KW) == pytest.approx(1e-3 / 10)


def test_warmup_is_linear_and_ends_at_peak() -> None:
    assert lr_at(4, **KW) == pytest.approx(5e-4)
    assert lr_at(9, **KW) == pytest.approx(1e-3)  # last warmup step
    assert lr_at(10, **KW) == pytest.approx(1e-3)  # first cosine step: still the peak


def test_cosine_middle_is_halfway_between_peak_and_min() -> None:
    # decay runs from step 10 to step 109 (99 intervals); its middle is step 59.5
    mid = 0.5 * (lr_at(59, **KW) + lr_at(60, **KW))
    assert mid == pytest.approx(0.5 * (1e-3 + 1e-4), rel=1e-3)
    assert lr_at(59, **KW) > lr_at(60, **KW)


def test_last_step_is_exactly_min_lr_no_hidden_floor() -> None:
    assert lr_at(109, **KW) == pytest.approx(1e-4, abs=1e-15)
    zero_floor = dict(KW, min_lr=0.0)
    assert lr_at(109, **zero_floor) == pytest.approx(0.0, abs=1e-15)
    assert lr_at(200, **zero_floor) == pytest.approx(0.0, abs=1e-15)  # past the end: stays at min


def test_monotone_decay_after_warmup() -> None:
    vals = [lr_at(s, **KW) for s in range(10, 110)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))
    assert all(math.isfinite(v) for v in vals)


def test_no_warmup_starts_at_peak() -> None:
    assert lr_at(0, lr=1.0, min_lr=0.1, warmup_steps=0, total_steps=5) == pytest.approx(1.0)
    assert lr_at(4, lr=1.0, min_lr=0.1, warmup_steps=0, total_steps=5) == pytest.approx(0.1)
