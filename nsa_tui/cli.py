"""``nsa-tui``: the control panel (no arguments, or ``connect DEST...``) and a CLI for scripts.

    nsa-tui runs HOST                          nsa-tui status HOST RUN
    nsa-tui launch HOST --config PATH [--nproc N] [--set k=v ...] [--name NAME] [--upload]
    nsa-tui logs HOST RUN [-f]                 nsa-tui kill HOST RUN [--grace S]
    nsa-tui fallback HOST RUN                  nsa-tui resume HOST RUN
    nsa-tui dump HOST RUN [--out DIR]          nsa-tui setup HOST

HOST is ``local`` or an SSH destination (``[user@]host[:port]`` or a ~/.ssh/config alias).
Every command takes ``--json`` (one JSON document, or JSON lines for ``logs``) and
``--runs-root DIR``. Exit codes (EXIT_* below): 0 ok, 1 the operation failed, 2 usage,
3 bad config, 4 no such run, 5 cannot reach the host (network, host key, no agent),
6 ``status`` found the run unhealthy (critical alert, crashed, failed or lost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_CONFIG, EXIT_NO_RUN, EXIT_UNREACHABLE, EXIT_UNHEALTHY = range(7)
TERMINAL = ("finished", "failed", "stopped", "crashed", "lost")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--runs-root", default=None, help="runs root on the host (default ~/nsa-runs)")
    p = argparse.ArgumentParser(prog="nsa-tui", description="NSA training control panel and host CLI.",
                                epilog="Without a command: the control panel on this machine.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    c = sub.add_parser("connect", help="open the panel on these hosts")
    c.add_argument("dests", nargs="+", metavar="DEST")
    sub.add_parser("runs", parents=[common], help="list runs").add_argument("host")
    la = sub.add_parser("launch", parents=[common], help="validate a config on the host and start a run")
    la.add_argument("host")
    la.add_argument("--config", required=True, help="config path (on the host, or local with --upload)")
    la.add_argument("--nproc", type=int, default=None, help="processes (default: the host's GPU count, or 1)")
    la.add_argument("--set", nargs="+", action="extend", default=[], metavar="K=V", help="config overrides")
    la.add_argument("--name", default=None, help="run name (default: the config's name)")
    la.add_argument("--upload", action="store_true", help="send this machine's config file to the host")
    for name, text in (("status", "status and current alerts"), ("kill", "stop a run (TERM, then KILL)"),
                       ("fallback", "stop and relaunch on one GPU from the newest checkpoint"),
                       ("resume", "relaunch a stopped run from its newest checkpoint"),
                       ("dump", "stack dump of every rank"), ("logs", "the run's train.log")):
        sp = sub.add_parser(name, parents=[common], help=text)
        sp.add_argument("host")
        sp.add_argument("run")
        if name in ("kill", "fallback"):
            sp.add_argument("--grace", type=float, default=60.0, help="seconds between TERM and KILL")
        if name == "logs":
            sp.add_argument("-f", "--follow", action="store_true", help="follow until the run ends")
        if name == "dump":
            sp.add_argument("--out", default=None, help="also write the files into this directory")
    st = sub.add_parser("setup", parents=[common], help="install this version on an SSH host (venv)")
    st.add_argument("host")
    st.add_argument("--no-deps", action="store_true", help="pip --no-deps: install no dependency")
    st.add_argument("--prefix", default="~/.nsa-tui", help="install directory on the host")
    st.add_argument("--python", default="python3", help="the host's python that creates the venv")
    return p


def _emit(args: argparse.Namespace, obj: Any, text: str) -> None:
    print(json.dumps(obj, indent=1, default=str) if args.json else text)


def _fail(args: argparse.Namespace, code: int, kind: str, message: str) -> int:
    if args.json:
        print(json.dumps({"error": {"code": kind, "message": message}}))
    else:
        print(f"nsa-tui: {message}", file=sys.stderr)
    return code


async def _ask_host_key(host: str, fingerprint: str) -> bool:
    """Interactive yes/no for an unknown host key; never yes without a terminal."""
    if not sys.stdin.isatty():
        return False
    print(f"The host {host} is not known.\nIts key fingerprint is {fingerprint}.", file=sys.stderr)
    answer = await asyncio.to_thread(input, "Trust it and remember it in known_hosts? (yes/no) ")
    return answer.strip().lower() == "yes"


def _human(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _runs_table(runs: list[dict[str, Any]]) -> str:
    rows = [("RUN", "NAME", "STATUS", "STEP", "WORLD", "GLOBAL BATCH", "PARAMS")]
    for r in runs:
        step = f"{r.get('step', '-')}/{r.get('total_steps', '-')}" if r.get("step") is not None else "-"
        rows.append((r["run_id"], str(r.get("name", "")), str(r.get("status")), step,
                     str(r.get("world_size") or "-"), str(r.get("global_batch") or "-"),
                     _human(r.get("param_count"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


async def _status(c: Any, args: argparse.Namespace) -> int:
    from nsa_tui.alerts import AlertDetector

    det = AlertDetector(c.hello.get("host", args.host))
    rec: dict[str, Any] = {}
    async for ev in c.watch(args.run):
        det.feed(ev)
        if ev.kind == "status":
            rec = ev.data
        if ev.kind == "synced":
            break
    alerts = det.check(time.time())
    beats = {r: {"step": s.step, "phase": s.phase, "age_s": round(time.time() - det.skew() - s.last_ts, 1)}
             for r, s in sorted(det.runs.get(args.run).ranks.items())} if args.run in det.runs else {}
    rec.pop("config", None)
    steps = [b["step"] for b in beats.values() if isinstance(b["step"], int)]
    if steps and max(steps) > (rec.get("step") or 0):
        rec["step"] = max(steps)  # run.json is rewritten every ~10 s, heartbeats every step
    out = {"run": rec, "ranks": beats, "alerts": [a.to_dict() for a in alerts]}
    lines = [f"{rec.get('run_id')}  {rec.get('name')}  status={rec.get('status')}  "
             f"step={rec.get('step')}/{rec.get('total_steps')}  world={rec.get('world_size')}  "
             f"global_batch={rec.get('global_batch')}  params={_human(rec.get('param_count'))}"]
    lines += [f"  rank {r}: step {b['step']} phase {b['phase']} heartbeat {b['age_s']} s ago"
              for r, b in beats.items()]
    for a in alerts:
        lines.append(f"  [{a.severity.upper()}] {a.kind}: {a.message}")
        lines += [f"      | {ln}" for ln in a.log_tail[-8:]] if a.kind in ("crash", "nan") else []
    _emit(args, out, "\n".join(lines))
    bad = any(a.severity == "critical" for a in alerts) or rec.get("status") in ("crashed", "failed", "lost")
    return EXIT_UNHEALTHY if bad else EXIT_OK


async def _logs(c: Any, args: argparse.Namespace) -> int:
    offset = 0
    carry = ""  # --json: the start of a line that a read cut (1 MiB reads; a line still being written)

    def json_lines(text: str, final: bool) -> None:
        nonlocal carry
        lines = (carry + text).split("\n")
        carry = lines.pop()
        if final and carry:
            lines.append(carry)
            carry = ""
        for line in lines:
            print(json.dumps({"line": line}))

    while True:
        chunk = await c.read_log(args.run, offset)
        if chunk["text"]:
            if args.json:
                json_lines(chunk["text"], final=False)
            else:
                sys.stdout.write(chunk["text"])
        offset = chunk["offset"]
        if offset >= chunk["size"]:
            break
    if not args.follow:
        if args.json:
            json_lines("", final=True)
        return EXIT_OK
    async for ev in c.watch(args.run, offsets={"log": offset}, streams=["log"]):
        if ev.kind == "log":
            offset = ev.offset
            line, carry = carry + ev.data["line"], ""  # the watch completes a cut line
            print(json.dumps({"line": line}) if args.json else ev.data["line"], flush=True)
        elif ev.kind == "status" and not ev.data.get("initial") and ev.data.get("status") in TERMINAL:
            rest = await c.read_log(args.run, offset)  # lines written after the last poll
            if args.json:
                json_lines(rest["text"], final=True)
            else:
                for line in rest["text"].splitlines():
                    print(line)
            return EXIT_OK
    return EXIT_OK


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
    c = HostClient(args.host, runs_root=args.runs_root, confirm_host_key=_ask_host_key)
    c.reconnect = args.cmd == "logs"  # only a follower waits out a dropped link
    try:
        await c.start()
    except TransportError as exc:
        return _fail(args, EXIT_UNREACHABLE, "unreachable", str(exc))
    try:
        return await _dispatch(c, args)
    except AgentError as exc:
        code = {"bad_config": EXIT_BAD_CONFIG, "no_such_run": EXIT_NO_RUN, "bad_request": EXIT_USAGE}
        return _fail(args, code.get(exc.code, EXIT_FAILED), exc.code, exc.message)
    finally:
        await c.close()


async def _dispatch(c: Any, args: argparse.Namespace) -> int:
    simple: dict[str, Callable[[], Awaitable[Any]]] = {
        "kill": lambda: c.kill(args.run, args.grace), "fallback": lambda: c.fallback(args.run, args.grace),
        "resume": lambda: c.resume(args.run)}
    if args.cmd == "runs":
        runs = await c.runs()
        for r in runs:
            r.pop("config", None)
        _emit(args, runs, _runs_table(runs))
    elif args.cmd == "launch":
        res = await c.launch(args.config, nproc=args.nproc, overrides=args.set, name=args.name,
                             upload=args.upload)
        _emit(args, res, res["run_id"])
    elif args.cmd == "status":
        return await _status(c, args)
    elif args.cmd == "logs":
        return await _logs(c, args)
    elif args.cmd in simple:
        res = await simple[args.cmd]()
        text = res.get("run_id", "") if args.cmd != "kill" else (
            f"{args.run}: stopped{' (forced with KILL)' if res.get('forced') else ''}; no process remains"
            if res.get("was_running") else f"{args.run}: was not running")
        _emit(args, res, text)
    elif args.cmd == "dump":
        res = await c.dump(args.run)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            for f in res["files"]:
                (out / Path(f["name"]).name).write_text(f["text"])
        _emit(args, res, "\n".join(f"==> {f['name']} <==\n{f['text']}" for f in res["files"]) or "no files")
    return EXIT_OK


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


if __name__ == "__main__":
    sys.exit(main())
