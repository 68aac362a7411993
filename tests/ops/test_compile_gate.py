"""The compile gate (bench/compile_check.py): every kernel through Triton's real compiler.

The suite runs under TRITON_INTERPRET=1, under which even ``triton.language``'s own jit
helpers (``tl.sum``) are interpreter functions that the compiler cannot use: every check
here runs the gate's code in a subprocess without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.compiled import compiled_env

ROOT = Path(__file__).resolve().parents[2]

# Throwaway kernels, written to a module in a temporary directory.
PROBE_KERNELS = textwrap.dedent('''
    import triton
    import triton.language as tl

    SCALE = 2.0  # a plain module global: the compiler must refuse it inside a kernel
    SCALE_CONST = tl.constexpr(2.0)  # the accepted form


    @triton.jit
    def scale_by_global(X, N, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < N)
        tl.store(X + offs, x * SCALE, mask=offs < N)


    @triton.jit
    def scale_by_constexpr(X, N, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < N)
        tl.store(X + offs, x * SCALE_CONST, mask=offs < N)


    @triton.jit
    def hold_a_big_tile(X, N, BLOCK: tl.constexpr):
        """BLOCK x BLOCK fp32 values live at once in one warp: 512 registers per thread."""
        offs = tl.arange(0, BLOCK)
        ptrs = X + offs[:, None] * BLOCK + offs[None, :]
        x = tl.load(ptrs)
        tl.store(ptrs, x * tl.sum(x, 1)[:, None] + tl.sum(x, 0)[None, :])
''')

# Captures one launch of each probe kernel and compiles it with the gate's own functions.
PROBE_DRIVER = textwrap.dedent('''
    import sys
    import torch
    import bench.compile_check as cc
    import bench.compile_launches as cl
    import gate_probe_kernels as k

    x = torch.empty(128 * 128, device="meta", dtype=torch.float32)
    for name, warps in (("scale_by_global", 4), ("scale_by_constexpr", 4), ("hold_a_big_tile", 1)):
        with cl.capture(lambda: "probe") as launches:
            getattr(k, name)[(1,)](x, 100, BLOCK=128, num_warps=warps)
        for arch in (80, 90):
            res = cc.compile_launch(launches[0], arch)
            print(name, res.failed, cc.format_line(launches[0].name, arch, res, ["probe"]))
''')

# Compiles one probe kernel for both archs with the gate's function, twice; prints whether
# each compile came from Triton's cache (triton.compile keeps none in memory: only its
# on-disk cache, which every process with the same TRITON_CACHE_DIR shares).
CACHE_DRIVER = textwrap.dedent('''
    import torch
    from triton import knobs
    import bench.compile_check as cc
    import bench.compile_launches as cl
    import gate_probe_kernels as k

    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    x = torch.empty(128, device="meta", dtype=torch.float32)
    with cl.capture(lambda: "probe") as launches:
        k.scale_by_constexpr[(1,)](x, 100, BLOCK=128)
    for _ in range(2):
        for arch in (80, 90):
            assert not cc.compile_launch(launches[0], arch).failed
    print(*hits)
''')


@pytest.fixture(scope="module")
def probe_lines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """``{kernel: [its line for sm_80, for sm_90]}`` as the gate prints them."""
    tmp = tmp_path_factory.mktemp("probe")
    (tmp / "gate_probe_kernels.py").write_text(PROBE_KERNELS)
    out = subprocess.run([sys.executable, "-c", PROBE_DRIVER], cwd=ROOT, env=compiled_env(tmp),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        name, failed, text = line.split(" ", 2)
        assert (failed == "True") == text.startswith("FAIL"), line
        lines.setdefault(name, []).append(text)
    return lines


def test_a_kernel_reading_a_module_global_is_a_failure(probe_lines: dict[str, list[str]]) -> None:
    for arch, line in zip((80, 90), probe_lines["scale_by_global"]):
        assert line.startswith(f"FAIL sm_{arch} scale_by_global"), line
        assert "Cannot access global variable SCALE" in line
        assert "gate_probe_kernels.py:" in line  # names the kernel's file and line


def test_the_same_kernel_with_a_constexpr_compiles(probe_lines: dict[str, list[str]]) -> None:
    for arch, line in zip((80, 90), probe_lines["scale_by_constexpr"]):
        assert line.startswith(f"OK   sm_{arch} scale_by_constexpr"), line
        assert "spill 0/0 B" in line


def test_a_spilling_kernel_is_a_failure(probe_lines: dict[str, list[str]]) -> None:
    for line in probe_lines["hold_a_big_tile"]:
        assert line.startswith("FAIL") and "<- spills" in line, line


def test_the_gate_compiles_through_tritons_disk_cache(tmp_path: Path) -> None:
    """The gate's compiles land in Triton's on-disk cache (``TRITON_CACHE_DIR``) and are
    found there, so every gate run sharing the machine's cache (the suite's, one by hand,
    a CI step) pays for one cold compile per CI run, not one each."""
    (tmp_path / "gate_probe_kernels.py").write_text(PROBE_KERNELS)
    cache = tmp_path / "triton-cache"
    env = compiled_env(tmp_path)
    env["TRITON_CACHE_DIR"] = str(cache)
    out = subprocess.run([sys.executable, "-c", CACHE_DRIVER], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == ["False", "False", "True", "True"]  # compiled, then found
    assert any(cache.iterdir())


def test_every_kernel_is_covered_and_list_mode_needs_no_compiler() -> None:
    env = compiled_env()
    env["TRITON_INTERPRET"] = "1"  # the gate must drop it, and say so
    out = subprocess.run([sys.executable, "-m", "bench.compile_check", "--list"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ignoring TRITON_INTERPRET" in out.stdout
    for kernel in ("_band_fwd", "_band_bwd_dq", "_band_bwd_dkdv", "_scores_topn", "_select_kernel",
                   "_sel_fwd", "_sel_bwd_dq", "_sel_bwd_dkdv", "_sel_bwd_reduce", "_delta_kernel",
                   "_combine_fwd", "_combine_bwd", "_rope_kernel", "_decode_partials", "_decode_scores",
                   "_decode_selected", "_decode_combine"):
        assert f"LIST sm_80 {kernel} " in out.stdout and f"LIST sm_90 {kernel} " in out.stdout
    assert "not covered" not in out.stdout
    # an autotuned kernel is listed once per config its prune keeps: the default and the others
    for config in ("(default: BM=64 BN=32 warps 4)", "(alt: BM=128 BN=64 warps 8)"):
        assert f"LIST sm_90 {'_band_fwd':16s} {config} [nsa-125m window fwd" in out.stdout, config


def test_a_kernel_no_op_launches_fails_the_gate(tmp_path: Path) -> None:
    (tmp_path / "orphan_kernels.py").write_text(textwrap.dedent('''
        import triton
        import triton.language as tl


        @triton.jit
        def _orphan(X, BLOCK: tl.constexpr):
            tl.store(X + tl.arange(0, BLOCK), 0.0)
    '''))
    cmd = [sys.executable, "-m", "bench.compile_check", "--list", "--extra-module", "orphan_kernels"]
    out = subprocess.run(cmd, cwd=ROOT, env=compiled_env(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "kernel orphan_kernels._orphan not covered" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_gate_passes_for_sm80_and_sm90() -> None:
    """The whole gate, as CI runs it: every kernel x shape compiles with no spill. When the
    installed Triton's committed record holds exactly these compiles (bench/compile_records.py,
    ``reusable_record``) it is the verdict and nothing is compiled; otherwise (a kernel, a
    config's shapes or Triton changed) everything is. Cold (710 compiles with every autotune
    config) that took ~30 min on 2 shared cores at load 6-8, so it has its own 40-minute limit
    instead of the suite's 10."""
    out = subprocess.run([sys.executable, "-m", "bench.compile_check", "--reuse-record"], cwd=ROOT,
                         env=compiled_env(), capture_output=True, text=True, timeout=2350)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "compile_check: passed" in out.stdout
    assert "FAIL" not in out.stdout


