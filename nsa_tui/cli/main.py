"""``nsa-tui``: the control panel (no arguments, or ``connect DEST...``) and a CLI for scripts.

    nsa-tui runs [HOST] [--all]                nsa-tui status HOST RUN
    nsa-tui launch HOST --config PATH [--nproc N] [--set k=v ...] [--name NAME] [--upload]
                   [--on-failure restart|fallback|stop|none]
    nsa-tui logs HOST RUN [-f]                 nsa-tui kill HOST RUN [--grace S]
    nsa-tui fallback HOST RUN [--nproc N]      nsa-tui resume HOST RUN
    nsa-tui dump HOST RUN [--out DIR]          nsa-tui setup HOST
    nsa-tui export HOST RUN [--tensorboard DIR] [--csv PATH]
    nsa-tui alerts HOST [RUN] [--follow]       nsa-tui ack HOST RUN ALERT
    nsa-tui archive HOST RUN [--undo]          nsa-tui delete HOST RUN [--yes]
    nsa-tui sample HOST RUN [--checkpoint STEP] [--prompt TEXT | --prompt-file FILE]
                   [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--device D]
    nsa-tui eval HOST RUN --passkey [--checkpoint STEP] [--lengths N,..] [--depths F,..] [--trials N]
                   [--seed S] [--beyond-context] [--device D]        nsa-tui eval HOST RUN --history
    nsa-tui launch H1,H2 --config PATH --nproc-per-node N [--rdzv-host ADDR]   (several hosts)
    nsa-tui launch LOGIN --slurm --config PATH [--nodes N] [--nproc-per-node G] [--partition P]
                   [--time HH:MM:SS] [--account A] [--sbatch-arg ARG ...] [--requeue]  (docs/slurm.md)

HOST is a host list: ``local`` or an SSH destination (``[user@]host[:port]`` or a
~/.ssh/config alias), or ``H1,H2,...``, one run over several hosts (docs/multi-node.md); a
host may name its own runs root (``gpu1:/scratch/runs``); a command on one host of such a run
reaches all of its hosts. Every command goes one way: the
hosts are connected at once, RUN is resolved, then nsa_tui/cli/one.py (one host) or
nsa_tui/cli/multi.py (several) does it, and every error becomes its exit code through one
table (nsa_tui/cli/exitcodes.py, docs/cli.md). Every command takes ``--json`` (one JSON document,
or JSON lines for ``logs``) and ``--runs-root DIR``. RUN is a run id, a unique prefix of one
(what ``runs`` shows) or a run's name; an ambiguous one is a usage error listing the matches.
``nsa-tui --version`` prints the version.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from nsa_tui.cli.args import parse
from nsa_tui.cli.exitcodes import *  # noqa: F403 (cli.EXIT_* stay importable from here)
from nsa_tui.cli.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_PIPE, emit, fail
from nsa_tui.cli.runref import RunRefError, resolve
from nsa_tui.hosts.spec import runs_root_for, split_runs_root

PER_RUN = ("status", "logs", "alerts", "kill", "fallback", "resume", "dump")  # reach every host of the run


def host_list(arg: str) -> list[str]:
    """``H1,H2,...`` as a list, in the order given (a single host is a list of one)."""
    return [d.strip() for d in arg.split(",") if d.strip()]


async def _ask_host_key(host: str, fingerprint: str) -> bool:
    """Interactive yes/no for an unknown host key; never yes without a terminal (the refusal
    then says how to accept the key: nsa_tui/transport/ssh.py)."""
    if not sys.stdin.isatty():
        return False
    print(f"The host {host} is not known.\nIts key fingerprint is {fingerprint}.", file=sys.stderr)
    answer = await asyncio.to_thread(input, "Trust it and remember it in known_hosts? (yes/no) ")
    return answer.strip().lower() == "yes"


async def _setup(args: argparse.Namespace, hosts: list[str]) -> int:
    """Install this version on each host in turn; the first failure stops (and says which)."""
    from nsa_tui.install.setup_host import setup_host
    from nsa_tui.transport import TransportError

    done: dict[str, Any] = {}
    for host in hosts:
        where = f"{host}: " if len(hosts) > 1 else ""
        try:
            res = await setup_host(split_runs_root(host)[0], confirm_host_key=_ask_host_key,
                                   no_deps=args.no_deps,
                                   prefix=args.prefix, python=args.python,
                                   log=None if args.json else lambda m: print(m, file=sys.stderr))
        except TransportError as exc:
            return fail(args, "unreachable", f"{where}{exc}")
        except RuntimeError as exc:
            return fail(args, "setup_failed", f"{where}{exc}")
        done[host] = res
        if len(hosts) == 1 or not args.json:
            emit(args, res, f"installed nsa-tui {res['version']} on {host}: {res['python']}")
    if len(hosts) > 1 and args.json:
        emit(args, done, "")
    return EXIT_OK


async def _connect(args: argparse.Namespace, hosts: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A client per host, started all at once: (connected, host -> why not)."""
    from nsa_tui.hosts.client import HostClient
    from nsa_tui.hosts.coordinator import connect

    per_host = _settings_roots()

    def make(d: str) -> HostClient:
        # ``gpu1:/scratch/runs``: that host's own runs root (nsa_tui/hosts/spec.py)
        c = HostClient(split_runs_root(d)[0], runs_root=runs_root_for(d, args.runs_root, per_host),
                       confirm_host_key=_ask_host_key)
        # only followers wait out a drop (on one host, alerts --follow too)
        c.reconnect = args.cmd == "logs" or (len(hosts) == 1 and getattr(args, "follow", False))
        return c

    return await connect(hosts, make)


