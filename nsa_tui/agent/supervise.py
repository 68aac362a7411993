"""The launcher process of a run: ``python -m nsa_tui.agent.supervise RUN_DIR -- CMD...``.

Why it exists: the agent starts runs detached (own session and process group) and may
exit long before the run does, so nobody would collect torchrun's exit status. This
small parent waits for it and writes ``exit.json`` (exit code, signal, time), which is
what turns "processes gone without a final status" into a crash report with its code.
It survives the group's TERM (it must outlive torchrun to record the code) but not KILL.

It is also the run's watchdog (nsa_tui/agent/watchdog.py): alerts detected from the run's
files whether or not any panel is connected, written to alerts.jsonl, delivered, with
evidence and the run's ``on_failure`` policy. The watchdog never stands in the way of the
supervisor's first job: whatever it does wrong, exit.json is written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from nsa.contract import ExitInfo, LaunchInfo, read_json, write_json_atomic
from nsa.contract.rundir import CONFIG_YAML, EXIT_JSON, LAUNCH_JSON
from nsa_tui.agent.owners import LeaseKeeper, own_part


def _ignore(signum: int, frame: object) -> None:
    """A Python handler, not SIG_IGN: exec resets handlers, so torchrun keeps defaults."""


def log(msg: str) -> None:
    print(msg, flush=True)  # stdout is train.log


def _policy(run_dir: Path) -> Any:
    """The run's ``on_failure`` (its config with the launch's overrides), None if unreadable."""
    launch = read_json(own_part(run_dir) / LAUNCH_JSON, LaunchInfo)
    try:
        from nsa.config import load_config

        return load_config(run_dir / CONFIG_YAML, launch.overrides if launch else []).on_failure
    except Exception as exc:  # noqa: BLE001 - the run itself will say what is wrong with its config
        log(f"nsa-tui watchdog: on_failure policy not read ({type(exc).__name__}: {exc}); none applies")
        return None


def start_watchdog(run_dir: Path, runner: Callable[[Any, Callable[[str], None]], Any], **kw: Any) -> Any:
    """The run's watchdog thread, started. ``runner(policy, announce)`` builds what carries out
    the run's ``on_failure`` (the supervisor's :class:`PolicyRunner`, or a Slurm job's:
    nsa_tui/agent/slurmwatch.py); ``kw`` goes to the :class:`Watchdog`."""
    from nsa_tui.agent.watchdog import Watchdog
    from nsa_tui.user.settings import Settings, SettingsError, load_settings

    problem = ""
    try:
        settings = load_settings()
    except SettingsError as exc:
        settings, problem = Settings(), str(exc)
        log(f"nsa-tui watchdog: {exc}; using the default settings")
    wd: Any = None

    def announce(message: str) -> None:
        log(f"nsa-tui watchdog: {message}")
        wd.add_extra("policy", "warning", message, suggested_actions=["logs"])
        if wd.exit is not None:  # after the run: write it now (the loop has stopped)
            wd.poll(final=True)

    policy = _policy(run_dir)
    wd = Watchdog(run_dir, settings, log=log, settings_problem=problem,
                  policy=runner(policy, announce) if policy is not None else None, **kw)
    wd.start()
    return wd


def _start_watchdog(run_dir: Path, proc: subprocess.Popen[bytes]) -> Any:
    from nsa_tui.agent.policy import PolicyRunner

    return start_watchdog(run_dir, lambda policy, announce: PolicyRunner(run_dir, policy, proc, announce))


def finish_watchdog(run_dir: Path, wd: Any, record: ExitInfo) -> list[Any]:
    """The run's end, given to its watchdog before exit.json: its last alerts, run.json's reason led
    by the root cause; ``record.watchdog`` set once they are written. The alerts still open."""
    final: list[Any] = []
    try:
        wd.finish(record)
        final = [rec.alert for rec in wd.ledger.open.values()]
        record.watchdog = True
        _lead_with_root_cause(run_dir, wd)
    except Exception as exc:  # noqa: BLE001
        log(f"nsa-tui watchdog: final check failed: {type(exc).__name__}: {exc}")
    return final


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m nsa_tui.agent.supervise RUN_DIR -- CMD...", file=sys.stderr)
        return 2
    run_dir, cmd = Path(argv[0]), argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, _ignore)
    started = time.time()
    os.umask(0o077)  # the run's files are private to its user (inherited by torchrun and the ranks)
    wd: Any = None
    part = own_part(run_dir)
    lease = LeaseKeeper(part)  # other hosts sharing the runs root: this part lives while renewed
    lease.start()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"nsa-tui supervise: cannot start {cmd[0]!r}: {exc}", file=sys.stderr, flush=True)
        code = 127
    else:
        try:
            wd = _start_watchdog(run_dir, proc)
        except Exception as exc:  # noqa: BLE001 - the run goes on without its watchdog
            log(f"nsa-tui watchdog: not started: {type(exc).__name__}: {exc}")
        code = proc.wait()
    record = ExitInfo(exit_code=code if code >= 0 else None, signal=-code if code < 0 else None,
                      started_at=started, ended_at=time.time())
    final = finish_watchdog(run_dir, wd, record) if wd is not None else []
    write_json_atomic(part / EXIT_JSON, record)
    print(f"nsa-tui supervise: command exited with {code}", flush=True)
    try:
        if wd is not None:
            after_run(wd, final)  # ranks that outlived torchrun keep the lease renewed
    finally:
        lease.stop()
    return 0


def _lead_with_root_cause(run_dir: Path, wd: Any) -> None:
    """run.json's exit_reason is rank 0's: after ``kill -9`` of another rank, rank 0's own
    knock-on error (a connection reset). The panel's header, its summary and ``status`` show
    that reason, so it is rewritten to lead with the rank that failed first and how, the
    knock-on error kept after it. Only by the host holding rank 0 (run.json's writer, gone now)."""
    from nsa.contract import RunInfo, RunStatus
    from nsa.contract.rundir import RUN_JSON
    from nsa_tui.health.rootcause import headline

    if not wd.holds_rank0():
        return
    info = read_json(run_dir / RUN_JSON, RunInfo)
    if info is None or info.status != RunStatus.FAILED or not info.exit_reason:
        return
    cause = wd.root_cause()
    reason = headline(info.exit_reason, cause) if cause is not None else None
    if reason is not None:
        write_json_atomic(run_dir / RUN_JSON, msgspec.structs.replace(info, exit_reason=reason))


def after_run(wd: Any, final: list[Any], drain_s: float = 60.0) -> None:
    """After exit.json: ranks that outlived torchrun, the policy's relaunch, pending deliveries
    (at most ``drain_s``)."""
    try:
        while wd.live_rank_pids():  # orphans hold their GPUs: keep watching until they are gone
            wd.poll()
            time.sleep(wd.s.watchdog.interval_s)
        if wd.policy is not None:
            wd.policy.after_exit(wd.view(), final)
        wd.poll(final=True)
    except Exception as exc:  # noqa: BLE001
        log(f"nsa-tui watchdog: after the run: {type(exc).__name__}: {exc}")
    finally:
        wd.close(drain_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
