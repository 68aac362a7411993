"""The CLI's commands on one host: what each asks its agent and prints (nsa_tui/cli/text.py
formats it). A run over several hosts goes to nsa_tui/cli/multi.py instead; nsa_tui/cli/main.py
picks, and maps every error to its exit code (nsa_tui/cli/exitcodes.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from nsa.contract.rundir import ALERTS_JSONL
from nsa.contract.status import UNHEALTHY_STATUSES
from nsa_tui.cli import evaluate as cli_eval
from nsa_tui.cli import sample as cli_sample
from nsa_tui.cli.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_UNHEALTHY, emit, fail
from nsa_tui.cli.text import LineSplitter, alert_lines, runs_table


def said_yes(answer: str) -> bool:
    """A yes to a (yes/no) question: ``y`` or ``yes`` in any case, as other command-line tools
    take it; anything else (an empty line too) is a no."""
    return answer.strip().lower() in ("y", "yes")


async def _status(c: Any, args: argparse.Namespace) -> int:
    """The run's view, every rank's newest beat and the alerts that hold now: one bounded request
    (O(ranks), whatever the run's age)."""
    from nsa_tui.cli.text import status_text
    from nsa_tui.health.alerts import AlertDetector
    from nsa_tui.user.settings import local_thresholds

    rep = await c.status(args.run)
    now = time.time()
    det = AlertDetector(c.hello.host or args.host, local_thresholds())
    det.feed_clock(now, rep.ts)  # the report's time, not the beats': their age stays theirs
    det.feed_view(args.run, rep.run)
    det.feed_log(args.run, rep.run.log_tail)
    for m in rep.recent_metrics:
        det.feed_metric(args.run, m)
    for b in rep.beats:
        det.feed_beat(args.run, b)
    alerts = det.check(now)
    # each rank's age as the alerts measure it (now on the host's clock), the reply's transit included
    rep.heartbeat_age_s = {b.rank: round(max(0.0, now - det.skew() - b.ts), 3) for b in rep.beats}
    if rep.run.watchdog:  # the host records this run's alerts: show those (unresolved), not a guess
        recorded = await c.alerts(args.run, 0)
        alerts = [st.alert for st in recorded.alerts if st.state != "resolved"]
    rep.alerts = alerts
    emit(args, rep, status_text(rep, alerts, now, det.skew()))
    bad = any(a.severity == "critical" for a in alerts) or rep.run.status in UNHEALTHY_STATUSES
    return EXIT_UNHEALTHY if bad else EXIT_OK


async def _alerts(c: Any, args: argparse.Namespace) -> int:
    """Recorded alerts, oldest first: each unresolved one and the newest resolved ones."""
    if not args.follow:
        lst = await c.alerts(args.run, args.history)
        text = "\n".join(ln for st in lst.alerts for ln in alert_lines(st)) or "no alerts"
        if lst.bad_lines:
            text += f"\n({lst.bad_lines} malformed line(s) of {ALERTS_JSONL} skipped)"
        emit(args, lst, text)
        return EXIT_OK
    from nsa.contract.io import to_builtins

    if args.run:
        await c.run(args.run)  # a run that does not exist is an error, not an empty stream
    async for ev in c.watch_alerts(args.history, args.run):
        states = ev.data.alerts if ev.kind == "alerts" else [ev.data]
        for st in states:
            if args.json:
                print(json.dumps(to_builtins(st)), flush=True)
            else:
                print("\n".join(alert_lines(st)), flush=True)
    return EXIT_OK


async def _logs(c: Any, args: argparse.Namespace) -> int:
    offset = 0
    split = LineSplitter()  # --json: whole lines only

    def json_lines(text: str, final: bool) -> None:
        for line in split.feed(text, final):
            print(json.dumps({"line": line}))

    while True:
        chunk = await c.read_log(args.run, offset)
        if chunk.text:
            if args.json:
                json_lines(chunk.text, final=False)
            else:
                sys.stdout.write(chunk.text)
        offset, gen = chunk.offset, chunk.gen
        if offset >= chunk.size:
            break
    if not args.follow:
        if args.json:
            json_lines("", final=True)
        return EXIT_OK
    from nsa.contract import StreamPos

    start = {"log": StreamPos(gen=gen, offset=offset)}
    async for ev in c.watch(args.run, offsets=start, streams=["status", "log"]):
        if ev.kind == "log":
            offset = ev.offset
            for text in ev.data.lines:
                line, split.carry = split.carry + text, ""  # the watch completes a cut line
                print(json.dumps({"line": line}) if args.json else text, flush=True)
        elif ev.kind == "status" and not ev.initial and ev.data.status.is_terminal():
            rest = await c.read_log(args.run, offset)  # lines written after the last poll
            if args.json:
                json_lines(rest.text, final=True)
            else:
                for line in rest.text.splitlines():
                    print(line)
            return EXIT_OK
    return EXIT_OK


async def _delete(c: Any, args: argparse.Namespace) -> int:
    """Say what deleting frees, ask (unless --yes), then delete."""
    from nsa_tui.fmt import fmt_bytes

    plan = await c.delete(args.run, dry_run=True)
    what = f"{args.run}: {fmt_bytes(plan.bytes)} in {plan.files} files"
    if plan.children:
        what += f" (continued by {', '.join(plan.children)}: those keep their own files)"
    if not args.yes:
        if args.json or not sys.stdin.isatty():
            return fail(args, "not_confirmed", f"delete {what}? add --yes to delete")
        answer = await asyncio.to_thread(input, f"delete {what}? (yes/no) ")
        if not said_yes(answer):  # not confirmed, as without a terminal: exit 2 (docs/cli.md)
            return fail(args, "not_confirmed", "nothing deleted")
    res = await c.delete(args.run)
    emit(args, res, f"deleted {args.run}: freed {fmt_bytes(res.bytes)}" if res.deleted
         else f"{args.run}: gone from the list, but part of it could not be removed (.deleting-* remains)")
    return EXIT_OK if res.deleted else EXIT_FAILED


async def dispatch(c: Any, args: argparse.Namespace) -> int:
    """One command on one host (``c``, connected; ``args.run`` resolved); returns the exit code."""
    if args.cmd == "runs":
        runs = await c.runs()
        shown = runs if args.all else [r for r in runs if not r.archived]
        hidden = len(runs) - len(shown)
        note = f"\n({hidden} archived: --all lists them)" if hidden else ""
        where = f"{c.hello.runs_root} on {c.hello.host or args.host}"
        text = runs_table(shown, time.time()) if shown else f"no runs in {where}"  # a mistyped root says so
        emit(args, shown, text + note)
    elif args.cmd == "archive":
        view = await c.archive(args.run, archived=not args.undo)
        emit(args, view, f"{args.run}: {'archived' if view.archived else 'no longer archived'}")
    elif args.cmd == "delete":
        return await _delete(c, args)
    elif args.cmd == "launch":
        from nsa_tui.slurm.cli import slurm_request

        slurm = slurm_request(args)
        res = await c.launch(args.config, nproc=args.nproc, overrides=args.set, name=args.name,
                             upload=args.upload, on_failure=args.on_failure, force=args.force, slurm=slurm)
        text = res.run_id
        if res.slurm_job_id:
            script = res.view.slurm.script if res.view and res.view.slurm else "?"
            text += f"\nSlurm job {res.slurm_job_id} (script: {script})"
        emit(args, res, text)
    elif args.cmd == "export":
        return await _export(c, args)
    elif args.cmd == "alerts":
        return await _alerts(c, args)
    elif args.cmd == "sample":
        return await cli_sample.run(c, args)
    elif args.cmd == "eval":
        return await cli_eval.run(c, args)
    elif args.cmd == "ack":
        st = await c.ack(args.run, args.alert)
        said = "acknowledged" if st.state == "acknowledged" else f"acknowledged ({st.state})"
        emit(args, st, f"{args.run} {st.id}: {said}")
    elif args.cmd == "status":
        return await _status(c, args)
    elif args.cmd == "logs":
        return await _logs(c, args)
    elif args.cmd == "kill":
        kr = await c.kill(args.run, args.grace)
        text = (f"{args.run}: stopped{' (forced with KILL)' if kr.forced else ''}; no process remains"
                if kr.was_running else f"{args.run}: was not running")
        emit(args, kr, text)
    elif args.cmd in ("fallback", "resume"):
        res = await (c.fallback(args.run, args.grace, nproc=args.nproc) if args.cmd == "fallback"
                     else c.resume(args.run))
        note = f" (already done before: {args.cmd} started it)" if res.again else ""
        emit(args, res, f"{res.run_id}{note}")
    elif args.cmd == "dump":
        dr = await c.dump(args.run)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            for f in dr.files:
                (out / Path(f.name).name).write_text(f.text)
        from nsa_tui.health.stacks import dump_text

        emit(args, dr, dump_text(dr))
    return EXIT_OK


async def _export(c: Any, args: argparse.Namespace) -> int:
    """The run's metrics lines, read through the agent, written here (nsa_tui/cli/export.py)."""
    from nsa_tui.cli.export import ExportError, write_csv, write_tensorboard

    if not args.tensorboard and not args.csv:
        return fail(args, "bad_request", "export: give --tensorboard DIR and/or --csv PATH")
    view = await c.run(args.run)
    metrics = await c.metrics(args.run)
    done: dict[str, Any] = {"run_id": args.run, "lines": len(metrics)}
    try:
        if args.csv:
            path = Path(args.csv).expanduser()
            if path.suffix != ".csv":
                path = path / f"{args.run}.csv"
            done["csv"] = str(write_csv(metrics, path))
        if args.tensorboard:
            done["tensorboard"] = str(write_tensorboard(metrics, view.info,
                                                        Path(args.tensorboard).expanduser() / args.run))
    except (ExportError, OSError) as exc:
        return fail(args, "export_failed", str(exc))
    emit(args, done, "\n".join(f"{k}: {v}" for k, v in done.items()))
    return EXIT_OK
