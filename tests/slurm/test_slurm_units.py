"""The pure parts of the Slurm support: parsing the queue's output, the script, the statuses."""

from __future__ import annotations

import shlex
import subprocess
import time

import pytest

from nsa.contract import Beat, ExitInfo, LaunchInfo, Phase, RunInfo, RunStatus, RunView, read_json
from nsa.contract.slurm import SlurmRequest, SlurmState
from nsa_tui.health.alerts import AlertDetector
from nsa_tui.slurm import jobside
from nsa_tui.slurm import script as S
from nsa_tui.slurm.cli import SlurmUsageError, slurm_request
from nsa_tui.slurm.queue import (
    SlurmQueue,
    parse_exit,
    parse_sacct,
    parse_scontrol,
    parse_squeue,
    parse_steps,
)
from nsa_tui.slurm.runstate import run_status
from nsa_tui.slurm.version import SlurmVersionError, check_supported, parse_version

SCONTROL = (
    "JobId=17 JobName=nsa-x UserId=me(1000) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) "
    "Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:15 RunTime=00:10:00 StartTime=2026-11-25T21:03:34 "
    "NodeList=gpu[01-04] BatchHost=gpu01 NumNodes=4"
)


def test_squeue_lines() -> None:
    jobs = parse_squeue(
        "12|PENDING|Priority|2026-11-26T03:00:00|\n13|RUNNING|None|2026-11-25T20:00:00|n[1-2]\n"
    )
    assert jobs["12"].state == "PENDING" and jobs["12"].reason == "Priority"
    assert jobs["12"].start_time == "2026-11-26T03:00:00" and jobs["12"].nodes is None
    assert jobs["13"].reason is None and jobs["13"].nodes == "n[1-2]"


def test_scontrol_and_sacct_give_the_end_and_its_code() -> None:
    st = parse_scontrol(SCONTROL)
    assert st is not None and (st.state, st.exit_code, st.signal, st.restarts) == ("TIMEOUT", None, 15, 2)
    assert st.nodes == "gpu[01-04]" and st.reason == "TimeLimit"
    assert parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None
    acct = parse_sacct("17|CANCELLED by 1000|0:0|n1|None|2026-11-25T21:03:34\n", "17")
    assert acct is not None and acct.state == "CANCELLED" and acct.exit_code == 0
    assert parse_exit("2:0") == (2, None) and parse_exit("0:9") == (None, 9)


def test_queue_prefers_squeue_and_falls_back_to_scontrol_then_sacct() -> None:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        calls.append(list(argv))
        if argv[0] == "squeue":
            return 0, "5|PENDING|Resources|2026-11-26T01:00:00|\n", ""
        if argv[0] == "scontrol":
            return (
                (0, SCONTROL.replace("JobId=17", "JobId=6"), "")
                if argv[-1] == "6"
                else (1, "", "Invalid job id")
            )
        return 0, "7|FAILED|1:0|n1|None|x\n", ""

    q = SlurmQueue(run, cache_s=60)
    assert q.state("5") is not None and q.state("5").reason == "Resources"  # type: ignore[union-attr]
    assert q.state("6").state == "TIMEOUT"  # type: ignore[union-attr]
    seven = q.state("7")
    assert seven is not None and (seven.state, seven.exit_code, seven.source) == ("FAILED", 1, "sacct")
    n = len(calls)
    q.state("7")
    assert len(calls) == n  # cached


@pytest.mark.parametrize(
    "state,trainer,stop,want",
    [
        ("PENDING", None, False, (RunStatus.QUEUED, False)),
        ("REQUEUED", RunStatus.STOPPED, False, (RunStatus.QUEUED, False)),
        ("RUNNING", None, False, (RunStatus.STARTING, True)),
        ("RUNNING", RunStatus.RUNNING, False, (RunStatus.RUNNING, True)),
        ("COMPLETED", RunStatus.FINISHED, False, (RunStatus.FINISHED, False)),
        ("CANCELLED", None, True, (RunStatus.STOPPED, False)),
        ("TIMEOUT", RunStatus.STOPPED, False, (RunStatus.STOPPED, False)),
        ("NODE_FAIL", RunStatus.RUNNING, False, (RunStatus.CRASHED, False)),
        (None, RunStatus.RUNNING, False, (RunStatus.LOST, False)),
    ],
)
def test_run_status(
    state: str | None, trainer: RunStatus | None, stop: bool, want: tuple[RunStatus, bool]
) -> None:
    st = SlurmState(job_id="1", state=state) if state else None
    assert run_status(st, trainer, stop) == want