def _settings_roots() -> dict[str, str]:
    """Per-host runs roots of the settings file; none when it does not read (the command goes on:
    the host's default applies)."""
    from nsa_tui.user.settings import SettingsError, host_runs_roots, load_settings

    try:
        return host_runs_roots(load_settings())
    except SettingsError:
        return {}


async def _close(clients: dict[str, Any]) -> None:
    await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)


async def _run_command(args: argparse.Namespace) -> int:
    """Every command but the panel's: one path for one host and several. Connect, resolve RUN,
    widen one host of a run over several to all of its hosts, do the command; every error it
    raises becomes its exit code here (nsa_tui/cli/exitcodes.py)."""
    from nsa_tui.cli import multi as cli_multi
    from nsa_tui.cli import one as cli_one
    from nsa_tui.hosts.client import AgentError
    from nsa_tui.hosts.coordinator import MultiHostError, run_hosts

    hosts = host_list(args.host)
    if not hosts:
        return fail(args, "bad_request", f"no host in {args.host!r}")
    if args.cmd == "setup":
        return await _setup(args, hosts)
    if args.cmd == "launch":  # Slurm options checked before connecting (nsa_tui/slurm/cli.py)
        from nsa_tui.slurm.cli import SlurmUsageError, slurm_request

        try:
            if slurm_request(args) is not None and len(hosts) > 1:
                raise SlurmUsageError("--slurm takes one host, the cluster's login node "
                                      "(--nodes N for more nodes)")
        except SlurmUsageError as exc:
            return fail(args, "bad_request", str(exc))
    clients, unreachable = await _connect(args, hosts)
    try:
        if not clients:
            host, why = next(iter(unreachable.items()))
            return fail(args, "unreachable", why if len(hosts) == 1 else f"{host}: {why}")
        if getattr(args, "run", None):
            args.run = await _resolve_run(clients, args.run)
        if len(hosts) == 1 and args.cmd in PER_RUN and getattr(args, "run", None):
            # one host of a run over several (`alerts HOST` without a run: that host's alone)
            wide = await run_hosts(clients, args.run)
            if len(wide) > 1:
                await _close(clients)
                hosts = wide
                clients, unreachable = await _connect(args, hosts)
                if not clients:
                    host, why = next(iter(unreachable.items()))
                    return fail(args, "unreachable", f"{host}: {why}")
        if len(hosts) == 1:
            return await cli_one.dispatch(clients[hosts[0]], args)
        return await cli_multi.run(args, clients, unreachable, hosts)
    except (AgentError, RunRefError) as exc:
        return fail(args, exc.code, exc.message)
    except MultiHostError as exc:
        return fail(args, exc.code, str(exc))
    finally:
        await _close(clients)


async def _resolve_run(clients: dict[str, Any], ref: str) -> str:
    """A run given by its id, a unique id prefix or its name (nsa_tui/cli/runref.py), among every
    host's runs. An id no list holds goes to the agents as given (they answer for it)."""
    from nsa.contract.rundir import RUN_ID_RE

    lists = await asyncio.gather(*(c.runs() for c in clients.values()), return_exceptions=True)
    if all(isinstance(x, BaseException) for x in lists):
        raise next(x for x in lists if isinstance(x, BaseException))
    seen: dict[str, Any] = {}
    for runs in lists:  # a host that failed to answer: its part is said by the command
        for r in [] if isinstance(runs, BaseException) else runs:
            seen.setdefault(r.run_id, r)  # a run over several hosts: one entry
    try:
        return resolve(ref, list(seen.values()))
    except RunRefError as exc:
        if exc.code == "no_such_run" and RUN_ID_RE.match(ref):
            return ref
        raise


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
    args = parse(argv)
    if args.cmd == "connect":
        return _panel(args.dests)
    if args.cmd is None:
        return _panel([])
    try:
        return asyncio.run(_run_command(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The reader went away (``nsa-tui status ... --json | head``): stop quietly, as a program
    killed by SIGPIPE would, instead of a traceback; later flushes go to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE

