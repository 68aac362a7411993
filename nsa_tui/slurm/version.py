"""The cluster's Slurm version (``sinfo --version``) and the flags it decides.

Why: login nodes run anything from Slurm 17 to 24; a flag the cluster lacks makes sbatch
refuse the job. Only flags every supported version has are used, and the version is
checked first so an unsupported cluster is a clear refusal, not sbatch's error.
"""

from __future__ import annotations

import re

# --chdir (17.11), --signal=B:SIG@S, --open-mode, --parsable, --requeue/--no-requeue and
# scontrol show hostnames are all older than this.
MIN_VERSION = (17, 11)
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class SlurmVersionError(ValueError):
    """No Slurm, or one older than this supports."""


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of ``sinfo --version`` output (``slurm 23.02.4``, ``slurm-wlm 22.05.8``)."""
    m = _VERSION.search(text or "")
    if not m:
        raise SlurmVersionError(f"cannot read a Slurm version from {text.strip()[:80]!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def check_supported(version: tuple[int, int, int]) -> None:
    if version[:2] < MIN_VERSION:
        raise SlurmVersionError(
            f"Slurm {'.'.join(map(str, version))} is older than "
            f"{'.'.join(map(str, MIN_VERSION))}, the oldest nsa-tui submits to"
        )

