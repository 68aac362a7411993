"""The CLI's commands over several hosts: ``HOST1,HOST2`` (or one host of a run over several);
nsa_tui/cli/main.py sends a command here after connecting, and maps its errors to exit codes.

    nsa-tui launch H1,H2 --config C --nproc-per-node N [--rdzv-host ADDR] [--rdzv-port P]
    nsa-tui status|logs|alerts|kill|dump|fallback|resume H1,H2 RUN

The hosts are connected all at once; ``launch`` checks every host before anything starts
(nsa_tui/hosts/coordinator.py); the others merge the hosts' parts of the run
(nsa_tui/hosts/merge.py): every rank with its host, one status, hosts that cannot be reached
shown as lost (not the run as crashed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nsa.contract import UNHEALTHY_STATUSES, Metric, StreamPos
from nsa.contract.rundir import ALERTS_JSONL
from nsa_tui.cli.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_UNHEALTHY, EXIT_UNREACHABLE, emit, exit_for, fail
from nsa_tui.cli.text import LineSplitter, alert_lines, attention_text, progress_text
from nsa_tui.health.thresholds import Thresholds
from nsa_tui.hosts import coordinator as co
from nsa_tui.hosts.client import AgentError, HostClient
from nsa_tui.hosts.merge import MergedRun, Part, group_views, merge
from nsa_tui.user.settings import local_thresholds

# commands on one host's part (its alert ids, files; sample, eval: the checkpoint files on that host)
ONE_HOST = ("ack", "archive", "delete", "eval", "export", "sample")


def _text_of(merged: MergedRun, now: float, alerts: list[Any],
             ages: dict[tuple[str, int], float] | None = None, metrics: Sequence[Metric] = ()) -> str:
    """The merged run for people; ``ages``: (host, rank) -> heartbeat age on that host's clock
    (from its status report; without it, on this clock); ``metrics``: rank 0's host's newest lines."""
    ages = ages or {}
    info = merged.info
    step = max([info.step if info else 0, *(b.step for _, b in merged.ranks)])
    total = info.total_steps if info and info.total_steps is not None else "?"
    gb = (info.global_batch if info else None) or "?"
    lines = [f"{merged.run_id}  {merged.name}  status={merged.status.value}  step={step}/{total}  "
             f"world={info.world_size if info else '?'}  global_batch={gb}  "
             f"hosts={','.join(merged.hosts)}  rank0={merged.primary}"]
    if info is not None and info.attention_ops is not None:  # rank 0's: every rank runs the same ops
        lines.append(f"  attention: {attention_text(info.attention_ops)}")
    progress = progress_text(metrics)
    if progress is not None:
        lines.append(f"  latest: {progress}")
    if merged.problem:
        lines.append(f"  {merged.status.value}: {merged.problem}")
    for host, why in merged.lost.items():
        first = why.splitlines()[0] if why else "?"
        lines.append(f"  host {host}: LOST (unreachable: {first}); its ranks are not known to have failed")
    for host, b in merged.ranks:
        lines.append(f"  rank {b.rank} on {host}: step {b.step} phase {b.phase.value} "
                     f"heartbeat {ages.get((host, b.rank), max(0.0, now - b.ts)):.1f} s ago")
    for a in alerts:
        lines.append(f"  [{a.severity.upper()}] {a.host} {a.kind}: {a.message}")
    return "\n".join(lines)


def part_alerts(p: Part, run_id: str, now: float, thresholds: Thresholds | None = None) -> list[Any]:
    """The alerts that hold now for one host's part (named after its host); ``thresholds``:
    this machine's settings' (the defaults when None)."""
    from nsa_tui.health.alerts import AlertDetector

    if p.view is None:
        return []
    det = AlertDetector(p.host, thresholds)
    det.feed_clock(now, now - p.skew)  # the host's clock as its status report gave it
    det.feed_view(run_id, p.view)
    det.feed_log(run_id, p.view.log_tail)
    for m in p.metrics:
        det.feed_metric(run_id, m)
    for b in p.beats:
        det.feed_beat(run_id, b)
    return det.check(now)


async def _status(clients: dict[str, HostClient], unreachable: dict[str, str], hosts: list[str],
                  args: argparse.Namespace) -> int:
    found = await co.parts(clients, args.run, unreachable, hosts)
    if all(p.view is None for p in found if p.reachable) and not any(not p.reachable for p in found):
        raise AgentError("no_such_run", f"no run {args.run} on {', '.join(hosts)}")
    merged = merge(args.run, found)
    now = time.time()
    thresholds = local_thresholds()
    alerts = [a for p in found for a in part_alerts(p, args.run, now, thresholds)]
    ages = {(p.host, b.rank): round(p.heartbeat_age(b, now), 3) for p in found for b in p.beats}
    doc = {"run_id": merged.run_id, "name": merged.name, "status": merged.status.value, "hosts": merged.hosts,
           "rank0_host": merged.primary, "problem": merged.problem, "lost_hosts": merged.lost,
           "ranks": [{**_builtins(b), "hostname": b.host, "host": h, "heartbeat_age_s": ages[(h, b.rank)]}
                     for h, b in merged.ranks],
           "parts": [{"host": p.host, "reachable": p.reachable, "why": p.why,
                      "run": _builtins(p.view) if p.view is not None else None} for p in found],
           "alerts": [_builtins(a) for a in alerts]}
    metrics = next((p.metrics for p in found if p.host == merged.primary), [])  # rank 0 writes them
    emit(args, doc, _text_of(merged, now, alerts, ages, metrics))
    bad = merged.status in UNHEALTHY_STATUSES or merged.lost or any(
        a.severity == "critical" for a in alerts)
    return EXIT_UNHEALTHY if bad else EXIT_OK


def _builtins(x: Any) -> Any:
    from nsa.contract.io import to_builtins

    return to_builtins(x)


async def _logs(clients: dict[str, HostClient], hosts: list[str], args: argparse.Namespace) -> int:
    """Each host's train.log, every line prefixed with its host; ``-f`` follows all of them."""

    async def one(host: str) -> None:
        c = clients[host]
        offset, gen, split = 0, "", LineSplitter()

        def out(text: str, final: bool = False) -> None:
            for line in split.feed(text, final):
                text = json.dumps({"host": host, "line": line}) if args.json else f"[{host}] {line}"
                print(text, flush=True)

        while True:
            chunk = await c.read_log(args.run, offset)
            out(chunk.text)
            offset, gen = chunk.offset, chunk.gen
            if offset >= chunk.size:
                break
        if args.follow:
            start = {"log": StreamPos(gen=gen, offset=offset)}
            async for ev in c.watch(args.run, offsets=start, streams=["status", "log"]):
                if ev.kind == "log":
                    offset = ev.offset
                    out("".join(f"{ln}\n" for ln in ev.data.lines))
                elif ev.kind == "status" and not ev.initial and ev.data.status.is_terminal():
                    out((await c.read_log(args.run, offset)).text)
                    break
        out("", final=True)

    await asyncio.gather(*(one(h) for h in hosts if h in clients))
    return EXIT_OK


