"""Shared test setup. TRITON_INTERPRET must be set before any @triton.jit runs."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("PYTHONUNBUFFERED", "1")


import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

SMOKE_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "smoke-cpu.yaml")
OPS_TESTS = Path(__file__).resolve().parent / "ops"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The kernels' ``gpu`` tests (tests/ops) check the compiled kernels: under the
    interpreter (this conftest's default) they would run the Python ones on copies of the
    tensors and prove nothing about the GPU, so they skip and say how to run them."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    skip = pytest.mark.skipif(True, reason="a gpu test checks the compiled kernels: "
                              "run it with TRITON_INTERPRET=0")
    for item in items:
        if item.get_closest_marker("gpu") is not None and OPS_TESTS in item.path.parents:
            item.add_marker(skip, append=False)  # before the test's own skipif: this reason shows


@pytest.fixture(scope="session")
def trained_nsa_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(runs root, run id) of a finished 6-step NSA run named ``talk`` (smoke-cpu: seq_len 64),
    checkpoints at steps 3 and 6, trained once through the CLI and the local agent for every
    test that samples or evaluates a trained model. Those tests must not change it (copy it)."""

    def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                              timeout=timeout)

    root = tmp_path_factory.mktemp("trained-runs")
    r = cli("launch", "local", "--config", SMOKE_CONFIG, "--nproc", "1", "--name", "talk", "--json",
            "--runs-root", str(root), "--set", "model.attention.kind=nsa", "train.eval_every=1000")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    logs = cli("logs", "local", rid, "-f", "--runs-root", str(root), timeout=300)  # returns at the end
    assert logs.returncode == 0, logs.stderr
    steps = sorted(p.name for p in (root / rid / "checkpoints").glob("step-*"))
    assert steps == ["step-3", "step-6"], logs.stdout
    return root, rid