def test_a_queued_run_with_old_beats_is_not_stalled() -> None:
    """A requeued job waiting in the queue: its beats are old, but nothing of it should beat."""
    now = time.time()
    beat = Beat(run_id="r", rank=0, ts=now - 300, pid=1, step=8, phase=Phase.TRAIN)
    for status, alerted in ((RunStatus.QUEUED, False), (RunStatus.RUNNING, True)):
        det = AlertDetector("login")
        view = RunView(
            run_id="r",
            dir="/x",
            name="r",
            status=status,
            info=RunInfo(run_id="r", name="r"),
            launch=LaunchInfo(run_id="r", name="r", created=now - 600),
            alive=status.is_alive(),
        )
        det.feed_view("r", view)
        det.feed_beat("r", beat)
        kinds = [a.kind for a in det.check(now)]
        assert ("no_heartbeat" in kinds) == alerted, (status, kinds)


def test_script_quotes_every_user_value_and_is_valid_bash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    req = SlurmRequest(nodes=2, partition="gpu", time="1-00:00:00", requeue=True, sbatch_args=["--qos=high"])
    spec = S.JobSpec(
        run_id="r",
        run_dir=str(tmp_path / "a b"),
        name="x",
        python="/py",
        nproc_per_node=8,
        train_args=["--set", "data.path=$(touch /tmp/pwned)"],
        resume_from=None,
        env={"NSA_RUN_ID": "r"},
        log=str(tmp_path / "log"),
    )
    argv = S.sbatch_argv(req, spec, str(tmp_path / "job.sh"))
    assert (
        argv[:2] == ["sbatch", "--parsable"] and "--signal=B:USR1@120" in argv and argv[-1].endswith("job.sh")
    )
    assert "--partition=gpu" in argv and "--time=1-00:00:00" in argv and "--qos=high" in argv
    body = S.build_script(req, spec, argv)
    assert "'data.path=$(touch /tmp/pwned)'" in body and "--nproc_per_node=8" in body and "--nnodes=2" in body
    assert "trap " in body and "scontrol requeue" in body
    path = tmp_path / "job.sh"
    path.write_text(body)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    plain = S.build_script(SlurmRequest(), spec, ["sbatch"])
    assert "USR1" not in plain and "--no-requeue" in S.sbatch_argv(SlurmRequest(), spec, "j")


