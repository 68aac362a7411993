"""``data.loader: process`` (nsa/train/loader_process.py): the batches made in a child process
are the loader thread's, exactly (tokens, streams, positions after each, epoch messages); an
error there is raised by ``next`` with the child's traceback; the child leaves on ``close`` and
when its parent dies; and nsa-train trains the same with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from nsa.config import DataConfig
from nsa.train.data import Packer, PrefetchLoader, StreamPos
from nsa.train.loader_process import LoaderSpec, ProcessLoader
from nsa.train.sources import DataSourceError, build_source
from nsa.train.tokenizer import build_tokenizer
from tests.train.trainrun import REPO, metrics, run_train, wait_for

pytestmark = pytest.mark.timeout(240)


def corpus(tmp_path: Path) -> DataConfig:
    """Five short text files, read as whole documents: a 2-stream split that runs out quickly."""
    import datasets

    datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    for i in range(5):
        (tmp_path / f"doc{i}.txt").write_text(f"document {i}: " + "lorem ipsum dolor " * (i + 2) + "\n")
    return DataConfig(source="files", paths=[str(tmp_path / "*.txt")], val_every_n_docs=1000)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_process_makes_the_threads_batches(tmp_path: Path) -> None:
    data = corpus(tmp_path)
    positions = {1: StreamPos(0, 1, 5)}  # stream 1 resumes inside its second document
    spec = LoaderSpec(data, [0, 1], 2, 17, positions, micro_per_stream=2, batch_size=3)
    source, tok = build_source(data), build_tokenizer(data)
    packers = {s: Packer(source, tok, s, 2, "train", 17, pos=positions.get(s)) for s in (0, 1)}
    thread = PrefetchLoader(packers, 2, 3, prefetch=2)
    process = ProcessLoader(spec, prefetch=2)
    try:
        want = [thread.next() for _ in range(12)]
        got = [process.next() for _ in range(12)]
    finally:
        thread.close()
        process.close()
    assert [b.stream for b in got] == [0, 0, 1, 1] * 3
    for a, b in zip(got, want):
        assert a.tokens.tolist() == b.tokens.tolist() and a.tokens.dtype == b.tokens.dtype
        assert (a.stream, a.positions, a.events) == (b.stream, b.positions, b.events)
    said = [e for b in got for e in b.events]
    assert said and all(" ends, epoch " in e for e in said)  # the epoch messages crossed too
    assert gone(process.pid)


def test_an_error_in_the_process_is_raised_by_next_with_its_traceback(tmp_path: Path) -> None:
    data = corpus(tmp_path)
    spec = LoaderSpec(data, [0], 1, 17, {0: StreamPos(0, 0, 10_000)}, micro_per_stream=1, batch_size=2)
    loader = ProcessLoader(spec, prefetch=2)
    try:
        with pytest.raises(DataSourceError, match="offset 10000 beyond document 0") as info:
            loader.next()
    finally:
        loader.close()
    notes = getattr(info.value, "__notes__", None)
    if sys.version_info >= (3, 11):
        assert notes and "in the data process:" in notes[0] and "Traceback" in notes[0], notes
    assert gone(loader.pid)


def test_the_process_leaves_when_its_parent_dies(tmp_path: Path) -> None:
    """A rank killed outright (SIGKILL: no close, no atexit) takes its data process with it."""
    corpus(tmp_path)
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, signal\n"
        "from nsa.config import DataConfig\n"
        "from nsa.train.loader_process import LoaderSpec, ProcessLoader\n"
        "if __name__ == '__main__':\n"
        f"    data = DataConfig(source='files', paths=[{str(tmp_path / '*.txt')!r}], val_every_n_docs=1000)\n"
        "    loader = ProcessLoader(LoaderSpec(data, [0], 1, 17, {}, 1, 2), prefetch=2)\n"
        "    loader.next()\n"
        "    print(loader.pid, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    child = int(proc.stdout.split()[0])
    wait_for(lambda: gone(child), 30, f"the data process {child} to leave after its parent was killed")


def test_nsa_train_trains_the_same_with_its_batches_made_in_a_process(tmp_path: Path) -> None:
    runs = {}
    for kind in ("thread", "process"):
        done = run_train(tmp_path / kind, [f"data.loader={kind}", "train.steps=4", "train.grad_accum=2"],
                         nproc=None)
        assert done.rc == 0, done.output[-3000:]
        assert f"batches made by a {kind} (data.loader {kind})" in done.output, done.output[-3000:]
        runs[kind] = [(m["step"], m["loss"]) for m in metrics(done.run_dir)]
    assert len(runs["thread"]) == 4 and runs["process"] == runs["thread"]


def test_the_gil_benchmark_runs_and_reports_both_loaders(tmp_path: Path) -> None:
    """``bench.loader_gil`` (timings are its business, not this test's): every row is there."""
    import json

    from bench import loader_gil

    out = tmp_path / "gil.json"
    assert loader_gil.main(["--ops", "50", "--steps", "3", "--seq-len", "64", "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    for key in ("step_alone_ms", "step_with_thread_ms", "step_with_process_ms",
                "loader_cpu_ms_per_micro_batch"):
        assert row[key] > 0, row


def test_the_agent_sees_the_run_in_it_but_not_a_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host agent finds a run's processes by their environment: the data process carries the
    run's id (a kill of the run reaches it) but no ``RANK``, so a stack dump (SIGUSR1 to every
    rank) leaves it alone; it ignores SIGUSR1 all the same, and a stop's TERM or INT sent to
    every process (Slurm's scancel): the rank may need batches to finish its step. The rank keeps
    its own environment."""
    from nsa_tui.agent.procs import environ_of, run_processes

    monkeypatch.setenv("NSA_RUN_ID", "run-under-test")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    loader = ProcessLoader(LoaderSpec(corpus(tmp_path), [0], 1, 17, {}, 1, 2), prefetch=2)
    try:
        loader.next()
        env = environ_of(loader.pid)
        assert env.get("NSA_RUN_ID") == "run-under-test" and "RANK" not in env and "LOCAL_RANK" not in env
        assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("0", "0")
        found = {p.pid: p.rank for p in run_processes("run-under-test", fresh=True)}
        assert found.get(loader.pid, "missing") is None, found
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):  # a dump, a stop: the rank's
            os.kill(loader.pid, sig)
        for _ in range(8):
            loader.next()  # still making batches
    finally:
        loader.close()
