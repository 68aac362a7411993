"""Archive and delete runs: what keeps a runs root usable after months of experiments.

Both hold the run's lock (the launcher's ``run_lock``), so they cannot interleave with a
stop, fallback or resume of the same run from another panel, and both refuse a run that is
alive: a live run is never hidden or removed under its own processes, whichever host they run
on (another host's by its lease and heartbeats: nsa_tui/agent/owners.py). Delete also refuses a
run whose continuation (a fallback or resume started from its checkpoint) is alive: that
run may still be reading the checkpoint.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path

from nsa.contract import Archived, RunView, write_json_atomic
from nsa.contract.replies import DeleteResult
from nsa.contract.rundir import ARCHIVED_JSON
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.runlock import run_lock
from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.shared import live_elsewhere_words


def dir_size(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path``, symlinks counted as links (never followed)."""
    total = files = 0
    for root, dirs, names in os.walk(path, followlinks=False):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                continue
    return total, files


class Housekeeping:
    """``archive`` and ``delete`` of the runs in ``store``."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def _refuse_alive(self, run_id: str, verb: str) -> RunView:
        view = self.store.view(run_id, with_tail=False)
        elsewhere = view.live_elsewhere()
        if elsewhere:  # another host's processes: alive by their lease or heartbeats
            raise OpError("running", live_elsewhere_words(run_id, elsewhere, verb))
        if view.alive:
            raise OpError("running", f"{run_id} is {view.status.value}: stop it before you {verb} it")
        return view

    def archive(self, run_id: str, archived: bool = True) -> RunView:
        """Hide the run from the default list (``archived.json``), or show it again."""
        run_dir = self.store.run_dir(run_id)
        with run_lock(run_dir):
            self._refuse_alive(run_id, "archive" if archived else "unarchive")
            marker = run_dir / ARCHIVED_JSON
            if archived:
                write_json_atomic(marker, Archived(ts=time.time()))
            else:
                marker.unlink(missing_ok=True)
            return self.store.view(run_id, with_tail=False)

    def children(self, run_id: str) -> list[RunView]:
        """Runs that continue ``run_id`` (their ``parent_run``)."""
        return [v for v in self.store.views() if v.parent_run == run_id]

    def delete(self, run_id: str, dry_run: bool = False) -> DeleteResult:
        """Remove the run's directory; ``dry_run``: only measure what that frees.

        The directory is first renamed to a hidden name (atomic: the run leaves every list at
        once and is never seen half-deleted), then removed.
        """
        run_dir = self.store.run_dir(run_id)
        with run_lock(run_dir):
            self._refuse_alive(run_id, "delete")
            kids = self.children(run_id)
            live = [k.run_id for k in kids if k.alive or k.live_elsewhere()]
            if live:
                raise OpError("running", f"{', '.join(live)} continues {run_id} and is running: "
                                         "its checkpoint may still be read; stop that run first")
            size, files = dir_size(run_dir)
            result = DeleteResult(run_id=run_id, bytes=size, files=files, deleted=False,
                                  children=[k.run_id for k in kids])
            if dry_run:
                return result
            trash = self.store.root / f".deleting-{run_id}-{secrets.token_hex(3)}"
            os.rename(run_dir, trash)
        shutil.rmtree(trash, ignore_errors=True)
        result.deleted = not trash.exists()
        return result
