"""torchrun worker: DDP gradients with per-block activation checkpointing equal those without.

Run by test_train_checkpointing.py under ``torchrun --nproc_per_node=2`` (gloo). Each rank
writes ``<out>/rank-R.json`` with the largest gradient difference it saw, and the gloo threads
still alive after ``D.close()``: none, or the group was not freed there and its threads and
connections would be torn down during interpreter finalization, racing the peer's exit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from nsa import build_model
from nsa.config import load_config
from nsa.train import distributed as D


def grads(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1)).backward()
    return {n: p.grad.detach().clone() for n, p in D.unwrap(model).named_parameters()}


def main() -> None:
    config, out = sys.argv[1], Path(sys.argv[2])
    cfg = load_config(config, ["model.attention.kind=nsa", "train.device=cpu"])
    info = D.init(cfg.train, out, torch.device("cpu"))
    torch.manual_seed(0)
    raw = build_model(cfg.model)
    model = D.wrap(raw, "ddp", info)
    gen = torch.Generator().manual_seed(100 + info.rank)  # each rank its own data
    tokens = torch.randint(0, 256, (2, cfg.train.seq_len + 1), generator=gen)
    raw.activation_checkpointing = False
    plain = grads(model, tokens)
    raw.activation_checkpointing = True
    checked = grads(model, tokens)
    worst = max((plain[n] - checked[n]).abs().max().item() for n in plain)
    scale = max(g.abs().max().item() for g in plain.values())
    missing = [n for n, g in plain.items() if g.abs().sum().item() == 0]
    del model  # the DDP wrapper's reducer holds the process group: close() frees it only once it is gone
    left = D.close()
    (out / f"rank-{info.rank}.json").write_text(json.dumps(
        {"max_abs_diff": worst, "max_grad": scale, "n_params": len(plain), "zero_grads": missing,
         "gloo_threads_after_close": left}))


if __name__ == "__main__":
    main()
