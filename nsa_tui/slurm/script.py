"""The batch script of a Slurm run and sbatch's argument list (pure: strings in, strings out).

The script is written into the run directory and kept, so what ran can be read and rerun.
Everything taken from the user (paths, overrides, names) is quoted with ``shlex.quote``;
sbatch's own options go as separate arguments, never through a shell. The script runs one
``srun`` task per node, each a torchrun meeting at the c10d rendezvous on the allocation's
first node (on a port chosen there as the job starts: rdzvport.py), and starts from the
run's newest checkpoint when there is one (a requeued job continues where it stopped). With
requeue, Slurm sends the batch shell USR1 ``signal_s`` seconds before the time limit; the
script asks Slurm to requeue the job, Slurm sends every rank TERM, and the ranks save a
checkpoint and exit before it requeues. Beside srun the script runs the run's watchdog
(nsa_tui/agent/slurmwatch.py) and hands it srun's end (exit.json).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from nsa.contract.rundir import EXIT_JSON
from nsa.contract.slurm import SlurmRequest

_TIME = re.compile(r"^(\d+-)?\d{1,3}:\d{2}:\d{2}$|^\d+$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.,+-]*$")  # partitions and accounts
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# after srun, the script waits this long at most for the watchdog's last word (its final alerts,
# the on_failure policy's relaunch, notifications still being delivered)
WATCH_WAIT_S = 120
# options whose meaning nsa-tui owns: given through --sbatch-arg they would contradict the script
_OWNED = (
    "--nodes",
    "-N",
    "--ntasks-per-node",
    "--output",
    "-o",
    "--error",
    "-e",
    "--chdir",
    "-D",
    "--parsable",
    "--signal",
    "--requeue",
    "--no-requeue",
    "--job-name",
    "-J",
    "--open-mode",
    "--wrap",
)


def check_request(req: SlurmRequest) -> None:
    """Refuse what sbatch would misread, naming the value (ValueError)."""
    if req.partition is not None and not _NAME.match(req.partition):
        raise ValueError(f"--partition {req.partition!r}: not a partition name")
    if req.account is not None and not _NAME.match(req.account):
        raise ValueError(f"--account {req.account!r}: not an account name")
    if req.time is not None and not _TIME.match(req.time):
        raise ValueError(f"--time {req.time!r}: expected HH:MM:SS, D-HH:MM:SS or minutes")
    for arg in req.sbatch_args:
        if _CONTROL.search(arg) or not arg.startswith("-"):
            raise ValueError(f"--sbatch-arg {arg!r}: one sbatch option (--name=value) per argument")
        opt = arg.split("=", 1)[0]
        if opt in _OWNED or any(opt.startswith(o) and len(o) == 2 for o in _OWNED if len(o) == 2):
            raise ValueError(f"--sbatch-arg {arg!r}: nsa-tui sets {opt} itself")


@dataclass
class JobSpec:
    """What one batch job runs: the run, its python, the training command's tail."""

    run_id: str
    run_dir: str
    name: str
    python: str
    nproc_per_node: int
    train_args: list[str]  # after ``-m nsa.train``: --config, --run-dir, --set, --parent-run
    resume_from: str | None  # the first attempt's checkpoint (a fallback/resume); later: the run's own
    env: dict[str, str]  # exported by the script (NSA_RUN_ID, PYTHONPATH, ...)
    log: str  # the run's train.log