def test_a_compiler_that_aborts_is_a_failed_compile_not_a_dead_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton 3.1 fails a C++ assertion (SIGABRT) on some sm_90 layouts: the compile runs in
    a child of its own, so the gate reports it and goes on."""
    import bench.compile_check as cc

    def abort(launch: object, capability: int) -> None:
        os.write(2, b"python: LinearLayoutConversions.cpp:377: Assertion `n == 16' failed.\n")  # as C++ does
        os.abort()

    monkeypatch.setattr(cc, "compile_launch", abort)
    res = cc.compile_isolated(None, 90)
    assert res.failed and res.error.startswith("compiler process killed by SIGABRT")
    assert "Assertion `n == 16' failed" in res.error
    assert cc.format_line("_k", 90, res, ["case"]).startswith("FAIL sm_90 _k")


def test_a_compiler_that_never_finishes_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton 3.1 never finished some sm_90 compiles: past the timeout the child is killed and
    the compile fails saying so; a compile within it still returns its result."""
    import time as _time

    import bench.compile_check as cc

    def hang(launch: object, capability: int) -> None:
        os.write(2, b"still in make_ttgir\n")
        _time.sleep(3600)

    monkeypatch.setattr(cc, "compile_launch", hang)
    start = _time.monotonic()
    res = cc.compile_isolated(None, 90, timeout_s=1.0)
    assert _time.monotonic() - start < 60
    assert res.failed, res
    assert res.error.startswith("compiler process killed after 1 s without finishing"), res.error
    monkeypatch.setattr(cc, "compile_launch", lambda launch, capability: cc.Result(registers=7))
    ok = cc.compile_isolated(None, 90, timeout_s=30.0)
    assert not ok.failed and ok.registers == 7


def test_a_triton_below_the_floor_gets_less_time_per_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its record only shows how it fails: a compile past two minutes is failed there, where
    a supported Triton gets the full limit (a loaded machine's slow compile is not a failure)."""
    import triton

    import bench.compile_check as cc

    monkeypatch.setattr(triton, "__version__", "3.1.0")
    assert cc.compile_timeout() == cc.OLD_TRITON_TIMEOUT_S < cc.COMPILE_TIMEOUT_S
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert cc.compile_timeout() == cc.COMPILE_TIMEOUT_S