async def _alerts(clients: dict[str, HostClient], unreachable: dict[str, str], hosts: list[str],
                  args: argparse.Namespace) -> int:
    """Every host's recorded alerts (its watchdog's alerts.jsonl), each line prefixed with its
    host; ``-f`` follows all of them. A host that cannot be reached is said, and exits 5."""
    from nsa.contract.io import to_builtins

    if args.follow:
        async def follow(host: str) -> None:
            async for ev in clients[host].watch_alerts(args.history, args.run):
                for st in ev.data.alerts if ev.kind == "alerts" else [ev.data]:
                    if args.json:
                        print(json.dumps({"host": host, **to_builtins(st)}), flush=True)
                    else:
                        print("\n".join(f"[{host}] {ln}" for ln in alert_lines(st)), flush=True)

        for host, why in unreachable.items():
            print(f"[{host}] unreachable: {why}", file=sys.stderr, flush=True)
        await asyncio.gather(*(follow(h) for h in hosts if h in clients))
        return EXIT_UNREACHABLE if unreachable else EXIT_OK
    got = dict(zip([h for h in hosts if h in clients], await asyncio.gather(
        *(clients[h].alerts(args.run, args.history) for h in hosts if h in clients))))
    lines = []
    for host in hosts:
        if host in unreachable:
            lines.append(f"[{host}] unreachable: {unreachable[host]}")
            continue
        lst = got[host]
        lines += [f"[{host}] {ln}" for st in lst.alerts for ln in alert_lines(st)]
        if lst.bad_lines:
            lines.append(f"[{host}] ({lst.bad_lines} malformed line(s) of {ALERTS_JSONL} skipped)")
    doc = {h: _builtins(got[h]) if h in got else {"error": f"unreachable: {unreachable[h]}"} for h in hosts}
    emit(args, doc, "\n".join(lines) or "no alerts")
    return EXIT_UNREACHABLE if unreachable else EXIT_OK


