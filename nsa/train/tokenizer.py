"""Tokenizers: raw bytes (default) and GPT-2 BPE through tiktoken, offline when given files.

Why ``encode_ordinary``: documents are plain text; special-token strings inside a document
are text, not control tokens, so no tokenizer ever warns or refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from nsa.config import DataConfig

# tiktoken's r50k (GPT-2) split pattern, as in tiktoken_ext.openai_public.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_EOT = 50256
BYTE_EOT = 256


class Tokenizer(Protocol):
    name: str
    eot: int
    vocab_size: int

    def encode(self, text: str) -> np.ndarray: ...

    def token_bytes(self, ids: Sequence[int]) -> bytes: ...


class ByteTokenizer:
    """UTF-8 bytes 0..255; end-of-text is 256 (so the model's vocab must be >= 257)."""

    name = "byte"
    eot = BYTE_EOT
    vocab_size = 257

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8", errors="replace"), dtype=np.uint8).astype(np.int32)

    def token_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes of generated ids; ids that are no byte (end-of-text, the vocab's padding)
        have none. Bytes, not text: a character may be cut between two steps."""
        return bytes(i for i in ids if 0 <= i < 256)


class GPT2Tokenizer:
    """GPT-2 BPE (50257 tokens, end-of-text 50256) via tiktoken."""

    name = "gpt2"
    eot = GPT2_EOT
    vocab_size = 50257

    def __init__(self, vocab_bpe: str | None = None, encoder_json: str | None = None) -> None:
        import tiktoken

        if vocab_bpe or encoder_json:
            if not (vocab_bpe and encoder_json):
                raise ValueError("data.gpt2_vocab_bpe and data.gpt2_encoder_json must be given together")
            from tiktoken.load import data_gym_to_mergeable_bpe_ranks

            ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json)
            self._enc = tiktoken.Encoding(
                name="gpt2-local",
                pat_str=GPT2_PATTERN,
                mergeable_ranks=ranks,
                special_tokens={"<|endoftext|>": GPT2_EOT},
                explicit_n_vocab=50257,
            )
        else:  # needs the network once (tiktoken caches the files)
            self._enc = tiktoken.get_encoding("gpt2")
        if self._enc.eot_token != GPT2_EOT:
            raise ValueError(f"gpt2 tokenizer: end-of-text is {self._enc.eot_token}, expected {GPT2_EOT}")

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._enc.encode_ordinary(text), dtype=np.int32)

    def token_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes of generated ids (end-of-text and the vocab's padding have none)."""
        return self._enc.decode_bytes([i for i in ids if 0 <= i < GPT2_EOT])


def build_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The tokenizer ``data.tokenizer`` names."""
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    return GPT2Tokenizer(cfg.gpt2_vocab_bpe, cfg.gpt2_encoder_json)