def sbatch_argv(req: SlurmRequest, spec: JobSpec, script: str) -> list[str]:
    """sbatch's arguments: ``--parsable`` (the job id alone), the allocation, the script last."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name=nsa-{spec.name}"[:64],
        f"--nodes={req.nodes}",
        "--ntasks-per-node=1",
        f"--chdir={spec.run_dir}",
        f"--output={spec.log}",
        "--open-mode=append",
    ]
    if req.partition:
        argv.append(f"--partition={req.partition}")
    if req.time:
        argv.append(f"--time={req.time}")
    if req.account:
        argv.append(f"--account={req.account}")
    if req.requeue:
        argv += ["--requeue", f"--signal=B:USR1@{req.signal_s}"]
    else:
        argv.append("--no-requeue")
    return [*argv, *req.sbatch_args, script]


def torchrun_argv(spec: JobSpec, nnodes: int) -> list[str]:
    """torchrun on one node of the allocation (the rendezvous endpoint comes from the script)."""
    return [
        spec.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc_per_node={spec.nproc_per_node}",
        "--rdzv-backend=c10d",
        "--max-restarts=0",
    ]


def build_script(req: SlurmRequest, spec: JobSpec, submitted_with: list[str]) -> str:
    """The batch script: bash, every user value quoted, torchrun under srun."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# nsa-tui run {spec.run_id}: written and submitted by nsa-tui on the login node.",
        "# submitted with: " + " ".join(q(a) for a in submitted_with),
        "set -euo pipefail",
        "umask 077  # the run's files are private to its user",
    ]
    lines += [f"export {k}={q(v)}" for k, v in sorted(spec.env.items())]
    lines += [
        'echo "nsa-tui: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST"',
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "# a port free on this node (the batch shell runs on the first one), reserved against the",
        "# other jobs starting here; the srun line below hands it to every node's torchrun",
        f'rdzv_port=$({q(spec.python)} -m nsa_tui.slurm.jobside rdzv-port {q(spec.run_dir)} "$SLURM_JOB_ID")',
        'echo "nsa-tui: rendezvous at $head_node:$rdzv_port"',
        "# the newest complete checkpoint of this run, else the one the run starts from",
        f"resume=$({q(spec.python)} -m nsa_tui.slurm.jobside resume-arg {q(spec.run_dir)}"
        + (f" {q(spec.resume_from)}" if spec.resume_from else "")
        + ")",
        "resume_args=()",
        'if [ -n "$resume" ]; then resume_args=(--resume "$resume"); fi',
    ]
    if req.requeue:
        lines += [
            "# USR1 comes signal_s seconds before the time limit (sbatch --signal=B:USR1@S): requeue;",
            "# Slurm then sends every rank TERM, and they save a checkpoint before exiting",
            'trap \'echo "nsa-tui: time limit near: requeueing job $SLURM_JOB_ID"; '
            'scontrol requeue "$SLURM_JOB_ID" || true\' USR1',
        ]
    train = " ".join(q(a) for a in torchrun_argv(spec, req.nodes))
    train += ' --rdzv-endpoint="$head_node:$rdzv_port" --rdzv-id="$SLURM_JOB_ID"'
    train += (
        " -m nsa.train " + " ".join(q(a) for a in spec.train_args) + ' ${resume_args[@]+"${resume_args[@]}"}'
    )
    lines += watch_start(spec)
    lines += [
        "srun_started=$(date +%s)",
        f"srun --nodes={req.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {train} &",
        "srun_pid=$!",
        "# wait returns early when a trapped signal arrives: wait again until srun has ended",
        "while true; do",
        '  set +e; wait "$srun_pid"; code=$?; set -e',
        '  if ! kill -0 "$srun_pid" 2>/dev/null; then break; fi',
        "done",
        'echo "nsa-tui: srun exited with $code"',
    ]
    lines += watch_handover(spec)
    lines.append('exit "$code"')
    return "\n".join(lines) + "\n"


def watch_start(spec: JobSpec) -> list[str]:
    """The run's watchdog, started in the background on this node before srun (docs/slurm.md,
    "The watchdog"): it lives and dies with the job. Nothing it does can stop the script: a
    background command's failure is its own, and what it says goes to train.log."""
    q = shlex.quote
    return [
        "# this attempt's end is handed to the watchdog below; an earlier attempt's (a requeue) goes",
        f"rm -f {q(spec.run_dir + '/' + EXIT_JSON)}",
        "# Slurm ends a job (scancel, time limit, requeue) with TERM to every process of it: this shell",
        "# outlives it, waits for srun (the ranks save a checkpoint) and hands srun's end over",
        "trap 'echo \"nsa-tui: TERM: waiting for srun to end\"' TERM",
        "# the run's watchdog beside the job: alerts, evidence, notifications and on_failure",
        f'{q(spec.python)} -m nsa_tui.agent.slurmwatch {q(spec.run_dir)} "$SLURM_JOB_ID" </dev/null &',
        "watch_pid=$!",
    ]


def watch_handover(spec: JobSpec) -> list[str]:
    """srun's end to the watchdog (exit.json), then its final alerts and policy, waited for at most
    WATCH_WAIT_S before the script ends the job (and the watchdog with it)."""
    q = shlex.quote
    return [
        f'{q(spec.python)} -m nsa_tui.slurm.jobside exit {q(spec.run_dir)} "$code" "$srun_started" || true',
        f"for ((i = 0; i < {WATCH_WAIT_S}; i++)); do",
        '  if ! kill -0 "$watch_pid" 2>/dev/null; then break; fi',
        "  sleep 1",
        "done",
        'kill -KILL "$watch_pid" 2>/dev/null || true',
    ]
