"""``python -m tests.train.fake_graph_train <nsa-train args>``: nsa-train with ``FakeGraphs``
standing in for CUDA's capture, which this machine does not have. Only the CPU's refusal
("no CUDA graphs on cpu") is lifted; every other one stands. Run under torchrun by
test_train_distributed.py. ``FAKE_GRAPH_FAULT=<fault>:<rank>`` plants one of ``FakeGraphs``'
faults in that rank's capture."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from nsa.train import trainer as trainer_module
from nsa.train.cli import main
from tests.train.fake_graphs import FakeGraphs

real_refusal = trainer_module.graph_refusal
real_init = trainer_module.Trainer.__init__


def refusal(device: torch.device, *args: Any) -> str | None:
    return real_refusal(torch.device("cuda", 0) if device.type == "cpu" else device, *args)


def init(self: trainer_module.Trainer, *args: Any, **kwargs: Any) -> None:
    real_init(self, *args, **kwargs)
    fault, _, rank = os.environ.get("FAKE_GRAPH_FAULT", "").partition(":")
    self.graphs = FakeGraphs(fault if fault and int(rank) == self.info.rank else None)


if __name__ == "__main__":  # not in the data loader's process, which imports this module
    trainer_module.graph_refusal = refusal  # type: ignore[assignment]
    trainer_module.Trainer.__init__ = init  # type: ignore[method-assign]
    sys.exit(main())
