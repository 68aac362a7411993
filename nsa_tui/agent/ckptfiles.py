"""Checkpoint files of a run, listed and moved between hosts in chunks.

A run over several hosts writes each node's shards into that node's run directory
(docs/run-directory.md); a load needs all of them in one place. Without a shared
filesystem the client gathers them: it lists each host's checkpoints, reads the shards a
host lacks from the host that has them and appends them there (docs/multi-node.md).
Only DCP's own file names of a complete checkpoint can be read or written, and a file
that exists is never overwritten: these ops cannot touch anything else of the host. Nor
through a link: a symbolic link in a checkpoint directory (or a checkpoint directory that
resolves outside its run directory) is refused, never followed, so a link planted there
cannot hand out or overwrite a file elsewhere (an SSH key, another user's data).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from nsa.contract.replies import CheckpointEntry, CheckpointFile, CheckpointList, FileChunk
from nsa.contract.requests import CheckpointFileArgs, WriteCheckpointFileArgs
from nsa.contract.rundir import CHECKPOINTS
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.runs import RunStore

DCP_FILE = re.compile(r"^(__\d+_\d+\.distcp|\.metadata)$")
MAX_CHUNK = 8 << 20


def checkpoint_list(store: RunStore, run_id: str) -> CheckpointList:
    return CheckpointList(checkpoints=[
        CheckpointEntry(name=name, step=step, files=[CheckpointFile(name=f, size=n) for f, n in here],
                        needs=needs)
        for name, step, here, needs in store.checkpoints(run_id)])


def _file(store: RunStore, run_id: str, checkpoint: str, name: str) -> Path:
    """The path of one DCP file of a complete checkpoint (KeyError: no such checkpoint)."""
    d = store.checkpoint_dir(run_id, checkpoint)
    if not DCP_FILE.match(name):
        raise OpError("bad_request", f"{name!r} is not a checkpoint shard or index")
    return d / name


def _open_inside(store: RunStore, run_id: str, path: Path, flags: int) -> int:
    """``os.open`` of a regular file of the run directory: a symbolic link (the file itself) is
    refused by O_NOFOLLOW, a directory on the way that leads outside the run by its resolved
    path. Why: what is read here goes to another host, what is written replaces a file."""
    where = f"{run_id}/{path.relative_to(store.run_dir(run_id)).as_posix()}"
    run_dir = store.run_dir(run_id).resolve()
    parent = path.parent.resolve()
    if not parent.is_relative_to(run_dir):
        raise OpError("not_a_file", f"{where} resolves outside the run directory ({parent} is not in "
                      f"{run_dir}): checkpoint files are moved only from and to the run's own directory "
                      "(replace the link with the directory itself)")
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            try:
                target = f" to {os.readlink(path)}"
            except OSError:  # replaced meanwhile
                target = ""
            raise OpError("not_a_file", f"{where} is a symbolic link{target}: checkpoint files are moved "
                          "only as regular files (replace the link with the file itself)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OpError("not_a_file", f"{where} is not a regular file")
    return fd


def read_chunk(store: RunStore, a: CheckpointFileArgs) -> FileChunk:
    """Up to ``max_bytes`` (at most MAX_CHUNK) of one checkpoint file from ``offset``."""
    path = _file(store, a.run, a.checkpoint, a.file)
    try:
        fd = _open_inside(store, a.run, path, os.O_RDONLY)
    except FileNotFoundError:
        where = f"{a.run}/{CHECKPOINTS}/{a.checkpoint}/{a.file}"
        raise OpError("no_such_file", f"{where} is not on this host") from None
    with open(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, min(a.offset, size)))
        data = fh.read(max(0, min(a.max_bytes, MAX_CHUNK)))
    return FileChunk(data=data, offset=max(0, min(a.offset, size)), size=size)


def write_chunk(store: RunStore, a: WriteCheckpointFileArgs) -> dict[str, int]:
    """Append ``data`` at ``offset`` of ``.<file>.part``; ``final``: rename it to ``file``."""
    path = _file(store, a.run, a.checkpoint, a.file)
    if os.path.lexists(path):  # a link too: never replaced
        raise OpError("exists", f"{a.run}/{CHECKPOINTS}/{a.checkpoint}/{a.file} already exists here")
    part = path.with_name(f".{a.file}.part")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if a.offset == 0 else 0)
    fd = _open_inside(store, a.run, part, flags)
    try:
        size = os.fstat(fd).st_size
        if a.offset != size:
            raise OpError("bad_request", f"chunk at offset {a.offset}, but {part.name} has {size} bytes")
        os.lseek(fd, size, os.SEEK_SET)
        view = memoryview(a.data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if a.final:
            os.fsync(fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if a.final:
        os.rename(part, path)
    return {"size": size}
