"""Passkey retrieval prompts and their exact scoring.

A prompt of exactly ``length`` tokens: end-of-text (a document starts as in training), then
filler text with the needle ``" The key is 12345."`` placed at a depth fraction of the
filler (0: right after the start, 1: right before the question), then the question
``" The key is"``. The model answers by continuing; the answer is right only when its
leading digits are the key exactly (``"123456"`` for ``12345`` is wrong). The filler has no
digits, so the key can only come from the needle.

The template is short on purpose: a byte-level model trained on 64-token windows can still
be asked (30 fixed tokens with 5 digits). The filler repeats plain sentences, as in the
passkey test of Mohtashami and Jaggi (2023).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = " The key is {key}."
QUESTION = " The key is"
_DIGITS = re.compile(r"\s*(\d+)")

Encode = Callable[[str], "np.ndarray | Sequence[int]"]


@dataclass(frozen=True)
class PasskeyPrompt:
    """One prompt: its tokens, the key, where the needle starts (a token index) and how many
    tokens the scorer lets the model generate."""

    tokens: list[int]
    key: str
    needle_at: int
    answer_tokens: int


def fixed_tokens(encode: Encode, digits: int) -> int:
    """Tokens of a prompt that are not filler (end-of-text, needle, question) for a
    ``digits``-digit key: the shortest length a prompt can have."""
    return 1 + len(encode(NEEDLE.format(key="9" * digits))) + len(encode(QUESTION))


def make_key(rng: random.Random, digits: int) -> str:
    """A random ``digits``-digit number (no leading zero)."""
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def build_prompt(encode: Encode, eot: int, length: int, depth: float, key: str) -> PasskeyPrompt:
    """The prompt of exactly ``length`` tokens with ``key``'s needle at ``depth`` (0..1) of
    the filler. A length below :func:`fixed_tokens` is a ValueError naming the shortest."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth {depth}: expected a fraction between 0 and 1")
    needle = [int(t) for t in encode(NEEDLE.format(key=key))]
    question = [int(t) for t in encode(QUESTION)]
    n_filler = length - 1 - len(needle) - len(question)
    if n_filler < 0:
        raise ValueError(f"a passkey prompt needs at least {length - n_filler} tokens; {length} is too short")
    unit = [int(t) for t in encode(FILLER)]
    filler = (unit * (n_filler // len(unit) + 1))[:n_filler]
    cut = round(depth * n_filler)
    tokens = [eot, *filler[:cut], *needle, *filler[cut:], *question]
    answer = len(encode(" " + key)) + 1  # one more than the key needs: "123456" is caught
    return PasskeyPrompt(tokens=tokens, key=key, needle_at=1 + cut, answer_tokens=answer)


def answer_digits(text: str) -> str:
    """The leading number of a generated answer (spaces before it allowed), or ""."""
    m = _DIGITS.match(text)
    return m.group(1) if m else ""


def is_correct(text: str, key: str) -> bool:
    """Exact: the answer's leading number is the key, digit for digit, nothing more."""
    return answer_digits(text) == key
