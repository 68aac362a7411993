"""scripts/gpu-measure.sh: the commands a GPU session runs are ones our benchmarks accept.

The script needs CUDA to measure anything; here it lists its commands (``GPU_MEASURE_DRY``)
and each is handed to its module's own argument parser, which must accept it: a renamed or
misspelt option would otherwise be found only on a lent GPU, whose minutes are few."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Parsed(Exception):
    """Raised in place of running the benchmark once its arguments parsed."""


def dry_commands(out: Path) -> list[list[str]]:
    env = dict(os.environ, OUT=str(out), GPU_MEASURE_DRY="1")
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu-measure.sh")], env=env, check=True,
                   capture_output=True, text=True, timeout=60)
    return [shlex.split(line) for line in (out / "commands.txt").read_text().splitlines() if line.strip()]


def without_env(cmd: list[str]) -> list[str]:
    """A listed command less the environment it is run with (``NAME=value`` first)."""
    while cmd and "=" in cmd[0] and cmd[0].split("=")[0].isupper():
        cmd = cmd[1:]
    return cmd


@pytest.fixture
def parse_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every argument parser parses as usual, then raises ``Parsed`` instead of returning."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)


def test_every_command_parses(tmp_path: Path, parse_only: None) -> None:
    listed = dry_commands(tmp_path)
    # the band run is the p4 run on the band kernel: only its environment says so
    assert any(c[0] == "NSA_FLEX_WINDOW=0" and "band" in c for c in listed)
    # batch 1's decode in three launches a layer beside its one launch: only its environment says so
    assert any(c[0] == "NSA_DECODE_ONE_LAUNCH=0" and "bench.decode" in c for c in listed)
    commands = [without_env(c) for c in listed]
    modules = {"pytest", "bench.run", "bench.decode", "bench.decode_kernel", "bench.tiles",
               "bench.decode_roofline", "bench.trainer_overhead", "bench.inverted_index", "bench.targets"}
    assert {c[0] for c in commands} == modules
    assert any("--sel-positions" in c for c in commands) and any("--kernels" in c for c in commands)
    assert any("--train-only" in c for c in commands)  # the train step's rows, eager and graphed
    assert commands[0][0] == "pytest", "the kernels' GPU tests run before anything is timed"
    for cmd in commands:
        if cmd[0] == "pytest":  # the GPU tests: files that exist and hold tests marked gpu
            assert cmd[cmd.index("-m") + 1] == "gpu", cmd
            tests = [a.split("::") for a in cmd[1:] if a.endswith(".py") or ".py::" in a]
            assert tests and all("@pytest.mark.gpu" in (ROOT / t[0]).read_text() for t in tests), tests
            # a single test named by its node id: that test, marked gpu
            for t in (t for t in tests if len(t) == 2):
                src = (ROOT / t[0]).read_text()
                assert f"def {t[1]}(" in src and "@pytest.mark.gpu" in src.split(f"def {t[1]}(")[0][-200:], t
            continue
        module = importlib.import_module(cmd[0])
        with pytest.raises(Parsed):
            module.main(cmd[1:])
        # every output lands under OUT: nothing is written into the tree
        paths = [a for a in cmd[1:] if a.startswith("/")]
        assert all(Path(a).is_relative_to(tmp_path) for a in paths), cmd


def test_a_misspelt_option_is_caught(parse_only: None) -> None:
    """The check above can fail: the parser refuses an option bench.decode does not have."""
    with pytest.raises(SystemExit):
        importlib.import_module("bench.decode").main(["--contexts", "8192", "--kernals"])


def run_with(tmp_path: Path, fail: str) -> tuple[list[str], str]:
    """The script run for real with a stand-in for python that records each call and the
    ``NSA_DECODE_ONE_LAUNCH`` it had, and exits 124 (what ``timeout`` gives a hang) for the
    call whose arguments are ``fail``; every other call succeeds at once."""
    tmp_path.mkdir(exist_ok=True)
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "${NSA_DECODE_ONE_LAUNCH:--} $*" >> "$OUT/calls.txt"\n'
                    f'[ "$*" = {shlex.quote(fail)} ] && exit 124\nexit 0\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "NSA_DECODE_ONE_LAUNCH"}
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu-measure.sh")], check=True, capture_output=True,
                   timeout=120, env=dict(env, OUT=str(out), PYTHON=str(fake), GPU_MEASURE_S="100000"))
    calls = [c for c in (out / "calls.txt").read_text().splitlines() if " -m " in c]
    return calls, (out / "log.txt").read_text()


ONE = ("-m pytest -q -p no:cacheprovider -m gpu "
       "tests/ops/test_triton_decode.py::test_one_launch_on_gpu_step_after_step_and_from_a_graph")


def test_a_one_launch_that_fails_or_hangs_is_off_for_every_later_step(tmp_path: Path) -> None:
    """The one decode launch is checked alone first. Should it fail or hang on the GPU, every
    later step decodes in three launches a layer, its split cases leave the GPU tests and its
    batch-1 comparison is skipped: the budget is not spent on the same hang again."""
    calls, log = run_with(tmp_path, ONE)
    assert calls[0] == f"- {ONE}"
    assert all(c.startswith("0 ") for c in calls[1:]), calls
    gpu_tests = calls[1]
    assert "--deselect tests/ops/test_triton_decode.py::test_one_launch_on_gpu" in gpu_tests
    assert all(f"test_bf16_on_gpu_with_each_split[{s}]" in gpu_tests
               for s in ("one-launch", "one-launch-split", "one-launch-many"))
    assert "did not finish (rc=124): NSA_DECODE_ONE_LAUNCH=0 from here on" in log
    assert "SKIP decode-b1-launches" in log and not any("decode-b1-launches" in c for c in calls)
    # passing, it stays on: only the three-launch comparison turns it off
    calls, log = run_with(tmp_path / "passing", "")
    assert [c.split()[0] for c in calls].count("0") == 1 and "decode-b1-launches.json" in next(
        c for c in calls if c.startswith("0 "))
    assert "each_split[one-launch]" not in calls[1] and "SKIP" not in log