async def run(args: argparse.Namespace, clients: dict[str, HostClient], unreachable: dict[str, str],
              hosts: list[str]) -> int:
    """One command over several hosts (``hosts`` in node order; ``unreachable``: host -> why
    not); returns the exit code. Errors that stop the command are raised (nsa_tui/cli/main.py maps
    them); a host's own failure within kill or dump is reported with the others'."""
    cmd = args.cmd
    if unreachable and cmd in ("launch", "fallback", "resume", "kill", "dump"):
        host, why = next(iter(unreachable.items()))
        return fail(args, "unreachable", f"{host}: {why}")
    if cmd == "launch":
        if getattr(args, "on_failure", None):  # a config value, refused where it cannot work
            args.set = [*args.set, f"on_failure.action={args.on_failure}"]
        res = await co.launch(clients, args.config, nproc=args.nproc, overrides=args.set, name=args.name,
                              upload=args.upload, rdzv_host=args.rdzv_host, rdzv_port=args.rdzv_port,
                              force=getattr(args, "force", False))
        doc = {"run_id": res.run_id, "rdzv_endpoint": res.rdzv_endpoint,
               "hosts": {h: _builtins(r) for h, r in res.results.items()}}
        emit(args, doc, res.run_id)
    elif cmd == "status":
        return await _status(clients, unreachable, hosts, args)
    elif cmd == "logs":
        return await _logs(clients, hosts, args)
    elif cmd == "alerts":
        return await _alerts(clients, unreachable, hosts, args)
    elif cmd in ONE_HOST:
        return fail(args, "bad_request", f"{cmd} acts on one host's part of a run: name one host "
                    f"(nsa-tui {cmd} HOST ...), once per host")
    elif cmd == "kill":
        results = await co.kill(clients, args.run, args.grace)
        emit(args, {h: _builtins(r) if not isinstance(r, Exception) else {"error": co.describe(r)}
                    for h, r in results.items()},
             "\n".join(f"{h}: {_kill_text(r)}" for h, r in results.items()))
        return per_host_exit(results)
    elif cmd == "dump":
        dumps = await co.dump(clients, args.run)
        texts = []
        for h, d in dumps.items():
            if isinstance(d, Exception):
                texts.append(f"==> {h}: {co.describe(d)} <==")
                continue
            for f in d.files:
                texts.append(f"==> {h}/{f.name} <==\n{f.text}")
                if args.out:
                    out = Path(args.out) / h.replace("/", "_")
                    out.mkdir(parents=True, exist_ok=True)
                    (out / Path(f.name).name).write_text(f.text)
        emit(args, {h: _builtins(d) if not isinstance(d, Exception) else {"error": co.describe(d)}
                    for h, d in dumps.items()}, "\n".join(texts) or "no files")
        return per_host_exit(dumps)
    elif cmd == "fallback":
        log = None if args.json else (lambda m: print(m, file=sys.stderr))
        fres = await co.fallback(clients, args.run, nproc=args.nproc, grace_s=args.grace, log=log)
        note = " (already done before: fallback started it)" if fres.again else ""
        emit(args, _builtins(fres), fres.run_id + note)
    elif cmd == "resume":
        log = None if args.json else (lambda m: print(m, file=sys.stderr))
        mres = await co.resume(clients, args.run, log=log)
        emit(args, {"run_id": mres.run_id, "rdzv_endpoint": mres.rdzv_endpoint,
                    "hosts": {h: _builtins(r) for h, r in mres.results.items()}}, mres.run_id)
    elif cmd == "runs":
        groups = group_views({h: await c.runs() for h, c in clients.items()})
        merged = [merge(rid, ps) for rid, ps in groups]
        roots = ", ".join(f"{c.hello.runs_root} on {h}" for h, c in clients.items())
        emit(args, [{"run_id": m.run_id, "name": m.name, "status": m.status.value, "hosts": m.hosts}
                    for m in merged], _runs_text(merged) if merged else f"no runs in {roots}")
    return EXIT_OK


def per_host_exit(results: dict[str, Any]) -> int:
    """The exit code of a command done on every host at once: ok where every host did it; where
    every host failed with one agent error, that error's (as on one host); else failed."""
    errors = [r for r in results.values() if isinstance(r, Exception)]
    if not errors:
        return EXIT_OK
    codes = {r.code if isinstance(r, AgentError) else None for r in errors}
    if len(errors) == len(results) and len(codes) == 1 and None not in codes:
        return exit_for(next(iter(codes)) or "")
    return EXIT_FAILED


def _kill_text(r: Any) -> str:
    if isinstance(r, Exception):
        return f"FAILED: {co.describe(r)}"
    if not r.was_running:
        return "was not running"
    return f"stopped{' (forced with KILL)' if r.forced else ''}; no process remains"


def _runs_text(merged: list[MergedRun]) -> str:
    rows = [("RUN", "NAME", "STATUS", "STEP", "WORLD", "HOSTS")]
    for m in merged:
        i = m.info
        step = f"{i.step}/{i.total_steps if i and i.total_steps is not None else '-'}" if i else "-"
        world = str(i.world_size if i else "-")
        rows.append((m.run_id, m.name, m.status.value, step, world, ",".join(m.hosts)))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
