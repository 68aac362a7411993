"""Long-context evaluation of a model: passkey retrieval per length x depth, loss by position.

Used by ``nsa-tui eval``'s worker (nsa/infer/eval_worker.py) on a loaded checkpoint and by
the trainer (``eval.every_steps``) on the model it trains; both append the same
:class:`~nsa.contract.evals.PasskeyEval` record. Deterministic for a seed: the keys come
from ``random.Random(seed)`` in a fixed order, decoding is greedy, and the held-out text is
the first windows of the run's validation split (or the filler).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from nsa.config import Config
from nsa.contract.evals import EvalProgress, LossBucket, PasskeyEval
from nsa.contract.rundir import step_name
from nsa.infer.decode import prefill
from nsa.infer.graph import DecodeRunner, decode_path
from nsa.infer.passkey import FILLER, PasskeyPrompt, build_prompt, fixed_tokens, is_correct, make_key
from nsa.model.transformer import Transformer
from nsa.train.tokenizer import Tokenizer

log = logging.getLogger(__name__)
Progress = Callable[[EvalProgress], None]
BATCH = 8  # prompts decoded together (same length: no padding) ...
BATCH_TOKENS = 1 << 16  # ... at most this many prompt tokens in one prefill
LOSS_CHUNK = 4096  # positions per lm_head + cross-entropy (a long sequence's logits need not fit)


@dataclass
class EvalPlan:
    """What to evaluate. ``loss_length`` 0: the longest of ``lengths``."""

    lengths: list[int]
    depths: list[float]
    trials: int = 1
    seed: int = 0
    digits: int = 5
    buckets: int = 8
    loss_sequences: int = 4
    loss_length: int = 0

    def total(self) -> int:
        """Units of progress: one per passkey prompt and per loss sequence."""
        return len(self.lengths) * len(self.depths) * self.trials + self.loss_sequences


@dataclass
class EvalResult:
    hits: list[list[int]] = field(default_factory=list)
    accuracy: list[list[float]] = field(default_factory=list)
    buckets: list[LossBucket] = field(default_factory=list)
    loss_length: int = 0
    loss_source: str = ""
    seconds: float = 0.0
    decode_path: str = ""  # how the passkey answers were decoded: "cuda-graph" or "eager"


def check_plan(plan: EvalPlan, shortest: int) -> None:
    """ValueError naming what is wrong: no lengths or depths, a length below ``shortest``
    (the fixed tokens of a prompt), a depth outside [0, 1], a non-positive count."""
    if not plan.lengths or not plan.depths:
        raise ValueError("need at least one length and one depth")
    short = [n for n in plan.lengths if n < shortest]
    if short:
        raise ValueError(f"length(s) {', '.join(map(str, short))} below {shortest}, the shortest passkey "
                         "prompt (end-of-text, needle and question)")
    bad = [d for d in plan.depths if not 0.0 <= d <= 1.0]
    if bad:
        raise ValueError(f"depth(s) {', '.join(map(str, bad))}: a depth is a fraction between 0 and 1")
    if plan.trials < 1 or plan.buckets < 1 or plan.loss_sequences < 0 or plan.digits < 1:
        raise ValueError("trials, buckets and digits must be at least 1, loss_sequences at least 0")


def prompts_for(tok: Tokenizer, plan: EvalPlan) -> list[list[list[PasskeyPrompt]]]:
    """``[length][depth][trial]`` prompts, keys drawn from ``Random(seed)`` in that order."""
    rng = random.Random(plan.seed)
    return [[[build_prompt(tok.encode, tok.eot, n, d, make_key(rng, plan.digits)) for _ in range(plan.trials)]
             for d in plan.depths] for n in plan.lengths]


def _answer(tok: Tokenizer, ids: Sequence[int]) -> str:
    return tok.token_bytes([t for t in ids if t != tok.eot]).decode("utf-8", "replace")


@torch.no_grad()
def greedy(model: Transformer, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
    """``n`` greedy tokens after each prompt (all of one length), with the KV cache; the
    prompts' logits are computed at their last position only. The steps run through
    ``DecodeRunner`` (a CUDA graph on CUDA) and the tokens stay on the device until the end."""
    device = next(model.parameters()).device
    tokens = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=device)
    logits, state = prefill(model, tokens, max_new_tokens=n - 1, last_only=True)
    tok = logits.float().argmax(dim=-1)
    out = [tok]
    runner = DecodeRunner(model, state)
    for _ in range(n - 1):
        tok = runner.step(tok)
        out.append(tok)
    return torch.stack(out, dim=1).tolist()


@torch.no_grad()
def passkey(model: Transformer, tok: Tokenizer, plan: EvalPlan, progress: Progress | None = None,
            done0: int = 0) -> list[list[int]]:
    """``hits[length][depth]``: prompts answered exactly, greedy, batched per length."""
    path, why = decode_path(next(model.parameters()).device)
    log.info("passkey: decode path: %s (%s)", path, why)
    grid = prompts_for(tok, plan)
    total, done = plan.total(), done0
    hits = [[0] * len(plan.depths) for _ in plan.lengths]
    t0 = time.monotonic()
    for i, n in enumerate(plan.lengths):
        flat = [(j, p) for j, row in enumerate(grid[i]) for p in row]
        batch = max(1, min(BATCH, BATCH_TOKENS // n))
        for k in range(0, len(flat), batch):
            part = flat[k:k + batch]
            outs = greedy(model, [p.tokens for _, p in part], max(p.answer_tokens for _, p in part))
            for (j, p), out in zip(part, outs):
                hits[i][j] += is_correct(_answer(tok, out[:p.answer_tokens]), p.key)
            done += len(part)
            if progress:
                progress(EvalProgress(done=done, total=total, part="passkey", length=n,
                                      depth=plan.depths[part[-1][0]], correct=sum(hits[i]),
                                      seconds=round(time.monotonic() - t0, 3)))
    return hits


def filler_windows(tok: Tokenizer, length: int) -> Iterator[np.ndarray]:
    """Held-out text when the run's own source cannot be read here: the filler, repeated."""
    unit = np.asarray(tok.encode(FILLER), dtype=np.int64)
    while True:
        yield np.concatenate([[tok.eot], np.tile(unit, length // len(unit) + 2)])[:length]


@torch.no_grad()
def loss_by_position(model: Transformer, windows: Iterator[np.ndarray], plan: EvalPlan, length: int,
                     progress: Progress | None = None, done0: int = 0, chunk: int = LOSS_CHUNK
                     ) -> list[LossBucket]:
    """Mean next-token loss per position bucket (``plan.buckets`` equal spans of ``length``)
    over ``plan.loss_sequences`` windows of ``length + 1`` tokens (one full forward each; the
    logits ``chunk`` positions at a time)."""
    device = next(model.parameters()).device
    sums = torch.zeros(length, dtype=torch.float64)
    seen = 0
    t0 = time.monotonic()
    for w in windows:
        if seen == plan.loss_sequences:
            break
        x = torch.as_tensor(np.asarray(w[:length + 1]), dtype=torch.long, device=device)[None]
        h = model.tok_emb(x[:, :-1])
        for block in model.blocks:
            h = block(h)
        h = model.norm(h)[0]  # the model's forward, up to the logits
        for s in range(0, length, chunk):
            logits = model.lm_head(h[s:s + chunk]).float()
            ce = torch.nn.functional.cross_entropy(logits, x[0, s + 1:s + 1 + chunk], reduction="none")
            sums[s:s + chunk] += ce.double().cpu()
        seen += 1
        if progress:
            progress(EvalProgress(done=done0 + seen, total=plan.total(), part="loss", length=length,
                                  seconds=round(time.monotonic() - t0, 3)))
    if not seen:
        return []
    edges = [round(b * length / plan.buckets) for b in range(plan.buckets + 1)]
    return [LossBucket(start=a, end=b, loss=float(sums[a:b].mean() / seen), tokens=(b - a) * seen)
            for a, b in zip(edges, edges[1:]) if b > a]


def evaluate(model: Transformer, tok: Tokenizer, plan: EvalPlan, windows: Iterator[np.ndarray] | None,
             progress: Progress | None = None) -> EvalResult:
    """Passkey accuracy, then loss by position on ``windows`` (None: the filler). The model
    is put in eval mode for the duration and left as it was found."""
    check_plan(plan, fixed_tokens(tok.encode, plan.digits))
    was_training = model.training
    model.eval()
    t0 = time.monotonic()
    try:
        hits = passkey(model, tok, plan, progress)
        length = plan.loss_length or max(plan.lengths)
        source = "val" if windows is not None else "filler"
        buckets = loss_by_position(model, windows if windows is not None else filler_windows(tok, length + 1),
                                   plan, length, progress, done0=plan.total() - plan.loss_sequences)
    finally:
        model.train(was_training)
    acc = [[h / plan.trials for h in row] for row in hits]
    return EvalResult(hits=hits, accuracy=acc, buckets=buckets, loss_length=length,
                      loss_source=source if buckets else "", seconds=round(time.monotonic() - t0, 3),
                      decode_path=decode_path(next(model.parameters()).device)[0])


def val_windows(cfg: Config, tok: Tokenizer, length: int) -> Iterator[np.ndarray] | None:
    """Windows of ``length + 1`` tokens from the start of the run's validation split (never
    trained on), or None when the source cannot be read here (fineweb-edu with
    ``HF_HUB_OFFLINE=1``, files that are not on this host, a split too small)."""
    from nsa.train.data import Packer
    from nsa.train.sources import DataSourceError, build_source

    if cfg.data.source == "fineweb-edu" and os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    try:
        packer = Packer(build_source(cfg.data), tok, 0, 1, "val", length + 1, wrap=False)
    except (DataSourceError, OSError, ValueError):
        return None

    def gen() -> Iterator[np.ndarray]:
        while (w := packer.next_window()) is not None:
            yield w

    return gen()


def make_record(result: EvalResult, plan: EvalPlan, *, run: str, step: int, cfg: Config, device: str,
                origin: str) -> PasskeyEval:
    """The run-directory record of one evaluation (lengths past train.seq_len marked; a
    periodic one, ``origin`` train, names no checkpoint: it evaluated the weights of the step)."""
    ctx = cfg.train.seq_len
    ckpt = step_name(step) if origin == "cli" else ""
    return PasskeyEval(ts=time.time(), run=run, step=step, checkpoint=ckpt,
                       origin=origin,  # type: ignore[arg-type]
                       attention=cfg.model.attention.kind, device=device, seed=plan.seed, digits=plan.digits,
                       trials=plan.trials, trained_context=ctx, lengths=list(plan.lengths),
                       depths=list(plan.depths), beyond_context=[n for n in plan.lengths if n > ctx],
                       accuracy=result.accuracy, hits=result.hits, loss_buckets=result.buckets,
                       loss_length=result.loss_length, loss_sequences=plan.loss_sequences,
                       loss_source=result.loss_source, seconds=result.seconds)
