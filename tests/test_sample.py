"""``nsa-tui sample``: a real tiny NSA run trained by torchrun, then text from its checkpoints
through the real local agent and its worker process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_tui.cli import main as cli
from nsa_tui.cli.sample import EXIT_NO_CHECKPOINT

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke-cpu.yaml")


def nsa_tui(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_same_seed_same_text_and_the_tokens_of_generate_in_process(trained_nsa_run: tuple[Path, str]) -> None:
    root, rid = trained_nsa_run
    args = ["sample", "local", rid, "--runs-root", str(root), "--seed", "1", "--json", "--prompt", "ab",
            "--max-new-tokens", "40", "--top-k", "50"]
    first, again = nsa_tui(*args), nsa_tui(*args)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert (a["text"], a["tokens"]) == (b["text"], b["tokens"])
    assert a["checkpoint"] == "step-6" and a["device"] == "cpu" and a["seed"] == 1 and a["prompt"] == "ab"
    assert a["prompt_tokens"] == [256, ord("a"), ord("b")]  # end-of-text, then the prompt's bytes
    assert len(a["tokens"]) == 40 or a["tokens"][-1] == 256

    import torch

    from nsa.infer import generate
    from nsa.infer.load import load_model

    torch.manual_seed(12345)  # the sample must not depend on the global RNG
    model, cfg, _meta = load_model(root / rid / "checkpoints" / "step-6")
    assert cfg.model.attention.kind == "nsa"
    want = generate(model, [a["prompt_tokens"]], 40, temperature=1.0, top_k=50, seed=1, eos=256)[0]
    assert a["tokens"] == want
    assert a["text"] == bytes(t for t in want if t < 256).decode("utf-8", "replace")

    seed2 = json.loads(nsa_tui(*[x if x != "1" else "2" for x in args]).stdout)
    assert seed2["tokens"] != a["tokens"]  # the seed matters


@pytest.mark.slow
def test_text_streams_and_an_older_checkpoint_and_greedy(trained_nsa_run: tuple[Path, str]) -> None:
    root, rid = trained_nsa_run
    r = nsa_tui("sample", "local", "talk", "--runs-root", str(root), "--checkpoint", "3",
                "--temperature", "0", "--prompt", "hi", "--max-new-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert done["checkpoint"] == "step-3" and done["step"] == 3

    import torch

    from nsa.infer import generate
    from nsa.infer.load import load_model

    model, _cfg, _meta = load_model(root / rid / "checkpoints" / "step-3")
    assert done["tokens"] == generate(model, [done["prompt_tokens"]], 12, temperature=0.0, eos=256)[0]
    model6, _cfg, _meta = load_model(root / rid / "checkpoints" / "step-6")
    six = model6.state_dict()
    assert any(not torch.equal(v, six[k]) for k, v in model.state_dict().items())  # step 3 was loaded
    text = nsa_tui("sample", "local", rid, "--runs-root", str(root), "--checkpoint", "step-3",
                   "--temperature", "0", "--prompt", "hi", "--max-new-tokens", "12")
    assert text.returncode == 0, text.stderr
    assert text.stdout == "hi" + done["text"] + "\n"  # the prompt, then the answer as it came
    assert "step-3 on cpu" in text.stderr


@pytest.mark.slow
def test_unknown_step_and_no_checkpoint_name_the_steps(trained_nsa_run: tuple[Path, str],
                                                       tmp_path: Path) -> None:
    root, rid = trained_nsa_run
    r = nsa_tui("sample", "local", rid, "--runs-root", str(root), "--checkpoint", "5")
    assert r.returncode == EXIT_NO_CHECKPOINT
    assert "no checkpoint at step 5" in r.stderr and "steps 3, 6" in r.stderr
    r = nsa_tui("sample", "local", rid, "--runs-root", str(root), "--checkpoint", "5", "--json")
    assert r.returncode == EXIT_NO_CHECKPOINT
    assert json.loads(r.stdout)["error"]["code"] == "no_such_checkpoint"


def test_a_run_without_a_checkpoint_and_bad_arguments(tmp_path: Path) -> None:
    rid = "20260101-000000-fresh-0001"
    (tmp_path / rid).mkdir(mode=0o700)
    (tmp_path / rid / "run.json").write_text(json.dumps({"run_id": rid, "status": "running"}))
    root = ["--runs-root", str(tmp_path)]
    r = nsa_tui("sample", "local", rid, *root, "--json")
    assert r.returncode == EXIT_NO_CHECKPOINT
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "no_checkpoint" and "no complete checkpoint" in err["message"]
    assert nsa_tui("sample", "local", "20990101-000000-none-0000", *root).returncode == cli.EXIT_NO_RUN
    r = nsa_tui("sample", "local", rid, *root, "--top-p", "1.5")
    assert r.returncode == cli.EXIT_USAGE and "--top-p" in r.stderr
    r = nsa_tui("sample", "local", rid, *root, "--prompt-file", str(tmp_path / "absent.txt"))
    assert r.returncode == cli.EXIT_USAGE and "absent.txt" in r.stderr
    r = nsa_tui("sample", "local", rid, *root, "--prompt", "a", "--prompt-file", "x")
    assert r.returncode == cli.EXIT_USAGE


@pytest.mark.slow
def test_a_damaged_checkpoint_fails_its_sample_not_the_agent(trained_nsa_run: tuple[Path, str],
                                                             tmp_path: Path) -> None:
    """The worker fails (a shard cut short); the same agent connection goes on serving."""
    import asyncio
    import shutil

    from nsa_tui.hosts.client import AgentError, HostClient

    root, rid = trained_nsa_run
    shutil.copytree(root / rid, tmp_path / rid)
    shard = next((tmp_path / rid / "checkpoints" / "step-6").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:64])

    async def go() -> tuple[str, str, int]:
        c = HostClient("local", runs_root=str(tmp_path))
        await c.start()
        try:
            with pytest.raises(AgentError) as bad:
                async for _ev in c.sample(rid, seed=1, max_new_tokens=5):
                    pass
            kinds = [ev.kind async for ev in c.sample(rid, checkpoint="3", seed=1, max_new_tokens=5)]
            assert kinds[0] == "sample_start" and kinds[-1] == "sample_done"
            return bad.value.code, bad.value.message, len(await c.runs())
        finally:
            await c.close()

    code, message, runs = asyncio.run(asyncio.wait_for(go(), 120))
    assert code == "bad_checkpoint" and "step-6" in message and runs == 1

