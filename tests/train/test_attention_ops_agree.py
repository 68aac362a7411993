"""The ranks' agreement on the window branch's kernel (nsa.train.attention_ops.window_veto):
FlexAttention only where every rank's check let it run."""

from __future__ import annotations

from nsa.contract import AttentionOps
from nsa.train.attention_ops import window_veto

FLEX = AttentionOps(backend="triton", requested="auto", window="flexattention")


def test_every_rank_on_flexattention_keeps_it() -> None:
    assert window_veto("flexattention", [FLEX, FLEX, FLEX]) is None


def test_one_rank_whose_check_failed_turns_it_off_naming_the_rank() -> None:
    failed = AttentionOps(backend="triton", requested="auto", window="triton",
                          window_reason="FlexAttention failed the self-check on cuda:0 (bfloat16): boom")
    assert window_veto("flexattention", [FLEX, FLEX, failed]) == (
        "rank 2: FlexAttention failed the self-check on cuda:0 (bfloat16): boom")


def test_a_rank_that_cannot_use_it_has_nothing_to_give_up() -> None:
    assert window_veto("triton", [FLEX, FLEX]) is None
    assert window_veto("reference", [FLEX]) is None
