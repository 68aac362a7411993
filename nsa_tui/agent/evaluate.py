"""The ``eval`` and ``evals`` ops: a long-context evaluation of a run's checkpoint, run by a
process of its own (``python -m nsa.infer.eval_worker``), and the records it leaves.

As for ``sample`` (nsa_tui/agent/sample.py, whose checks, device rule and event forwarding
this reuses): the agent never imports torch; it checks the request (the run, its
checkpoint, the lengths against the context the run trained with, the device), then
forwards the worker's ``eval_start``, ``eval_progress``... and ``eval_done`` events.
"""

from __future__ import annotations

import secrets

from nsa.contract.evals import EvalList, read_evals
from nsa.contract.records import GpuReading
from nsa.contract.requests import EvalArgs
from nsa.contract.rundir import CHECKPOINTS, META_JSON, read_checkpoint_meta, step_name
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.sample import SampleJob, checkpoint_step, pick_device

DEFAULT_DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
SHORTEST_DEFAULT = 32  # default lengths below this are dropped (a prompt's fixed tokens need ~30)


def trained_context(store: RunStore, run: str, step: int) -> int | None:
    """train.seq_len of the config the checkpoint at ``step`` was trained with (its meta.json)."""
    meta = read_checkpoint_meta(store.run_dir(run) / CHECKPOINTS / step_name(step))
    cfg = meta.config if meta else None
    train = cfg.get("train") if isinstance(cfg, dict) else None
    seq = train.get("seq_len") if isinstance(train, dict) else None
    return seq if isinstance(seq, int) else None


def default_lengths(context: int) -> list[int]:
    """A quarter, a half and all of the trained context (the shortest dropped)."""
    return sorted({n for n in (context // 4, context // 2, context) if n >= SHORTEST_DEFAULT}) or [context]


def plan(store: RunStore, a: EvalArgs, gpus: list[GpuReading] | None) -> SampleJob:
    """Check the request before anything starts (an OpError naming what is wrong), and the
    worker's job: lengths beyond the trained context are refused unless asked for."""
    run_dir = store.run_dir(a.run)  # KeyError: no such run
    step, steps = checkpoint_step(store, a.run, a.checkpoint, "evaluate")
    at = step if step is not None else steps[-1]
    context = trained_context(store, a.run, at)
    if context is None:
        raise OpError("bad_checkpoint", f"{a.run} {step_name(at)}: its {META_JSON} holds no config with "
                                        "train.seq_len: cannot tell the context it was trained with")
    lengths = sorted(set(a.lengths)) if a.lengths else default_lengths(context)
    beyond = [n for n in lengths if n > context]
    if beyond and not a.beyond_context:
        raise OpError("bad_request", f"length(s) {', '.join(map(str, beyond))} exceed the context {a.run} "
                                     f"was trained with ({context} tokens, train.seq_len); pass "
                                     "--beyond-context to evaluate them anyway (they are marked)")
    device, env = pick_device(a.device, gpus)
    seed = a.seed if a.seed is not None else secrets.randbelow(1 << 31)
    job = {"run": a.run, "run_dir": str(run_dir), "step": step, "lengths": lengths,
           "depths": sorted(set(a.depths)) if a.depths else DEFAULT_DEPTHS, "trials": a.trials, "seed": seed,
           "digits": a.digits, "buckets": a.buckets, "loss_sequences": a.loss_sequences, "device": device}
    return SampleJob(job=job, env=env)


def records(store: RunStore, run: str) -> EvalList:
    """The run's evaluation records (eval/passkey.jsonl), oldest first."""
    return read_evals(store.run_dir(run))
