"""Fixtures for the model tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from nsa_model_testlib import small_cfg

from nsa.model import build_model


@pytest.fixture
def make_model() -> Callable[..., torch.nn.Module]:
    """``make_model(kind, seed=0, **attn)``: an fp64 model in eval mode (no dropout anyway)."""

    def make(kind: str = "nsa", seed: int = 0, vocab: int = 64, **attn: Any) -> torch.nn.Module:
        torch.manual_seed(seed)
        return build_model(small_cfg(kind, vocab, **attn)).double()

    return make


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is ~5x cheaper than two (no spinning workers on
    a shared 2-core machine). Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
