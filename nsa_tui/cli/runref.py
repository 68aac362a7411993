"""A run named the way a person types it: its full id, a unique prefix of the id, or its name.

Why: ids are long (``20261123-052225-tiny-cpu-0b48``) and nobody types them whole; the CLI's
``runs`` shows the shortest unique prefix. Ambiguity is an error that lists the candidates,
never a guess (stopping the wrong run is worse than asking again).
"""

from __future__ import annotations

from collections.abc import Sequence

from nsa.contract import RunView

MIN_SHORT = 15  # "yyyymmdd-HHMMSS": the launch second, unique unless two launches share it


class RunRefError(Exception):
    """``code``: ``no_such_run`` (nothing matches) or ``ambiguous_run`` (several do)."""

    def __init__(self, code: str, message: str, matches: Sequence[RunView] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.matches = list(matches)


def resolve(ref: str, runs: Sequence[RunView]) -> str:
    """The run id that ``ref`` names among ``runs``: an exact id, else the runs whose id starts
    with ``ref`` together with the runs named ``ref``; exactly one must match."""
    ref = ref.strip()
    if not ref:
        raise RunRefError("no_such_run", "no run given")
    for r in runs:
        if r.run_id == ref:
            return r.run_id
    matches = {r.run_id: r for r in runs if r.run_id.startswith(ref) or r.name == ref}
    if len(matches) == 1:
        return next(iter(matches))
    if not matches:
        raise RunRefError("no_such_run", f"no run {ref!r} (neither an id, an id prefix nor a run name)")
    shown = sorted(matches.values(), key=lambda r: r.run_id, reverse=True)
    lines = [f"  {r.run_id}  {r.name}  {r.status.value}" for r in shown[:20]]
    if len(shown) > 20:
        lines.append(f"  ... and {len(shown) - 20} more")
    raise RunRefError("ambiguous_run", f"{ref!r} matches {len(shown)} runs; give more of the id:\n"
                      + "\n".join(lines), shown)


def short_ids(run_ids: Sequence[str], minimum: int = MIN_SHORT) -> dict[str, str]:
    """Each id cut to its shortest prefix (at least ``minimum`` characters) that no other id
    shares: what ``runs`` shows and ``resolve`` accepts."""
    out: dict[str, str] = {}
    ordered = sorted(run_ids)
    for i, rid in enumerate(ordered):
        need = minimum
        for other in (ordered[i - 1] if i else None, ordered[i + 1] if i + 1 < len(ordered) else None):
            if other is None:
                continue
            common = 0
            for a, b in zip(rid, other):
                if a != b:
                    break
                common += 1
            need = max(need, common + 1)
        out[rid] = rid[:need]
    return out
