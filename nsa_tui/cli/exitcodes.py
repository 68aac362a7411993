"""The exit codes of every ``nsa-tui`` command, on one host or several: one table, so a script
that checks a code gets the same answer whichever path a command took. docs/cli.md prints the
same table; tests/test_cli_exit.py holds the two together and checks every command path."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_BAD_CONFIG", "EXIT_NO_RUN", "EXIT_UNREACHABLE",
           "EXIT_UNHEALTHY", "EXIT_NO_CHECKPOINT", "EXIT_INTERRUPTED", "EXIT_PIPE", "EXIT_CODES",
           "ERROR_EXIT", "exit_for"]

EXIT_OK = 0  # done
EXIT_FAILED = 1  # the operation failed (the message says why)
EXIT_USAGE = 2  # bad arguments, an ambiguous run, a refused request, not confirmed
EXIT_BAD_CONFIG = 3  # the config is invalid, or cannot run on the host
EXIT_NO_RUN = 4  # no such run (or alert)
EXIT_UNREACHABLE = 5  # a host cannot be reached (network, host key, no agent, nsa missing)
EXIT_UNHEALTHY = 6  # status: the run crashed, failed or is lost, a host unreachable, a critical alert
EXIT_NO_CHECKPOINT = 7  # the run has no complete checkpoint (or none at the step asked for)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_PIPE = 141  # stdout closed by its reader (128 + SIGPIPE, as a shell reports it)

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok",
    EXIT_FAILED: "the operation failed",
    EXIT_USAGE: "usage: bad arguments, an ambiguous run, a request the host refused as malformed, "
                "a delete not confirmed, a one-host command given several hosts",
    EXIT_BAD_CONFIG: "bad config, or one that cannot run on the host",
    EXIT_NO_RUN: "no such run (or alert)",
    EXIT_UNREACHABLE: "a host cannot be reached (network, host key, authentication, no agent, nsa missing)",
    EXIT_UNHEALTHY: "`status` found the run unhealthy (crashed, failed or lost, a host unreachable, "
                    "a critical alert)",
    EXIT_NO_CHECKPOINT: "the run has no complete checkpoint, or none at the step asked for (`sample`, "
                        "`eval`, `fallback`, `resume`)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_PIPE: "the reader of the output went away (`| head`)",
}

# error codes (the agent's, the coordinator's, the CLI's own) -> exit code; any other: EXIT_FAILED
ERROR_EXIT: dict[str, int] = {
    "bad_request": EXIT_USAGE,
    "ambiguous_run": EXIT_USAGE,
    "not_confirmed": EXIT_USAGE,
    "bad_config": EXIT_BAD_CONFIG,
    "cannot_run": EXIT_BAD_CONFIG,
    "no_such_run": EXIT_NO_RUN,
    "no_such_alert": EXIT_NO_RUN,
    "unreachable": EXIT_UNREACHABLE,
    "nsa_missing": EXIT_UNREACHABLE,
    "no_checkpoint": EXIT_NO_CHECKPOINT,
    "no_such_checkpoint": EXIT_NO_CHECKPOINT,
}


def exit_for(code: str) -> int:
    """The exit code of an error, by its code (the same on one host and over several)."""
    return ERROR_EXIT.get(code, EXIT_FAILED)


def emit(args: argparse.Namespace, obj: Any, text: str) -> None:
    """``--json``: the record as JSON (nsa.contract's encoding); else ``text``."""
    if args.json:
        from nsa.contract.io import to_builtins

        print(json.dumps(to_builtins(obj), indent=1))
    else:
        print(text)


def fail(args: argparse.Namespace, kind: str, message: str) -> int:
    """Say an error (``--json``: ``{"error": {"code", "message"}}`` on stdout; else on stderr) and
    return its exit code, the table's for ``kind``."""
    if args.json:
        print(json.dumps({"error": {"code": kind, "message": message}}))
    else:
        print(f"nsa-tui: {message}", file=sys.stderr)
    return exit_for(kind)
