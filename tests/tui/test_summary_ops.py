"""The run summary names the attention ops a run trains on, and a fallback with its reason."""

from __future__ import annotations

import io

from rich.console import Console

from nsa.contract import RunInfo, RunStatus, RunView
from nsa.contract.io import convert
from nsa_tui.app.state import RunState
from nsa_tui.app.widgets.summary import summary_table


def _text(record: dict) -> str:
    """The summary of a run whose run.json holds ``record`` (validated as the agent would)."""
    info = convert({"run_id": "r", "name": "r", **record}, RunInfo)
    view = RunView(run_id="r", dir="/r", name="r", status=RunStatus.RUNNING, info=info)
    console = Console(width=160, record=True, file=io.StringIO(), color_system=None)
    console.print(summary_table(RunState(host="local", run_id="r", view=view)))
    return console.export_text()


def _attn_line(record: dict) -> str:
    return next(line for line in _text(record).splitlines() if line.strip().startswith("attn ops"))


def test_a_fallback_to_the_reference_is_shown_with_its_reason() -> None:
    reason = ("Triton self-check failed on cuda:0 (bfloat16): selected_attention: CompilationError: "
              "at 19:24: NameError('Cannot access global variable NEG')")
    ops = {"backend": "reference", "requested": "auto", "fallback_reason": reason,
           "self_check": {"ok": False, "device": "cuda:0", "dtype": "bfloat16"}}
    line = _attn_line({"attention_ops": ops})
    assert "reference" in line and "fallback from auto" in line and "far slower" in line
    assert "selected_attention" in _text({"attention_ops": {"backend": "reference", "requested": "auto",
                                                            "fallback_reason": reason}})


def test_the_kernels_after_a_passing_check() -> None:
    line = _attn_line({"attention_ops": {"backend": "triton", "requested": "auto", "fallback_reason": None,
                                         "self_check": {"ok": True, "device": "cuda:0", "dtype": "bfloat16",
                                                        "seconds": 12.5}}})
    assert "triton" in line and "self-check ok on cuda:0" in line and "fallback" not in line
    assert "FlexAttention" not in line


def test_the_window_branch_on_flexattention_is_named() -> None:
    line = _attn_line({"attention_ops": {"backend": "triton", "requested": "auto", "fallback_reason": None,
                                         "self_check": {"ok": True, "device": "cuda:0", "dtype": "bfloat16"},
                                         "window": "flexattention", "window_reason": None}})
    assert "self-check ok on cuda:0" in line and "window: FlexAttention" in line


def test_a_dense_run_names_its_rope_kernels_check() -> None:
    check = {"ok": True, "device": "cuda:0", "dtype": "bfloat16", "ops": ["apply_rope"]}
    line = _attn_line({"attention_ops": {"backend": "sdpa", "requested": "sdpa", "self_check": check}})
    assert "sdpa" in line and "RoPE kernel checked on cuda:0" in line and "fallback" not in line
    failed = {**check, "ok": False, "failures": ["apply_rope: out not written"]}
    line = _attn_line({"attention_ops": {"backend": "sdpa", "requested": "sdpa", "self_check": failed}})
    assert "RoPE on torch's formula" in line and "apply_rope: out not written" in line
    assert _attn_line({"attention_ops": {"backend": "sdpa", "requested": "sdpa"}}).split()[-1] == "sdpa"


def test_runs_of_older_trainers_have_no_ops_row() -> None:
    assert "attn ops" not in _text({"status": "running"})


def _steps_line(record: dict) -> str:
    return next(line for line in _text(record).splitlines() if line.strip().startswith("steps"))


def test_train_cuda_graph_says_whether_the_steps_replay_a_graph_and_why_not() -> None:
    assert "replayed from a CUDA graph" in _steps_line(
        {"cuda_graph": {"replayed": True, "reason": "one CUDA graph per micro-step (checked ...)"}})
    line = _steps_line({"cuda_graph": {"replayed": False, "reason": "2 processes: DDP's and FSDP's hooks"}})
    assert "eager" in line and "2 processes" in line and "replayed" not in line
    assert "steps" not in [ln.strip().split(" ")[0] for ln in _text({"status": "running"}).splitlines()]
