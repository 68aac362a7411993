"""Inference: incremental decoding with per-layer KV caches (NSA and dense) and sampling.

See docs/inference.md.
"""

from nsa.infer.cache import NSACache, make_cache
from nsa.infer.cache_dense import DenseCache
from nsa.infer.decode import DecodeState, decode_step, prefill
from nsa.infer.sample import generate, sample_next, stream

__all__ = ["DecodeState", "DenseCache", "NSACache", "decode_step", "generate", "make_cache", "prefill",
           "sample_next", "stream"]
