"""``nsa-tui eval HOST RUN --passkey``: long-context evaluation of a run's checkpoint.

The host's agent runs it in a process of its own (the device rule of ``sample``): passkey
retrieval per length x depth and the loss by position bucket. Progress goes to stderr as it
runs; the result (a table, or with ``--json`` the PasskeyEval record) to stdout, and the
record is appended to the run's eval/passkey.jsonl. ``--history`` prints the recorded
evaluations instead of running one.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nsa_tui.cli.exitcodes import EXIT_OK


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers (comma-separated)") from None


def _fractions(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected fractions (comma-separated)") from None


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``eval`` subcommand's arguments."""
    sp = sub.add_parser("eval", parents=[common], help="long-context evaluation of a run's checkpoint")
    sp.add_argument("host")
    sp.add_argument("run")
    sp.add_argument("--passkey", action="store_true",
                    help="passkey retrieval per length x depth, and the loss by position")
    sp.add_argument("--history", action="store_true", help="print the run's recorded evaluations")
    sp.add_argument("--checkpoint", default=None, metavar="STEP", help="its step (default: the newest)")
    sp.add_argument("--lengths", type=_ints, default=None, metavar="N,N,...",
                    help="prompt lengths in tokens (default: a quarter, half and all of the trained context)")
    sp.add_argument("--depths", type=_fractions, default=None, metavar="F,F,...",
                    help="where the key sits, 0 (start) to 1 (end) (default: 0,0.25,0.5,0.75,1)")
    sp.add_argument("--trials", type=int, default=4, metavar="N", help="prompts per length and depth")
    sp.add_argument("--seed", type=int, default=None, metavar="S",
                    help="same seed, same keys and result (default: random)")
    sp.add_argument("--loss-sequences", type=int, default=4, metavar="N",
                    help="held-out sequences for the loss by position (0: none)")
    sp.add_argument("--buckets", type=int, default=8, metavar="N", help="position buckets of the loss")
    sp.add_argument("--beyond-context", action="store_true",
                    help="allow lengths above the context the run trained with (marked in the result)")
    sp.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU no process uses, "
                                                   "else the CPU)")


def _bad(args: argparse.Namespace) -> str | None:
    if args.history:
        return None
    if not args.passkey:
        return "eval: choose what to evaluate: --passkey (or --history to list the recorded evaluations)"
    if args.lengths is not None and (not args.lengths or min(args.lengths) < 1):
        return "--lengths must be positive numbers of tokens"
    if args.depths is not None and (not args.depths or not all(0 <= d <= 1 for d in args.depths)):
        return "--depths must be fractions between 0 and 1"
    for name in ("trials", "buckets"):
        if getattr(args, name) < 1:
            return f"--{name} must be at least 1"
    if args.loss_sequences < 0:
        return "--loss-sequences must be >= 0"
    if args.seed is not None and args.seed < 0:
        return "--seed must be >= 0"
    return None


def result_text(rec: Any) -> str:
    """A PasskeyEval for people: the accuracy grid (lengths beyond the trained context
    starred) and the loss per position bucket."""
    lines = [f"passkey accuracy  {rec.run} {rec.checkpoint} ({rec.attention or '?'}, {rec.device}), "
             f"{rec.trials} trial(s) per cell, seed {rec.seed}"]
    lines.append("length \\ depth " + "".join(f"{d:>7.2f}" for d in rec.depths) + "    mean")
    for n, row in zip(rec.lengths, rec.accuracy):
        mark = "*" if n in rec.beyond_context else " "
        mean = sum(row) / len(row) if row else 0.0
        lines.append(f"{n:>14}{mark}" + "".join(f"{a:>7.2f}" for a in row) + f"  {mean:>6.2f}")
    if rec.beyond_context:
        lines.append(f"* beyond the trained context ({rec.trained_context} tokens)")
    if rec.loss_buckets:
        lines.append(f"loss by position ({rec.loss_source}, {rec.loss_sequences} sequence(s) of "
                     f"{rec.loss_length} tokens)")
        lines += [f"  {b.start:>7}-{b.end:<7} {b.loss:.4f}" for b in rec.loss_buckets]
    return "\n".join(lines)


async def run(c: Any, args: argparse.Namespace) -> int:
    """Run the evaluation with progress on stderr, then print the result. Errors are raised
    as AgentError: the CLI's one path gives each its exit code."""
    from nsa.contract.io import to_builtins
    from nsa_tui.hosts.client import AgentError

    why = _bad(args)
    if why:
        raise AgentError("bad_request", why)
    if args.history:
        recs = (await c.evals(args.run)).evals
        if args.json:
            print(json.dumps([to_builtins(r) for r in recs]))
        else:
            print("\n\n".join(result_text(r) for r in recs) if recs else f"{args.run}: no evaluations yet")
        return EXIT_OK
    async for ev in c.evaluate(args.run, checkpoint=args.checkpoint, lengths=args.lengths or (),
                               depths=args.depths or (), trials=args.trials, seed=args.seed,
                               beyond_context=args.beyond_context, loss_sequences=args.loss_sequences,
                               buckets=args.buckets, device=args.device):
        d = ev.data
        if ev.kind == "eval_start":
            print(f"eval {args.run} {d.checkpoint} on {d.device}, seed {d.seed}: lengths "
                  f"{', '.join(map(str, d.lengths))} (trained context {d.trained_context}), depths "
                  f"{', '.join(f'{x:g}' for x in d.depths)}, {d.trials} trial(s)",
                  file=sys.stderr, flush=True)
        elif ev.kind == "eval_progress":
            what = (f"passkey length {d.length}: {d.correct} right so far" if d.part == "passkey"
                    else f"loss by position, {d.length} tokens")
            print(f"  [{d.done}/{d.total}] {what} ({d.seconds:.1f} s)", file=sys.stderr, flush=True)
        elif ev.kind == "eval_done":
            print(json.dumps(to_builtins(d)) if args.json else result_text(d))
            return EXIT_OK
    raise AgentError("eval_failed", "the eval stream ended without a result")