@pytest.mark.parametrize(
    "req,bad",
    [
        (SlurmRequest(partition="a;b"), "--partition"),
        (SlurmRequest(time="forever"), "--time"),
        (SlurmRequest(sbatch_args=["--nodes=3"]), "sets --nodes"),
        (SlurmRequest(sbatch_args=["--x=1\nrm"]), "one sbatch"),
        (SlurmRequest(sbatch_args=["-N2"]), "sets -N"),
        (SlurmRequest(account="x y"), "--account"),
    ],
)
def test_bad_requests_are_refused_naming_the_value(req: SlurmRequest, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        S.check_request(req)


def test_versions() -> None:
    assert parse_version("slurm-wlm 22.05.8\n") == (22, 5, 8)
    assert parse_version("slurm 23.02.4") == (23, 2, 4)
    check_supported((17, 11, 0))
    with pytest.raises(SlurmVersionError, match="older"):
        check_supported((16, 5, 1))
    with pytest.raises(SlurmVersionError):
        parse_version("command not found")


def test_cli_options_need_slurm() -> None:
    from nsa_tui.cli.args import parser

    args = parser().parse_args(["launch", "h", "--config", "c", "--partition", "gpu"])
    with pytest.raises(SlurmUsageError, match="--partition"):
        slurm_request(args)
    args = parser().parse_args(
        ["launch", "h", "--slurm", "--nodes", "2", "--config", "c", "--sbatch-arg=--qos=x", "--requeue"]
    )
    req = slurm_request(args)
    assert req is not None and req.nodes == 2 and req.sbatch_args == ["--qos=x"] and req.requeue


def _view(status: RunStatus, slurm: SlurmState | None) -> RunView:
    return RunView(
        run_id="r",
        dir="/x",
        name="r",
        status=status,
        info=RunInfo(run_id="r", name="r"),
        alive=status.is_alive(),
        slurm=slurm,
    )


def test_job_text_and_the_status_and_runs_texts_show_the_queue() -> None:
    from nsa.contract import RunStatusReport
    from nsa_tui.cli.text import runs_table, status_text
    from nsa_tui.slurm.text import job_text

    held = SlurmState(
        job_id="12",
        state="PENDING",
        reason="Priority",
        start_time="2026-11-26T03:00:00",
        script="/runs/r/slurm-job.sh",
    )
    assert job_text(held) == "job 12 PENDING (Priority), expected start 2026-11-26T03:00:00"
    running = SlurmState(job_id="12", state="RUNNING", nodes="gpu[01-02]", restarts=1)
    assert job_text(running) == "job 12 RUNNING on gpu[01-02], requeued 1x"
    assert job_text(SlurmState(job_id="12", state="FAILED", exit_code=3)) == "job 12 FAILED, exit code 3"
    assert (
        job_text(SlurmState(job_id="12", state="NODE_FAIL", signal=9))
        == "job 12 NODE_FAIL, killed by signal 9"
    )
    text = status_text(RunStatusReport(run=_view(RunStatus.QUEUED, held)), [], time.time(), 0.0)
    assert "status=queued" in text and "slurm: job 12 PENDING (Priority)" in text
    assert "script: /runs/r/slurm-job.sh" in text
    assert "queued [Priority]" in runs_table([_view(RunStatus.QUEUED, held)], time.time())


def test_the_panel_takes_a_requeued_job_back_to_queued() -> None:
    """The panel never moves a status backwards, except for a job Slurm requeued."""
    from nsa_tui.app.reducer import run_view
    from nsa_tui.app.state import PanelState

    state = PanelState()
    run_view(state, "login", _view(RunStatus.RUNNING, SlurmState(job_id="1", state="RUNNING")))
    late = run_view(state, "login", _view(RunStatus.QUEUED, SlurmState(job_id="1", state="PENDING")))
    assert late.view is not None and late.view.status == RunStatus.RUNNING  # a late report: kept
    again = run_view(
        state, "login", _view(RunStatus.QUEUED, SlurmState(job_id="1", state="PENDING", restarts=1))
    )
    assert again.view is not None and again.view.status == RunStatus.QUEUED


def test_settings_mark_slurm_login_nodes_and_refuse_bad_entries(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from nsa_tui.user.settings import SettingsError, load_settings

    path = tmp_path / "settings.yaml"
    path.write_text("slurm:\n  mycluster:\n    partition: gpu\n    nodes: 2\n    requeue: true\n")
    req = load_settings(path).slurm["mycluster"]
    assert (req.partition, req.nodes, req.requeue) == ("gpu", 2, True)
    for bad, said in (
        ("    partitoin: gpu\n", "unknown key 'partitoin'"),
        ("    nodes: 0\n", "slurm.mycluster"),
        ("    time: soon\n", "--time"),
    ):
        path.write_text("slurm:\n  mycluster:\n" + bad)
        with pytest.raises(SettingsError, match=said):
            load_settings(path)


def test_script_starts_the_watchdog_before_srun_and_hands_it_srun_s_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The watchdog beside the job: an earlier attempt's exit.json removed, the watchdog started in
    the background before srun, the shell outliving Slurm's TERM; after srun, exit.json written
    (a failure of that is no failure of the script), the watchdog waited for at most
    WATCH_WAIT_S, then ended, and the script exits with srun's code."""
    spec = S.JobSpec(run_id="r", run_dir=str(tmp_path / "a b"), name="x", python="/py", nproc_per_node=1,
                     train_args=[], resume_from=None, env={}, log=str(tmp_path / "log"))
    body = S.build_script(SlurmRequest(), spec, ["sbatch"])
    run_dir = shlex.quote(spec.run_dir)
    order = [f"rm -f {shlex.quote(spec.run_dir + '/exit.json')}\n",
             "' TERM\n",
             f'/py -m nsa_tui.agent.slurmwatch {run_dir} "$SLURM_JOB_ID" </dev/null &\n',
             "srun --nodes=1 ",
             'echo "nsa-tui: srun exited with $code"\n',
             f'/py -m nsa_tui.slurm.jobside exit {run_dir} "$code" "$srun_started" || true\n',
             f"for ((i = 0; i < {S.WATCH_WAIT_S}; i++)); do\n",
             'kill -KILL "$watch_pid" 2>/dev/null || true\n',
             'exit "$code"\n']
    at = [body.find(part) for part in order]
    assert -1 not in at and at == sorted(at), list(zip(order, at))


def test_the_steps_a_stop_signals_are_the_job_s_srun_steps() -> None:
    out = "41.0\n41.batch\n41.extern\n41.12\n410.0\n"
    assert parse_steps(out, "41") == ["41.0", "41.12"]
    assert parse_steps("", "41") == []


def test_srun_s_end_is_handed_over_as_exit_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert jobside.main(["exit", str(tmp_path), "137", "1700000000"]) == 0
    rec = read_json(tmp_path / "exit.json", ExitInfo)
    assert rec is not None and (rec.exit_code, rec.started_at, rec.watchdog) == (137, 1700000000.0, False)
    assert jobside.main(["exit", str(tmp_path), "x", "1"]) == 2
