"""Real tiny nsa-train runs (2 ranks on CPU) launched and watched over a real sshd."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from nsa.contract import RunStatus, TrainMetric
from nsa_tui.hosts.client import Event, HostClient
from nsa_tui.transport.ssh import SshTransport
from tests.agent.e2e import SMOKE, is_over, stop_all
from tests.sshd import ALIAS, SshServer

pytestmark = [pytest.mark.slow, pytest.mark.ssh]
STEPS = 150  # long enough that both drops happen while the run is still training


def ssh_client(server: SshServer, root: Path, states: list[str] | None = None) -> HostClient:
    tr = SshTransport(server.dest, runs_root=str(root), remote_python=sys.executable, **server.ssh_options)
    return HostClient(server.dest, transport=tr,
                      on_state=(lambda s: states.append(s.status)) if states is not None else None)


async def test_launch_watch_drop_reconnect_no_gap_no_duplicate(sshd: SshServer, tmp_path: Path) -> None:
    states: list[str] = []
    c = ssh_client(sshd, tmp_path, states)
    await c.start()
    events: list[Event] = []
    rid = ""
    try:
        t0 = time.monotonic()
        run = await c.launch(SMOKE, nproc=2, overrides=[f"train.steps={STEPS}", "train.save_every=1000"])
        rid = run.run_id
        agent = psutil.Process(c.hello.pid)
        cpu0, w0 = sum(agent.cpu_times()[:2]), time.monotonic()
        first_beat = dropped = aborted = None
        async for ev in c.watch(rid):
            events.append(ev)
            if ev.kind == "beats" and first_beat is None:
                first_beat = time.monotonic() - t0
            step = max((m.step for m in ev.data), default=0) if ev.kind == "metrics" else 0
            if dropped is None and step >= 10:
                cpu = (sum(agent.cpu_times()[:2]) - cpu0) / (time.monotonic() - w0)
                print(f"\nMEASURE ssh: launch -> first heartbeat {first_beat:.2f} s; "
                      f"agent CPU while watching {100 * cpu:.1f}% of one core")
                await asyncio.to_thread(sshd.restart)  # every connection and session dies
                dropped = time.monotonic()
            # the first new steps after the server-side drop healed: now the client side cuts the
            # link (on an event, not a step number: a slow reconnect may deliver the rest at once)
            if aborted is None and dropped is not None and states.count("connected") >= 2 \
                    and step > 0 and not is_over(ev):
                c.drop_connection()
                aborted = time.monotonic()
            if is_over(ev):
                break
        assert dropped is not None and aborted is not None and states[-1] == "connected"
        assert states.count("reconnecting") >= 2
        assert events[-1].data.status == RunStatus.FINISHED  # the run kept going without us
        run_dir = tmp_path / rid
        steps = [m.step for e in events if e.kind == "metrics" for m in e.data if isinstance(m, TrainMetric)]
        on_disk = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
                   if json.loads(x).get("kind") == "train"]
        assert steps == on_disk == list(range(1, STEPS + 1))  # no gap, no duplicate, across the drop
        for stream in ("heartbeats/rank-0", "heartbeats/rank-1", "log"):
            got = [e for e in events if e.stream == stream and e.kind in ("beats", "log")]
            offs = [e.offset for e in got]
            path = run_dir / (f"{stream}.jsonl" if stream != "log" else "train.log")
            assert offs == sorted(set(offs)) and offs[-1] == path.stat().st_size  # every line before the end
            if stream == "log":  # the log's tail covers this short run: every line, exactly once
                assert sum(len(e.data.lines) for e in got) == path.read_bytes().count(b"\n")
    finally:
        if rid:
            await stop_all(c, [rid])
        await c.close()


def test_cli_over_ssh_names_and_paths_cannot_inject(sshd: SshServer, tmp_path: Path) -> None:
    mark = f"PWNED-{uuid.uuid4().hex[:8]}"  # an injected "cd; touch MARK" would create ~/MARK
    evil_dir = tmp_path / f"cfg dir; cd; touch {mark} '\""
    evil_dir.mkdir()
    cfg = evil_dir / f"my cfg;$(cd; touch {mark});`cd; touch {mark}`.yaml"
    cfg.write_text(Path(SMOKE).read_text())
    name = f"a b; cd; touch {mark}; echo 'q\" $(cd; touch {mark})"
    root = tmp_path / "runs; x"
    base = [sys.executable, "-m", "nsa_tui.cli"]
    env = sshd.env()
    out = subprocess.run(base + ["launch", ALIAS, "--config", str(cfg), "--nproc", "1", "--name", name,
                                 "--set", "train.steps=2", "--runs-root", str(root), "--json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rid = json.loads(out.stdout)["run_id"]
    assert ";" not in rid and " " not in rid and "'" not in rid
    launch = json.loads((root / rid / "launch.json").read_text())
    assert launch["name"] == name and launch["config_file"] == str(cfg)
    assert (root / rid / "config.yaml").read_text() == cfg.read_text()
    assert (root / rid).stat().st_mode & 0o777 == 0o700
    logs = subprocess.run(base + ["logs", ALIAS, rid, "-f", "--runs-root", str(root)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert logs.returncode == 0 and "nsa-train" in logs.stdout
    st = subprocess.run(base + ["status", ALIAS, rid, "--runs-root", str(root), "--json"], env=env,
                        capture_output=True, text=True, timeout=60)
    assert st.returncode == 0, st.stdout + st.stderr
    assert json.loads(st.stdout)["run"]["status"] == "finished"
    assert not (Path.home() / mark).exists() and not (Path.cwd() / mark).exists()
    assert not list(tmp_path.rglob(mark))
