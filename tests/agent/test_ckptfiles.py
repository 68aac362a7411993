"""Checkpoint files moved between hosts: only regular files inside the run directory.

A real local agent through the real client; real files and real symbolic links. A link
planted in a checkpoint directory (or a linked checkpoint directory) must not let
``read_checkpoint_file`` hand out, or ``write_checkpoint_file`` overwrite, a file elsewhere.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nsa.contract import CheckpointMeta
from nsa_tui.hosts.client import AgentError, HostClient

RID = "20260101-000000-ckpt-0001"
SECRET = b"private key material outside the run directory\n"


def meta_json(files: list[str] | None = None) -> bytes:
    """A step-5 checkpoint's meta.json as the trainer writes it."""
    return msgspec.json.encode(CheckpointMeta(
        step=5, tokens=640, world_size=2, grad_accum=1, batch_size=2, global_batch=4, seq_len=64,
        n_streams=2, data_positions={}, files=files or []))


def checkpoint(root: Path, name: str = "step-5") -> Path:
    """A complete checkpoint directory (meta.json) of run RID, with its index file."""
    d = root / RID / "checkpoints" / name
    d.mkdir(parents=True)
    (d / "meta.json").write_bytes(meta_json())
    (d / ".metadata").write_bytes(b"index")
    return d


def with_agent(root: Path, fn: Callable[[HostClient], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        c = HostClient("local", runs_root=str(root))
        await c.start()
        try:
            return await fn(c)
        finally:
            await c.close()

    return asyncio.run(go())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file of the same user outside the runs root."""
    f = tmp_path / "elsewhere" / "id_ed25519"
    f.parent.mkdir()
    f.write_bytes(SECRET)
    return f


def test_a_linked_shard_is_refused_and_a_real_one_read(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "runs"
    d = checkpoint(root)
    os.symlink(outside, d / "__0_0.distcp")

    async def go(c: HostClient) -> tuple[list[str], bytes, AgentError]:
        listed = (await c.checkpoints(RID)).checkpoints[0].files
        ok = await c.read_checkpoint_file(RID, "step-5", ".metadata")
        with pytest.raises(AgentError) as err:
            await c.read_checkpoint_file(RID, "step-5", "__0_0.distcp")
        return [f.name for f in listed], ok.data, err.value

    listed, data, err = with_agent(root, go)
    assert data == b"index" and listed == [".metadata", "meta.json"]  # the link is not offered either
    assert err.code == "not_a_file" and "symbolic link" in err.message and "__0_0.distcp" in err.message
    assert SECRET.decode() not in err.message


def test_a_linked_checkpoint_directory_is_refused(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "runs"
    (root / RID / "checkpoints").mkdir(parents=True)
    away = outside.parent / "step-5"
    away.mkdir()
    (away / "meta.json").write_bytes(meta_json())
    os.symlink(outside, away / "__0_0.distcp")  # a link is refused wherever it points
    (away / "__1_0.distcp").write_bytes(SECRET)  # a regular file, but outside the run directory
    os.symlink(away, root / RID / "checkpoints" / "step-5")

    async def go(c: HostClient) -> list[AgentError]:
        errs = []
        for name in ("__0_0.distcp", "__1_0.distcp"):
            with pytest.raises(AgentError) as err:
                await c.read_checkpoint_file(RID, "step-5", name)
            errs.append(err.value)
        return errs

    for err in with_agent(root, go):
        assert err.code == "not_a_file" and "outside" in err.message, err.message


def test_a_write_never_follows_a_planted_part_file(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "runs"
    d = checkpoint(root)
    os.symlink(outside, d / ".__0_0.distcp.part")

    async def go(c: HostClient) -> AgentError:
        with pytest.raises(AgentError) as err:
            await c.write_checkpoint_file(RID, "step-5", "__0_0.distcp", 0, b"overwritten", final=True)
        return err.value

    err = with_agent(root, go)
    assert err.code == "not_a_file" and "symbolic link" in err.message, err.message
    assert outside.read_bytes() == SECRET and not (d / "__0_0.distcp").exists()


def test_a_regular_shard_is_still_copied_between_hosts_in_chunks(tmp_path: Path) -> None:
    """The refusal costs the real case nothing: a shard one host lacks comes from the other, whole."""
    from nsa_tui.hosts import coordinator

    roots = [tmp_path / "gpu1", tmp_path / "gpu2"]
    for i, root in enumerate(roots):
        d = checkpoint(root)
        (d / "meta.json").write_bytes(meta_json([".metadata", "__0_0.distcp", "__1_0.distcp"]))
        (d / f"__{i}_0.distcp").write_bytes(bytes([i + 1]) * ((5 << 20) + 7))  # more than one chunk

    async def go() -> int:
        clients = {r.name: HostClient("local", runs_root=str(r)) for r in roots}
        for c in clients.values():
            await c.start()
        try:
            return await coordinator.gather(clients, RID, "step-5", ["gpu1"])
        finally:
            for c in clients.values():
                await c.close()

    assert asyncio.run(go()) == (5 << 20) + 7
    got = roots[0] / RID / "checkpoints" / "step-5" / "__1_0.distcp"
    assert got.read_bytes() == (roots[1] / RID / "checkpoints" / "step-5" / "__1_0.distcp").read_bytes()
    assert not list(got.parent.glob(".*.part"))
