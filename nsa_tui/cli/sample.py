"""``nsa-tui sample HOST RUN``: text from a run's checkpoint, printed as it is generated.

The host's agent loads the checkpoint with the run's own config and tokenizer in a process
of its own, on a GPU no process uses or on the CPU (``--device`` to choose). ``--json``
prints one document at the end: the prompt, the generated text and the token ids
(SampleDone). A run without a checkpoint, or a step it does not have, exits with
EXIT_NO_CHECKPOINT and a message naming the steps that exist.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nsa_tui.cli.exitcodes import EXIT_NO_CHECKPOINT, EXIT_OK

__all__ = ["EXIT_NO_CHECKPOINT", "add_parser", "run"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``sample`` subcommand's arguments."""
    sp = sub.add_parser("sample", parents=[common], help="generate text from a run's checkpoint")
    sp.add_argument("host")
    sp.add_argument("run")
    sp.add_argument("--checkpoint", default=None, metavar="STEP", help="its step (default: the newest)")
    src = sp.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, metavar="TEXT", help="text to continue (default: none)")
    src.add_argument("--prompt-file", default=None, metavar="FILE", help="read the prompt from this file")
    sp.add_argument("--max-new-tokens", type=int, default=200, metavar="N")
    sp.add_argument("--temperature", type=float, default=1.0, metavar="T", help="0: greedy (default 1)")
    sp.add_argument("--top-k", type=int, default=None, metavar="K")
    sp.add_argument("--top-p", type=float, default=None, metavar="P")
    sp.add_argument("--seed", type=int, default=None, metavar="S",
                    help="same seed, same text (default: random)")
    sp.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU no process uses, "
                                                   "else the CPU)")


def _bad(args: argparse.Namespace) -> str | None:
    if args.max_new_tokens < 1:
        return "--max-new-tokens must be at least 1"
    if args.temperature < 0:
        return "--temperature must be >= 0"
    if args.top_k is not None and args.top_k < 1:
        return "--top-k must be at least 1"
    if args.top_p is not None and not 0 < args.top_p <= 1:
        return "--top-p must be in (0, 1]"
    if args.seed is not None and args.seed < 0:
        return "--seed must be >= 0"
    return None


async def run(c: Any, args: argparse.Namespace) -> int:
    """Stream the answer to stdout (text) or print it at the end (``--json``). Errors are
    raised as AgentError: the CLI's one path gives each its exit code (a missing checkpoint:
    EXIT_NO_CHECKPOINT)."""
    from nsa.contract.io import to_builtins
    from nsa_tui.hosts.client import AgentError

    why = _bad(args)
    if why:
        raise AgentError("bad_request", why)
    prompt = args.prompt or ""
    if args.prompt_file:
        try:
            prompt = Path(args.prompt_file).expanduser().read_text()
        except (OSError, UnicodeDecodeError) as exc:
            why = f"--prompt-file {args.prompt_file}: cannot read it ({exc})"
            raise AgentError("bad_request", why) from None
    async for ev in c.sample(args.run, checkpoint=args.checkpoint, prompt=prompt,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, seed=args.seed, device=args.device):
        if ev.kind == "sample_start" and not args.json:
            d = ev.data
            seed = "greedy" if args.temperature == 0 else f"seed {d.seed}"  # greedy draws nothing
            how = f", decoding: {d.decode_path}" if d.decode_path else ""
            print(f"{args.run} {d.checkpoint} on {d.device}, {seed}{how}", file=sys.stderr, flush=True)
            sys.stdout.write(prompt)
            sys.stdout.flush()
        elif ev.kind == "sample_text" and not args.json:
            sys.stdout.write(ev.data.text)
            sys.stdout.flush()
        elif ev.kind == "sample_done":
            if args.json:
                print(json.dumps(to_builtins(ev.data)))
            else:
                print()
            return EXIT_OK
    raise AgentError("sample_failed", "the sample stream ended without an answer")
