"""nsa: a Native Sparse Attention language model (arXiv 2502.11089) and its trainer."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "build_model", "load_config", "ConfigError"]


def __getattr__(name: str) -> Any:
    # Lazy: the host agent imports nsa.config without paying for torch.
    if name == "build_model":
        from nsa.model import build_model

        return build_model
    if name in ("load_config", "ConfigError"):
        from nsa import config

        return getattr(config, name)
    raise AttributeError(name)
