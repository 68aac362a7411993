"""``launch --slurm``'s options as the request the agent gets (and their misuse refused)."""

from __future__ import annotations

import argparse

from nsa.contract.slurm import SlurmRequest

SLURM_ONLY = ("nodes", "partition", "time", "account", "sbatch_arg", "requeue")


class SlurmUsageError(ValueError):
    """A Slurm option without --slurm, or a bad value."""


def slurm_request(args: argparse.Namespace) -> SlurmRequest | None:
    """The request, None without ``--slurm``; a Slurm-only option without it is an error."""
    if not getattr(args, "slurm", False):
        given = [
            f"--{n.replace('_', '-')}" for n in SLURM_ONLY if getattr(args, n, None) not in (None, False, [])
        ]
        if given:
            raise SlurmUsageError(f"{', '.join(given)} only apply with --slurm")
        return None
    if args.nodes is not None and args.nodes < 1:
        raise SlurmUsageError(f"--nodes must be at least 1, got {args.nodes}")
    return SlurmRequest(
        nodes=args.nodes or 1,
        partition=args.partition,
        time=args.time,
        account=args.account,
        sbatch_args=list(args.sbatch_arg),
        requeue=args.requeue,
    )
