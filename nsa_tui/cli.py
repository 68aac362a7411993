"""``nsa-tui``: the control panel (no arguments, or ``connect DEST...``) and a CLI for scripts.

    nsa-tui runs HOST [--all]                  nsa-tui status HOST RUN
    nsa-tui launch HOST --config PATH [--nproc N] [--set k=v ...] [--name NAME] [--upload]
                   [--on-failure restart|fallback|stop|none]
    nsa-tui logs HOST RUN [-f]                 nsa-tui kill HOST RUN [--grace S]
    nsa-tui fallback HOST RUN [--nproc N]      nsa-tui resume HOST RUN
    nsa-tui dump HOST RUN [--out DIR]          nsa-tui setup HOST
    nsa-tui export HOST RUN [--tensorboard DIR] [--csv PATH]
    nsa-tui alerts HOST [RUN] [--follow]       nsa-tui ack HOST RUN ALERT
    nsa-tui archive HOST RUN [--undo]          nsa-tui delete HOST RUN [--yes]
    nsa-tui launch H1,H2 --config PATH --nproc-per-node N [--rdzv-host ADDR]   (several hosts)

HOST is ``local`` or an SSH destination (``[user@]host[:port]`` or a ~/.ssh/config alias);
``H1,H2,...`` is one run over several hosts (nsa_tui/cli_multi.py, docs/multi-node.md), and
a command on one host of such a run reaches all of its hosts.
Every command takes ``--json`` (one JSON document, or JSON lines for ``logs``) and
``--runs-root DIR``. Exit codes (EXIT_* below): 0 ok, 1 the operation failed, 2 usage,
3 bad config (or one that cannot run on the host), 4 no such run (or alert), 5 cannot reach the
host (network, host key, no agent), 6 ``status`` found the run unhealthy (critical alert,
crashed, failed or lost), 141 the reader of the output went away (``| head``). RUN is a run
id, a unique prefix of one (what ``runs`` shows) or a run's name; an ambiguous one is a usage
error listing the matches.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from nsa.contract.rundir import ALERTS_JSONL, TRAIN_LOG
from nsa.contract.status import UNHEALTHY_STATUSES
from nsa_tui.cli_text import LineSplitter, alert_lines, runs_table
from nsa_tui.runref import RunRefError, resolve

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_CONFIG, EXIT_NO_RUN, EXIT_UNREACHABLE, EXIT_UNHEALTHY = range(7)
EXIT_PIPE = 141  # stdout closed by its reader (128 + SIGPIPE, as a shell reports it)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--runs-root", default=None, help="runs root on the host (default ~/nsa-runs)")
    p = argparse.ArgumentParser(prog="nsa-tui", description="NSA training control panel and host CLI.",
                                epilog="Without a command: the control panel on this machine.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    c = sub.add_parser("connect", help="open the panel on these hosts")
    c.add_argument("dests", nargs="+", metavar="DEST")
    rl = sub.add_parser("runs", parents=[common], help="list runs (archived ones with --all)")
    rl.add_argument("host")
    rl.add_argument("--all", action="store_true", help="also the archived runs")
    la = sub.add_parser("launch", parents=[common], help="validate a config on the host and start a run")
    la.add_argument("host", help="HOST, or HOST1,HOST2,... for one run over several hosts")
    la.add_argument("--config", required=True, help="config path (on the host, or local with --upload)")
    la.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=int, default=None,
                    help="processes per host (default: the host's GPU count, or 1)")
    la.add_argument("--rdzv-host", default=None, help="several hosts: the first host's address as the "
                    "others reach it (default: the address its SSH connection reached)")
    la.add_argument("--rdzv-port", type=int, default=None, help="several hosts: the rendezvous port on the "
                    "first host (default: a free one there, from 29400)")
    la.add_argument("--set", nargs="+", action="extend", default=[], metavar="K=V", help="config overrides")
    la.add_argument("--name", default=None, help="run name (default: the config's name)")
    la.add_argument("--upload", action="store_true", help="send this machine's config file to the host")
    la.add_argument("--on-failure", default=None, choices=["none", "restart", "fallback", "stop"],
                    help="what the host's watchdog does when the run fails (config on_failure.action)")
    al = sub.add_parser("alerts", parents=[common], help="the host's recorded alerts (every run, or one)")
    al.add_argument("host")
    al.add_argument("run", nargs="?", default=None)
    al.add_argument("-f", "--follow", action="store_true", help="keep printing changes as they happen")
    al.add_argument("--history", type=int, default=100, help="resolved alerts shown per run (default 100)")
    ak = sub.add_parser("ack", parents=[common], help="acknowledge an alert (its id, or its kind)")
    ak.add_argument("host")
    ak.add_argument("run")
    ak.add_argument("alert")
    la.add_argument("--force", action="store_true",
                    help="start even when the host says the config cannot run there (no GPU for a CUDA-only "
                         "config, a Hub data source without network)")
    ex = sub.add_parser("export", parents=[common], help="a run's metrics as CSV and/or TensorBoard files",
                        description="Reads every metrics line through the host's agent and writes here. "
                                    "TensorBoard needs tensorboardX: pip install 'nsa-tui[export]'.")
    ex.add_argument("host")
    ex.add_argument("run")
    ex.add_argument("--tensorboard", metavar="DIR", default=None,
                    help="event files into DIR/<run id> (point TensorBoard, or wandb sync "
                         "--sync-tensorboard, at DIR)")
    ex.add_argument("--csv", metavar="PATH", default=None,
                    help="a .csv file, or a directory for <run id>.csv")
    for name, text in (("status", "status and current alerts"), ("kill", "stop a run (TERM, then KILL)"),
                       ("fallback", "stop and relaunch on one GPU from the newest checkpoint"),
                       ("resume", "relaunch a stopped run from its newest checkpoint"),
                       ("dump", "stack dump of every rank"), ("logs", f"the run's {TRAIN_LOG}"),
                       ("archive", "hide a run that is not alive from the default run list"),
                       ("delete", "remove a run that is not alive (says how much it frees)")):
        sp = sub.add_parser(name, parents=[common], help=text)
        sp.add_argument("host")
        sp.add_argument("run")
        if name in ("kill", "fallback"):
            sp.add_argument("--grace", type=float, default=60.0, help="seconds between TERM and KILL")
        if name == "fallback":
            sp.add_argument("--nproc", type=int, default=None, help="processes to fall back to on one host "
                            "(default 1: one GPU), keeping the global batch")
        if name == "logs":
            sp.add_argument("-f", "--follow", action="store_true", help="follow until the run ends")
        if name == "dump":
            sp.add_argument("--out", default=None, help="also write the files into this directory")
        if name == "archive":
            sp.add_argument("--undo", action="store_true", help="take it out of the archive")
        if name == "delete":
            sp.add_argument("--yes", action="store_true", help="do not ask (scripts)")
    st = sub.add_parser("setup", parents=[common], help="install this version on an SSH host (venv)")
    st.add_argument("host")
    st.add_argument("--no-deps", action="store_true", help="pip --no-deps: install no dependency")
    st.add_argument("--prefix", default="~/.nsa-tui", help="install directory on the host")
    st.add_argument("--python", default="python3", help="the host's python that creates the venv")
    return p


def _emit(args: argparse.Namespace, obj: Any, text: str) -> None:
    """``--json``: the record as JSON (nsa.contract's encoding); else ``text``."""
    if args.json:
        from nsa.contract.io import to_builtins

        print(json.dumps(to_builtins(obj), indent=1))
    else:
        print(text)


def _fail(args: argparse.Namespace, code: int, kind: str, message: str) -> int:
    if args.json:
        print(json.dumps({"error": {"code": kind, "message": message}}))
    else:
        print(f"nsa-tui: {message}", file=sys.stderr)
    return code


def said_yes(answer: str) -> bool:
    """A yes to a (yes/no) question: ``y`` or ``yes`` in any case, as other command-line tools
    take it; anything else (an empty line too) is a no."""
    return answer.strip().lower() in ("y", "yes")


async def _ask_host_key(host: str, fingerprint: str) -> bool:
    """Interactive yes/no for an unknown host key; never yes without a terminal (the refusal
    then says how to accept the key: nsa_tui/transport/ssh.py)."""
    if not sys.stdin.isatty():
        return False
    print(f"The host {host} is not known.\nIts key fingerprint is {fingerprint}.", file=sys.stderr)
    answer = await asyncio.to_thread(input, "Trust it and remember it in known_hosts? (yes/no) ")
    return answer.strip().lower() == "yes"


async def _status(c: Any, args: argparse.Namespace) -> int:
    """The run's view, every rank's newest beat and the alerts that hold now: one bounded request
    (O(ranks), whatever the run's age)."""
    from nsa_tui.alerts import AlertDetector
    from nsa_tui.cli_text import status_text

    rep = await c.status(args.run)
    now = time.time()
    det = AlertDetector(c.hello.host or args.host)
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
    _emit(args, rep, status_text(rep, alerts, now, det.skew()))
    bad = any(a.severity == "critical" for a in alerts) or rep.run.status in UNHEALTHY_STATUSES
    return EXIT_UNHEALTHY if bad else EXIT_OK


async def _alerts(c: Any, args: argparse.Namespace) -> int:
    """Recorded alerts, oldest first: each unresolved one and the newest resolved ones."""
    if not args.follow:
        lst = await c.alerts(args.run, args.history)
        text = "\n".join(ln for st in lst.alerts for ln in alert_lines(st)) or "no alerts"
        if lst.bad_lines:
            text += f"\n({lst.bad_lines} malformed line(s) of {ALERTS_JSONL} skipped)"
        _emit(args, lst, text)
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
            return _fail(args, EXIT_USAGE, "not_confirmed", f"delete {what}? add --yes to delete")
        answer = await asyncio.to_thread(input, f"delete {what}? (yes/no) ")
        if not said_yes(answer):
            print("nothing deleted", file=sys.stderr)
            return EXIT_FAILED
    res = await c.delete(args.run)
    _emit(args, res, f"deleted {args.run}: freed {fmt_bytes(res.bytes)}" if res.deleted
          else f"{args.run}: gone from the list, but part of it could not be removed (.deleting-* remains)")
    return EXIT_OK if res.deleted else EXIT_FAILED


async def _run_command(args: argparse.Namespace) -> int:
    from nsa_tui.client import AgentError, HostClient
    from nsa_tui.transport import TransportError

    if args.cmd == "setup":
        from nsa_tui.setup_host import setup_host

        try:
            res = await setup_host(args.host, confirm_host_key=_ask_host_key, no_deps=args.no_deps,
                                   prefix=args.prefix, python=args.python,
                                   log=None if args.json else lambda m: print(m, file=sys.stderr))
        except TransportError as exc:
            return _fail(args, EXIT_UNREACHABLE, "unreachable", str(exc))
        except RuntimeError as exc:
            return _fail(args, EXIT_FAILED, "setup_failed", str(exc))
        _emit(args, res, f"installed nsa-tui {res['version']} on {args.host}: {res['python']}")
        return EXIT_OK
    dests = [d.strip() for d in args.host.split(",") if d.strip()]
    if len(dests) > 1:
        return await _multi(args, dests)
    c = HostClient(args.host, runs_root=args.runs_root, confirm_host_key=_ask_host_key)
    c.reconnect = args.cmd == "logs" or getattr(args, "follow", False)  # only followers wait out a drop
    try:
        await c.start()
    except TransportError as exc:
        return _fail(args, EXIT_UNREACHABLE, "unreachable", str(exc))
    try:
        if getattr(args, "run", None):
            args.run = await _resolve_run(c, args.run)
        per_run = args.cmd not in ("runs", "launch", "ack", "archive", "delete", "export")
        if per_run and getattr(args, "run", None):  # `alerts HOST` without a run: that host's alone
            from nsa_tui.coordinator import run_hosts

            hosts = await run_hosts({args.host: c}, args.run)
            if len(hosts) > 1:  # one host of a run over several: the command is the run's
                await c.close()
                return await _multi(args, hosts)
        return await _dispatch(c, args)
    except AgentError as exc:
        code = {"bad_config": EXIT_BAD_CONFIG, "cannot_run": EXIT_BAD_CONFIG, "no_such_run": EXIT_NO_RUN,
                "bad_request": EXIT_USAGE, "no_such_alert": EXIT_NO_RUN}
        return _fail(args, code.get(exc.code, EXIT_FAILED), exc.code, exc.message)
    except RunRefError as exc:
        return _fail(args, EXIT_NO_RUN if exc.code == "no_such_run" else EXIT_USAGE, exc.code, exc.message)
    finally:
        await c.close()


async def _resolve_run(c: Any, ref: str) -> str:
    """A run given by its id, a unique id prefix or its name (nsa_tui/runref.py). An id the
    list does not hold goes to the agent as given (it answers for it)."""
    from nsa.contract.rundir import RUN_ID_RE

    runs = await c.runs()
    try:
        return resolve(ref, runs)
    except RunRefError as exc:
        if exc.code == "no_such_run" and RUN_ID_RE.match(ref):
            return ref
        raise


async def _dispatch(c: Any, args: argparse.Namespace) -> int:
    if args.cmd == "runs":
        runs = await c.runs()
        shown = runs if args.all else [r for r in runs if not r.archived]
        hidden = len(runs) - len(shown)
        note = f"\n({hidden} archived: --all lists them)" if hidden else ""
        _emit(args, shown, runs_table(shown, time.time()) + note)
    elif args.cmd == "archive":
        view = await c.archive(args.run, archived=not args.undo)
        _emit(args, view, f"{args.run}: {'archived' if view.archived else 'no longer archived'}")
    elif args.cmd == "delete":
        return await _delete(c, args)
    elif args.cmd == "launch":
        res = await c.launch(args.config, nproc=args.nproc, overrides=args.set, name=args.name,
                             upload=args.upload, on_failure=args.on_failure, force=args.force)
        _emit(args, res, res.run_id)
    elif args.cmd == "export":
        return await _export(c, args)
    elif args.cmd == "alerts":
        return await _alerts(c, args)
    elif args.cmd == "ack":
        st = await c.ack(args.run, args.alert)
        _emit(args, st, f"{args.run} {st.id}: acknowledged ({st.state})")
    elif args.cmd == "status":
        return await _status(c, args)
    elif args.cmd == "logs":
        return await _logs(c, args)
    elif args.cmd == "kill":
        kr = await c.kill(args.run, args.grace)
        text = (f"{args.run}: stopped{' (forced with KILL)' if kr.forced else ''}; no process remains"
                if kr.was_running else f"{args.run}: was not running")
        _emit(args, kr, text)
    elif args.cmd in ("fallback", "resume"):
        res = await (c.fallback(args.run, args.grace, nproc=args.nproc) if args.cmd == "fallback"
                     else c.resume(args.run))
        note = f" (already done before: {args.cmd} started it)" if res.again else ""
        _emit(args, res, f"{res.run_id}{note}")
    elif args.cmd == "dump":
        dr = await c.dump(args.run)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            for f in dr.files:
                (out / Path(f.name).name).write_text(f.text)
        from nsa_tui.stacks import dump_text

        _emit(args, dr, dump_text(dr))
    return EXIT_OK


async def _export(c: Any, args: argparse.Namespace) -> int:
    """The run's metrics lines, read through the agent, written here (nsa_tui/export.py)."""
    from nsa_tui.export import ExportError, write_csv, write_tensorboard

    if not args.tensorboard and not args.csv:
        return _fail(args, EXIT_USAGE, "bad_request", "export: give --tensorboard DIR and/or --csv PATH")
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
        return _fail(args, EXIT_FAILED, "export_failed", str(exc))
    _emit(args, done, "\n".join(f"{k}: {v}" for k, v in done.items()))
    return EXIT_OK


async def _multi(args: argparse.Namespace, dests: list[str]) -> int:
    """A command over several hosts: connect to all at once, then nsa_tui/cli_multi.py."""
    from nsa_tui import cli_multi
    from nsa_tui.client import AgentError, HostClient
    from nsa_tui.coordinator import connect

    def make(d: str) -> HostClient:
        c = HostClient(d, runs_root=args.runs_root, confirm_host_key=_ask_host_key)
        c.reconnect = args.cmd == "logs"
        return c

    clients, unreachable = await connect(dests, make)
    if not clients:
        host, why = next(iter(unreachable.items()))
        return _fail(args, EXIT_UNREACHABLE, "unreachable", f"{host}: {why}")
    try:
        return await cli_multi.run(args, clients, unreachable, dests,
                                   lambda obj, text: _emit(args, obj, text),
                                   lambda code, kind, msg: _fail(args, code, kind, msg))
    except AgentError as exc:
        code = {"bad_config": EXIT_BAD_CONFIG, "no_such_run": EXIT_NO_RUN, "bad_request": EXIT_USAGE}
        return _fail(args, code.get(exc.code, EXIT_FAILED), exc.code, exc.message)
    finally:
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)


def _panel(destinations: list[str]) -> int:
    try:
        from nsa_tui.app import main as app_main
    except ImportError as exc:
        print(f"nsa-tui: the panel cannot start: {exc}. The CLI commands still work (nsa-tui --help).",
              file=sys.stderr)
        return EXIT_FAILED
    app_main(destinations)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nsa-tui`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return _panel([])
    args = _parser().parse_args(argv)
    if args.cmd == "connect":
        return _panel(args.dests)
    if args.cmd is None:
        return _panel([])
    try:
        return asyncio.run(_run_command(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The reader went away (``nsa-tui status ... --json | head``): stop quietly, as a program
    killed by SIGPIPE would, instead of a traceback; later flushes go to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
