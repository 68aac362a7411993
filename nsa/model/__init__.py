"""The NSA language model (and its dense baseline); ``build_model(model_cfg)``."""

from nsa.model.attention import DenseAttention, NSAAttention
from nsa.model.transformer import Block, Transformer, build_model

__all__ = ["Block", "DenseAttention", "NSAAttention", "Transformer", "build_model"]
