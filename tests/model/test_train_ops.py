"""A training step's host work, counted on the CPU: the ops and kernel launches of one
forward and backward, and its host syncs.

On a GPU a small model's train step is bound by the host, not by the device: nsa-125m at
batch 8 x 2,048 dispatched about 4,900 aten ops per step, at about 25 us of host time each,
for a step of about 123 ms (bench/results, H200). Every op a layer adds costs that much
per layer and per step, on every GPU. Here the step runs as on CUDA, the Triton kernels
under the interpreter (the ops the interpreter itself dispatches inside a launch are not
the step's and are not counted), and its ops and launches stay under a recorded cap; and it
reads nothing back on the host, which would stall the GPU's queue.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from nsa_model_testlib import count_triton_launches

from nsa.config import load_config
from nsa.model import build_model
from nsa.syncs import HostSyncs, OpCounter

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# (ops in all, ops with device work + Triton launches) of one forward and backward of a
# two-layer model of each layout (dim 128; heads, groups, head dim and the NSA parameters of
# the config; batch 1 x 128 tokens; fp32, torch 2.13 on CPU), recorded when the layers' K/V
# split became an unbind (one stack in the backward, not six zero-filled copies summed) and
# the compressed keys' RoPE angles became rows of the tokens'. Before: nsa-125m 843 and 483,
# dense-125m 503 and 267. On CPU RMSNorm is its formula (a dozen ops forward and a few
# dozen backward, three norms here; one kernel each way on CUDA). A change that adds ops
# fails here; one that removes some should lower the cap. Bare allocations (``torch.empty``)
# stopped counting as device work later (they launch nothing): nsa-125m's 447 became 375.
# Then RoPE's angles came from a table the layers share (``RopeCache``), not from eight ops
# in every layer (and NSA's compressed keys' from three more): nsa-125m 793 and 375,
# dense-125m 497 and 263 before. Then dense's RoPE became the kernel NSA's uses (torch's
# formula, about eight ops forward and a dozen backward per tensor, before): 479 and 245.
# Then the selected dK/dV's inverted index and chunk map became three small kernels and a
# sort (20 torch ops with device work per layer before): nsa-125m 773 and 351. Then phi's
# two MLPs became one pass with batched GEMMs and a written-out backward
# (``nsa.model.compress.compress_pair``): nsa-125m 723 and 319.
MAX_OPS = {"nsa-125m": (637, 297), "dense-125m": (387, 185)}


def two_layer_model(name: str) -> tuple[Any, int]:
    cfg = load_config(CONFIGS / f"{name}.yaml", ["model.n_layers=2", "model.dim=128"])
    cfg.model.attention.backend = "triton"  # as on CUDA: NSA's kernels, and both layouts' RoPE kernel
    torch.manual_seed(0)
    return build_model(cfg.model), cfg.model.vocab_size


@pytest.mark.parametrize("name", list(MAX_OPS))
def test_a_train_steps_ops_are_capped_and_it_never_syncs(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    model, vocab = two_layer_model(name)
    counter = OpCounter()
    pytest.importorskip("nsa.ops.triton")
    kernels = count_triton_launches(monkeypatch, counter)
    tokens = torch.randint(0, 256, (1, 129))

    def step() -> None:
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1)).backward()

    step()  # the first step builds what later steps reuse
    model.zero_grad(set_to_none=True)
    kernels.clear()
    with HostSyncs() as syncs, counter:
        step()
    assert not syncs.events, syncs.report()
    if name.startswith("nsa"):  # every branch ran its kernels, forward and backward
        assert {"_scores_topn", "_sel_fwd", "_sel_bwd_dkdv", "_band_fwd", "_band_bwd_dkdv"} <= set(kernels)
    rotated = 4 if name.startswith("nsa") else 2  # q and the keys, per layer and way
    assert kernels["_rope_kernel"] == 2 * 2 * rotated
    total, launching = MAX_OPS[name]
    got = counter.launching + sum(kernels.values())
    assert counter.total <= total and got <= launching, (
        f"{name}: {counter.total} ops (cap {total}), {counter.launching} with device work + "
        f"{sum(kernels.values())} launches = {got} (cap {launching})")
