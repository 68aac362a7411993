"""The ``nsa-tui`` command line: every command and option (nsa_tui/cli/main.py runs them). HOST is
always a host list: ``local``, an SSH destination, or ``H1,H2,...`` (one run over several)."""

from __future__ import annotations

import argparse

from nsa.contract.rundir import TRAIN_LOG
from nsa_tui import __version__
from nsa_tui.cli import evaluate as cli_eval
from nsa_tui.cli import sample as cli_sample

HOSTS = "local, an SSH destination, or H1,H2,... (one run over several hosts)"

def parser() -> argparse.ArgumentParser:
    """The argument parser of ``nsa-tui`` (usage errors exit 2, as argparse does)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--runs-root", default=None, help="runs root on the host (default ~/nsa-runs)")
    p = argparse.ArgumentParser(prog="nsa-tui", description="NSA training control panel and host CLI.",
                                epilog="Without a command: the control panel on this machine.")
    p.add_argument("--version", action="version", version=f"nsa-tui {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    c = sub.add_parser("connect", help="open the panel on these hosts")
    c.add_argument("dests", nargs="+", metavar="DEST")
    rl = sub.add_parser("runs", parents=[common], help="list runs (archived ones with --all)")
    rl.add_argument("host", metavar="HOST", nargs="?", default="local", help=f"{HOSTS} (default local)")
    rl.add_argument("--all", action="store_true", help="also the archived runs")
    la = sub.add_parser("launch", parents=[common], help="validate a config on the host and start a run")
    la.add_argument("host", metavar="HOST", nargs="?", default=None,  # required: see parse
                    help=f"{HOSTS}; it may come last, after --set's items")
    la.add_argument("--config", required=True, help="config path (on the host, or local with --upload)")
    la.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=int, default=None,
                    help="processes per host (default: the host's GPU count, or 1)")
    la.add_argument("--rdzv-host", default=None, help="several hosts: the first host's address as the "
                    "others reach it (default: the address its SSH connection reached)")
    la.add_argument("--rdzv-port", type=int, default=None, help="several hosts: the rendezvous port on the "
                    "first host (default: a free one there, from 29400)")
    la.add_argument("--set", nargs="+", action="extend", default=[], metavar="K=V",
                    help="config overrides (every word after it up to the next option)")
    la.add_argument("--name", default=None, help="run name (default: the config's name)")
    la.add_argument("--upload", action="store_true", help="send this machine's config file to the host")
    la.add_argument("--on-failure", default=None, choices=["none", "restart", "fallback", "stop"],
                    help="what the host's watchdog does when the run fails (config on_failure.action)")
    al = sub.add_parser("alerts", parents=[common], help="the host's recorded alerts (every run, or one)")
    al.add_argument("host", metavar="HOST", help=HOSTS)
    al.add_argument("run", nargs="?", default=None)
    al.add_argument("-f", "--follow", action="store_true", help="keep printing changes as they happen")
    al.add_argument("--history", type=int, default=100, help="resolved alerts shown per run (default 100)")
    ak = sub.add_parser("ack", parents=[common], help="acknowledge an alert (its id, or its kind)")
    ak.add_argument("host", metavar="HOST", help=HOSTS)
    ak.add_argument("run")
    ak.add_argument("alert")
    sl = la.add_argument_group("Slurm", "HOST is the cluster's login node; the run is a batch job "
                               "(docs/slurm.md)")
    sl.add_argument("--slurm", action="store_true", help="submit with sbatch from HOST, a Slurm login node")
    sl.add_argument("--nodes", type=int, default=None, help="--slurm: nodes of the allocation (default 1)")
    sl.add_argument("--partition", default=None, help="--slurm: the partition (default: the cluster's)")
    sl.add_argument("--time", default=None, metavar="HH:MM:SS", help="--slurm: the job's time limit")
    sl.add_argument("--account", default=None, help="--slurm: the account charged")
    sl.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                    help="--slurm: one more sbatch option, e.g. --sbatch-arg=--qos=high (repeatable)")
    sl.add_argument("--requeue", action="store_true", help="--slurm: on preemption or near the time limit "
                    "save a checkpoint, requeue and resume from it")
    la.add_argument("--force", action="store_true",
                    help="start even when the host says the config cannot run there (no GPU for a CUDA-only "
                         "config, a Hub data source without network)")
    ex = sub.add_parser("export", parents=[common], help="a run's metrics as CSV and/or TensorBoard files",
                        description="Reads every metrics line through the host's agent and writes here. "
                                    "TensorBoard needs tensorboardX: pip install 'nsa-tui[export]'.")
    ex.add_argument("host", metavar="HOST", help=HOSTS)
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
        sp.add_argument("host", metavar="HOST", help=HOSTS)
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
    st.add_argument("host", metavar="HOST", help="an SSH destination, or H1,H2,... (each in turn)")
    st.add_argument("--no-deps", action="store_true", help="pip --no-deps: install no dependency")
    st.add_argument("--prefix", default="~/.nsa-tui", help="install directory on the host")
    st.add_argument("--python", default="python3", help="the host's python that creates the venv")
    cli_sample.add_parser(sub, common)
    cli_eval.add_parser(sub, common)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments of ``nsa-tui`` (usage errors exit 2). ``--set`` takes every word after it, so
    ``launch --config C --set k=v HOST`` leaves HOST among the items: the last one, without ``=``,
    is HOST when no other word is (an override always has ``=``)."""
    p = parser()
    args = p.parse_args(argv)
    if args.cmd == "launch" and args.host is None:
        if not args.set or "=" in args.set[-1]:
            p.error("launch: the following arguments are required: HOST")
        args.host = args.set.pop()
    return args
