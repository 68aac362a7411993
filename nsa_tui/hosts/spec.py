"""A host as the user names it, with its own runs root where it has one: ``gpu1:/scratch/runs``.

Clusters differ: most share one home (one runs root for every node, the default), some give
each node a scratch disk of its own. A host list may therefore say, per host, where its runs
live: ``gpu1:/scratch/runs,gpu2`` runs on gpu1 under /scratch/runs and on gpu2 under the
default. A runs root starts with ``/`` or ``~`` after the colon, so ``user@host:2222`` (a port)
is never taken for one. The spec as given stays the host's name everywhere (a run's node
layout records it), so a later command that finds the run's hosts reaches the same roots.
"""

from __future__ import annotations


def split_runs_root(spec: str) -> tuple[str, str | None]:
    """(destination, runs root or None) of a host spec."""
    for i, ch in enumerate(spec):
        if ch == ":" and spec[i + 1:i + 2] in ("/", "~"):
            return spec[:i], spec[i + 1:]
    return spec, None


def runs_root_for(spec: str, default: str | None, per_host: dict[str, str] | None = None) -> str | None:
    """The runs root a host's agent is started with: the spec's own, else the settings file's for
    that destination, else ``default`` (``--runs-root``; None: the agent's NSA_RUNS_ROOT or
    ~/nsa-runs)."""
    dest, root = split_runs_root(spec)
    if root:
        return root
    if per_host and dest in per_host:
        return per_host[dest]
    return default
