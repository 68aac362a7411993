"""The attention-ops self-check and the run's choice of ops (nsa.ops.self_check, choose_ops).

On CPU the Triton kernels run in the interpreter (TRITON_INTERPRET=1, fp32), with device
"cpu" standing in for the GPU. A GPU-only failure (a kernel the compiler rejects, or one
that computes wrong numbers there) is forced by replacing one kernel object with a stand-in
that fails like that; an allocator that hands back memory holding the right answer, by
an ``empty_like`` that does. The only fakes here, for what this machine cannot have on
demand.
"""

from __future__ import annotations

import re

import pytest
import torch
import triton
from triton.compiler.errors import CompilationError

import nsa.ops as ops_pkg
import nsa.ops.triton as triton_ops
from nsa.ops import AttentionShape, choose_ops, get_ops, reference, self_check
from nsa.ops.self_check import triton_too_old
from nsa.ops.triton import band, glue, selected, topn
from nsa.ops.triton.tuning import Tunable

# smoke-cpu's NSA layout: small enough for the interpreter (~10 s per check)
SHAPE = AttentionShape(n_heads=2, n_kv_heads=1, head_dim=16, compress_block=16, compress_stride=8,
                       select_block=16, num_selected=3, num_initial=1, num_local=1, window=32)


class _RejectedByCompiler:
    """Stands in for a @triton.jit kernel that Triton refuses to compile on this GPU."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise CompilationError(None, None, "NameError('Cannot access global variable NEG')")
        return launch


class _WritesNothing:
    """Stands in for a kernel that launches but leaves its outputs unwritten (wrong numbers)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


class _OneProgramShort:
    """Stands in for a launch of the real kernel on a grid one program short along its
    first axis (a wrong grid): the last programs' rows are never written."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        return self.kernel[(grid[0] - 1, *grid[1:])]


def _replace_kernel(monkeypatch: pytest.MonkeyPatch, module, name: str, fake) -> None:
    """Put ``fake`` where the kernel's compiled function is: under the autotune wrapper of a
    tunable kernel (whose launch picks a config, then runs ``.fn``), else the kernel itself."""
    kernel = getattr(module, name)
    if isinstance(kernel, Tunable):
        monkeypatch.setattr(kernel, "fn", fake)
    else:
        monkeypatch.setattr(module, name, fake)


@pytest.fixture(autouse=True)
def _keep_resolved_ops():
    """choose_ops settles get_ops for the process: restore it after each test."""
    saved = dict(ops_pkg._RESOLVED)
    yield
    ops_pkg._RESOLVED.clear()
    ops_pkg._RESOLVED.update(saved)


def test_the_interpreted_kernels_pass_the_check() -> None:
    report = self_check("cpu", torch.float32, SHAPE)
    assert report.ok, report.reason()
    assert report.checked == ["compressed_attention_and_scores", "select_blocks",
                              "compressed_attention_and_selection", "selected_attention", "window_attention",
                              "gated_combine", "apply_rope"]


def test_a_dense_models_check_is_ropes_alone_and_fails_on_a_broken_rope_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense model runs one kernel (RoPE): its check runs that one, whatever the others do,
    and a bad one sends ``auto`` on a GPU to torch's formula (the CPU standing in)."""
    _replace_kernel(monkeypatch, band, "_band_fwd", _RejectedByCompiler())  # not a dense model's
    report = self_check("cpu", torch.float32, SHAPE, rope_only=True)
    assert report.ok and report.checked == ["apply_rope"], report.reason()
    _replace_kernel(monkeypatch, glue, "_rope_kernel", _WritesNothing())
    assert self_check("cpu", torch.float32, SHAPE, rope_only=True).failures == [
        "apply_rope: out not written, d0 not written"]
    rope_check = lambda device, dtype, shape: self_check("cpu", dtype, shape, rope_only=True)  # noqa: E731
    choice = choose_ops("auto", "cuda", torch.float32, SHAPE, check=rope_check)
    assert choice.backend == "reference" and "apply_rope" in (choice.fallback_reason or "")
    assert get_ops("auto", "cuda") is reference


def test_the_check_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    self_check("cpu", torch.float32, SHAPE, ops=reference)
    assert torch.equal(torch.rand(3), expected)  # the model's initial weights do not depend on the check


