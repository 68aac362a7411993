"""``slurm:`` in the settings file: the hosts that are Slurm login nodes, each with its request.

    slurm:
      mycluster:              # the host as the panel names it (an SSH destination or alias)
        partition: gpu
        nodes: 2
        time: "12:00:00"
        account: proj42
        sbatch_args: ["--qos=high"]
        requeue: true

A launch from the panel on such a host is submitted as a batch job with this request (the
dialog's process count is the processes per node). Unknown keys and bad values are refused
with the file and key named, like every other setting.
"""

from __future__ import annotations

from typing import Any

import msgspec

from nsa.contract.slurm import SlurmRequest
from nsa_tui.slurm.script import check_request

FIELDS = [f.name for f in msgspec.structs.fields(SlurmRequest)]


def parse_slurm_hosts(raw: Any, where: str) -> dict[str, SlurmRequest]:
    """host -> request; ValueError naming ``where`` and the key for anything wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: slurm: expected a mapping of host -> request, got {type(raw).__name__}")
    out: dict[str, SlurmRequest] = {}
    for host, spec in raw.items():
        key = f"slurm.{host}"
        spec = {} if spec is None else spec
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: {key}: expected a mapping ({', '.join(FIELDS)})")
        unknown = sorted(set(spec) - set(FIELDS))
        if unknown:
            raise ValueError(f"{where}: {key}: unknown key {unknown[0]!r}; known keys: {', '.join(FIELDS)}")
        try:
            req = msgspec.convert(spec, SlurmRequest)
            check_request(req)
        except (msgspec.ValidationError, ValueError) as exc:
            raise ValueError(f"{where}: {key}: {exc}") from None
        out[str(host)] = req
    return out