def test_a_kernel_the_compiler_rejects_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    _replace_kernel(monkeypatch, band, "_band_fwd", _RejectedByCompiler())
    report = self_check("cpu", torch.float32, SHAPE)
    assert not report.ok
    failed = {f.split(":")[0] for f in report.failures}
    # all three run the band forward
    assert failed == {"compressed_attention_and_scores", "compressed_attention_and_selection",
                      "window_attention"}
    assert "CompilationError" in report.reason() and "NEG" in report.reason()


# The backward kernels do arithmetic on the poisoned (signalling NaN) output a forward
# stand-in left unwritten; the interpreter's numpy flags that as an invalid operation.
_NAN_ARITHMETIC = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@_NAN_ARITHMETIC
def test_a_kernel_with_wrong_numbers_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unwritten output is named; the gradients the backward kernels computed from it
    (and from its unwritten LSE) are NaN, but written."""
    _replace_kernel(monkeypatch, selected, "_sel_fwd", _WritesNothing())
    report = self_check("cpu", torch.float32, SHAPE)
    assert report.failures == ["selected_attention: out not written, d0 is not finite, d1 is not finite, "
                               "d2 is not finite"]


@_NAN_ARITHMETIC
def test_a_kernel_that_writes_nothing_fails_on_memory_that_held_the_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocator may hand the kernel's output buffer memory that held the reference's
    result a moment before (freed, then reused). Stands in for that allocator: every buffer
    of the reference output's shape comes back holding that output."""
    answers: dict[tuple[torch.Size, torch.dtype], torch.Tensor] = {}
    real_op, real_empty_like = reference.selected_attention, torch.empty_like

    def remembered(*args, **kwargs) -> torch.Tensor:
        out = real_op(*args, **kwargs)
        answers[out.shape, out.dtype] = out.detach().clone()
        return out

    def stale(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        buf = real_empty_like(x, *args, **kwargs)
        held = answers.get((buf.shape, buf.dtype))
        return buf if held is None else buf.copy_(held)

    monkeypatch.setattr(reference, "selected_attention", remembered)
    monkeypatch.setattr(torch, "empty_like", stale)
    _replace_kernel(monkeypatch, selected, "_sel_fwd", _WritesNothing())
    report = self_check("cpu", torch.float32, SHAPE)
    assert answers  # the stand-in did hand out the answer
    assert report.failures == ["selected_attention: out not written, d0 is not finite, d1 is not finite, "
                               "d2 is not finite"]


@_NAN_ARITHMETIC
def test_a_kernel_that_writes_part_of_its_output_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report counts the unwritten elements: whole positions of [1, T, H, D]."""
    _replace_kernel(monkeypatch, selected, "_sel_fwd", _OneProgramShort(selected._sel_fwd.fn))
    report = self_check("cpu", torch.float32, SHAPE)
    assert len(report.failures) == 1
    found = re.fullmatch(r"selected_attention: out not written at (\d+) of (\d+) elements, d0 is not finite, "
                         r"d1 is not finite, d2 is not finite", report.failures[0])
    assert found, report.failures[0]
    unwritten, total = int(found[1]), int(found[2])
    row = SHAPE.n_heads * SHAPE.head_dim
    assert 0 < unwritten < total and unwritten % row == 0 and total % row == 0


@pytest.mark.parametrize("kernel, failure", [
    ("_combine_fwd", "gated_combine: out not written"),  # its backward is a kernel of its own
    ("_rope_kernel", "apply_rope: out not written, d0 not written"),  # one kernel both ways
])
def test_a_glue_kernel_with_wrong_numbers_fails_the_check(monkeypatch: pytest.MonkeyPatch, kernel: str,
                                                          failure: str) -> None:
    """The model runs the glue kernels too: a bad one must send the run to the reference."""
    _replace_kernel(monkeypatch, glue, kernel, _WritesNothing())
    report = self_check("cpu", torch.float32, SHAPE)
    assert report.failures == [failure]


@pytest.mark.parametrize("kernel, failures", [
    ("_select_kernel", ["select_blocks: idx not written"]),
    ("_scores_topn", ["compressed_attention_and_scores: extra not written",  # the scores
                      "compressed_attention_and_selection: idx not written"]),  # the fused choice
])
def test_a_selection_kernel_that_writes_nothing_fails_the_check(monkeypatch: pytest.MonkeyPatch, kernel: str,
                                                                failures: list[str]) -> None:
    """Block indices are poisoned too (int64 min): an unwritten choice is named as such."""
    _replace_kernel(monkeypatch, topn, kernel, _WritesNothing())
    report = self_check("cpu", torch.float32, SHAPE)
    assert report.failures == failures


def test_a_wrong_block_choice_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused scores + top-n kernel is checked by its choice, not only its output."""
    real = triton_ops.selection_from_lse

    def drops_the_first_block(*args, **kwargs):  # stands in for a top-n that loses a block
        idx = real(*args, **kwargs)
        return torch.cat([idx[..., 1:], torch.full_like(idx[..., :1], -1)], -1)

    monkeypatch.setattr(triton_ops, "selection_from_lse", drops_the_first_block)
    report = self_check("cpu", torch.float32, SHAPE)
    assert [f.split(":")[0] for f in report.failures] == ["compressed_attention_and_selection"]
    assert "the reference chose" in report.failures[0]


def test_auto_on_a_gpu_falls_back_to_the_reference_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` on CUDA with a failing check: the real check, run on the CPU standing in."""
    _replace_kernel(monkeypatch, band, "_band_fwd", _RejectedByCompiler())
    cpu_check = lambda device, dtype, shape: self_check("cpu", dtype, shape)  # noqa: E731
    choice = choose_ops("auto", "cuda", torch.float32, SHAPE, check=cpu_check)
    assert choice.backend == "reference" and choice.requested == "auto"
    assert choice.fallback_reason and "Triton self-check failed" in choice.fallback_reason
    assert "CompilationError" in choice.fallback_reason
    assert get_ops("auto", "cuda") is reference  # what the model's forward gets from now on
    rec = choice.record()
    assert rec.backend == "reference" and rec.self_check is not None and rec.self_check.ok is False
    assert rec.self_check.failures == choice.check.failures


def test_auto_on_a_gpu_uses_the_kernels_when_the_check_passes() -> None:
    cpu_check = lambda device, dtype, shape: self_check("cpu", dtype, shape)  # noqa: E731
    choice = choose_ops("auto", "cuda", torch.float32, SHAPE, check=cpu_check)
    assert choice.backend == "triton" and choice.fallback_reason is None and choice.check.ok
    assert get_ops("auto", "cuda") is triton_ops


@_NAN_ARITHMETIC
def test_triton_fails_loudly_instead_of_falling_back(monkeypatch: pytest.MonkeyPatch) -> None:
    _replace_kernel(monkeypatch, selected, "_sel_fwd", _WritesNothing())
    with pytest.raises(RuntimeError, match="failed their self-check.*selected_attention"):
        choose_ops("triton", "cpu", torch.float32, SHAPE)


def test_reference_and_auto_off_gpu_run_no_check() -> None:
    def no_check(*args):
        raise AssertionError("no check expected")

    for backend in ("reference", "auto"):
        choice = choose_ops(backend, "cpu", torch.float32, SHAPE, check=no_check)
        assert choice.backend == "reference" and choice.fallback_reason is None and choice.check is None
        assert get_ops(backend, "cpu") is reference


@pytest.mark.parametrize("version", ["3.1.0", "3.5.1", "3.3.0+git1a2b3c", "3.0.0", "2.3.1"])
def test_a_triton_older_than_the_range_is_refused_with_its_version(version: str) -> None:
    reason = triton_too_old(version)
    assert reason is not None and f"Triton {version} is older than 3.6" in reason
    assert "compiler error" in reason


@pytest.mark.parametrize("version", ["3.6.0", "3.7.1", "3.9.0", "3.10.0", "3.6.0+gitabc", "4.0.0"])
def test_a_triton_in_the_range_is_accepted(version: str) -> None:
    assert triton_too_old(version) is None


def test_auto_with_an_old_triton_falls_back_naming_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """No kernel is even tried: the reason is the version, not a compile error."""
    monkeypatch.setattr(triton, "__version__", "3.1.0")
    cpu_check = lambda device, dtype, shape: self_check("cpu", dtype, shape)  # noqa: E731
    choice = choose_ops("auto", "cuda", torch.float32, SHAPE, check=cpu_check)
    assert choice.backend == "reference" and get_ops("auto", "cuda") is reference
    assert choice.check is not None and choice.check.checked == []
    assert "Triton 3.1.0 is older than 3.6" in choice.fallback_reason
