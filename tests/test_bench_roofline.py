"""bench.roofline and its launch model, bench.roofline_launches: the launch list against the
wrappers' real launches, its dot FLOPs against what the interpreter executes (program by
program), its useful FLOPs against nsa.stats."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import triton.runtime.interpreter as interp
from triton.runtime.jit import JITFunction

import nsa.ops.triton as T
from bench import roofline as rl
from bench import roofline_launches as rll
from bench.core import NSA, attention_inputs, nsa_attention
from nsa.config import load_config
from nsa.ops.triton import band, tuning
from nsa.stats import attention_flops_per_token
from tests.compiled import run_compiled

ROOT = Path(__file__).resolve().parents[1]
SMS = 132


@contextlib.contextmanager
def observed(execute: bool) -> Iterator[tuple[list[tuple[str, tuple[int, ...], int]], dict, dict]]:
    """Every kernel launch (name, grid, warps) inside the block, and with ``execute`` the dot
    FLOPs each program runs in the interpreter (keyed by launch number and program id) and
    the rows (M) of each launch's dots; without it nothing runs (meta tensors). The
    compressed dK/dV split sees 132 SMs, the prunes an sm_90 GPU (the roofline's devices)."""
    launches: list[tuple[str, tuple[int, ...], int]] = []
    flops: dict[tuple[int, tuple[int, int, int]], int] = {}
    rows: dict[int, set[int]] = {}
    runs = {cls: cls.run for cls in (interp.InterpretedFunction, JITFunction)}
    dot = interp.InterpreterBuilder.create_dot

    def make_run(cls: Any) -> Any:
        def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            meta = dict(zip(self.arg_names, args), **kwargs)
            g = tuple(grid(meta) if callable(grid) else grid)
            launches.append((self.fn.__name__, g, kwargs.get("num_warps", 4)))
            if execute:
                return runs[cls](self, *args, grid=grid, warmup=warmup, **kwargs)
            return None
        return run

    def count(self: Any, a: Any, b: Any, d: Any, *rest: Any) -> Any:
        m, k = a.data.shape[-2:]
        key = (len(launches) - 1, self.grid_idx)
        flops[key] = flops.get(key, 0) + 2 * m * k * b.data.shape[-1]
        rows.setdefault(key[0], set()).add(m)
        return dot(self, a, b, d, *rest)

    saved_sm = T._sm_count
    T._sm_count = lambda device: SMS
    for cls in runs:
        cls.run = make_run(cls)
    interp.InterpreterBuilder.create_dot = count
    try:
        with tuning.assumed_capability(rll.CAPABILITY):
            yield launches, flops, rows
    finally:
        for cls, run in runs.items():
            cls.run = run
        interp.InterpreterBuilder.create_dot = dot
        T._sm_count = saved_sm


def per_program(flops: dict, i: int, grid: tuple[int, ...]) -> np.ndarray:
    """Launch i's dot FLOPs per program, in launch order (program_id(0) fastest)."""
    gx = grid[0]
    gy = grid[1] if len(grid) > 1 else 1
    out = np.zeros(gx * gy)
    for (li, (x, y, _)), f in flops.items():
        if li == i:
            out[y * gx + x] += f
    return out


def kernels(launches: list[rll.Launch]) -> list[rll.Launch]:
    return [la for la in launches if la.grid]


@pytest.mark.parametrize("layout,t,b", [("nsa-125m", 2048, 32), ("nsa-125m", 16384, 4),
                                        ("nsa-125m", 65536, 1), ("paper", 65536, 1), ("h16-g4", 1000, 3),
                                        ("nsa-125m", 20, 2)])
def test_grids_and_warps_are_the_launches_the_wrappers_make(layout: str, t: int, b: int) -> None:
    H, G, D = {**rl.LAYOUTS, **rl.EXTRA_LAYOUTS}[layout]
    xs = attention_inputs("nsa", b, t, H, G, D, "meta")
    q, kc, vc, ks, vs, kw, vw, g = (x.requires_grad_() for x in xs)
    with observed(execute=False) as (launches, _, _):
        out = nsa_attention(T, q, kc, vc, ks, vs, kw, vw, g)
        out.backward(torch.empty_like(out))
    model = kernels(rll.nsa_launches(rll.Shape(b, t, H, G, D), SMS))
    predicted = [(la.kernel, la.grid, la.warps) for la in model]
    assert launches == predicted


def test_every_program_runs_the_dot_flops_predicted() -> None:
    """The whole NSA fwd+bwd in the interpreter at a small shape (split compressed dK/dV,
    the scores kernel's weights dot, chunked selected dK/dV), with the selection it made."""
    s = rll.Shape(B=1, T=64, H=2, G=1, D=16, block=8, stride=4, select_block=8, n=3, n_init=1, n_local=2,
                  window=24)
    torch.manual_seed(0)
    q = torch.randn(s.B, s.T, s.H, s.D, requires_grad=True)
    kc, vc = (torch.randn(s.B, s.nc, s.G, s.D, requires_grad=True) for _ in range(2))
    ks, vs, kw, vw = (torch.randn(s.B, s.T, s.G, s.D, requires_grad=True) for _ in range(4))
    gates = torch.rand(s.B, s.T, s.H, 3, requires_grad=True)
    with observed(execute=True) as (launches, flops, rows):
        o_cmp, idx = T.compressed_attention_and_selection(q, kc, vc, s.block, s.stride, s.select_block, s.G,
                                                          s.n, s.n_init, s.n_local)
        out = T.gated_combine(gates, o_cmp, T.selected_attention(q, ks, vs, idx, s.select_block),
                              T.window_attention(q, kw, vw, s.window))
        out.backward(torch.randn_like(out))
    positions = rll.selected._sizes(s.hpg, s.D, s.select_block, None)[1]
    model = kernels(rll.nsa_launches(s, SMS, rll.selection_from_idx(idx, positions, s.select_block)))
    assert [(la.kernel, la.grid) for la in model] == [(name, g) for name, g, _ in launches]
    assert any(la.kernel == "_band_bwd_dkdv" and la.note.split("NSPLIT=")[1] != "1" for la in model)
    for i, la in enumerate(model):
        assert np.array_equal(per_program(flops, i, la.grid), la.flops), (i, la.kernel, la.branch)
        assert la.dot_rows == min(rows.get(i, {0})), (la.kernel, rows.get(i))


def test_band_tile_loops_match_the_interpreter_where_every_loop_runs() -> None:
    """Window and compressed band kernels at a length where the forward, dQ and dK/dV each
    take their masked edge, unmasked interior and diagonal loops."""
    B, t, H, G, D = 1, 256, 1, 1, 64
    torch.manual_seed(1)
    cases = [("window", t, 1, 0, 200, 1), ("compressed", (t - 2) // 2 + 1, 2, 1, t + 1, 4)]
    for branch, nk, stride, off, win, nsplit in cases:
        s = rll.Shape(B, t, H, G, D, block=off + 1, stride=stride, window=win)
        q = torch.randn(B, t, H, D)
        k, v = torch.randn(B, nk, G, D), torch.randn(B, nk, G, D)
        with observed(execute=True) as (launches, flops, rows):
            o, lse = band.band_forward(q, k, v, stride, off, win, D**-0.5)
            band.band_backward(q, k, v, o, lse, torch.randn_like(o), stride, off, win, D**-0.5, nsplit)
        model = [la for la in rll._band_launches(s, branch, nk, stride, off, win, nsplit) if la.grid]
        assert [(la.kernel, la.grid) for la in model] == [(n, g) for n, g, _ in launches]
        for i, la in enumerate(model):
            assert np.array_equal(per_program(flops, i, la.grid), la.flops), (branch, la.kernel)
            assert la.dot_rows == min(rows.get(i, {0})), (branch, la.kernel)
        for bm, bn in ((128, 64), (64, 32)):
            p = rll.band_programs(t, nk, stride, off, win, bm, bn)
            assert (p["edge"] > 0).any() and (p["tiles"] > p["edge"]).any(), (branch, bm, bn)
        p = rll.band_dkdv_programs(t, nk, stride, off, win, 64, 32, nsplit)
        assert (p["edge"] > 0).any() and (p["tiles"] > p["edge"]).any(), branch


@pytest.mark.parametrize("t", [2048, 5000])
def test_useful_flops_are_nsa_stats_and_the_rest_is_recompute_and_masked_work(t: int) -> None:
    cfg = load_config(ROOT / "configs" / "nsa-125m.yaml").model
    a = cfg.attention
    assert (a.compress_block, a.compress_stride, a.select_block, a.num_selected, a.window) == (
        NSA["block"], NSA["stride"], NSA["select_block"], NSA["num_selected"], NSA["window"])
    b = 2
    s = rll.Shape(b, t, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
    stats = 3 * attention_flops_per_token(cfg, t) * t * b / cfg.n_layers  # one layer, fwd + bwd
    launches = rll.nsa_launches(s, SMS)
    useful = sum(la.useful for la in launches)
    assert useful == pytest.approx(stats, rel=1e-12)
    executed = sum(float(la.flops.sum()) for la in launches)
    for la in launches:
        assert float(la.flops.sum()) >= la.ideal >= la.useful >= 0, la.kernel
    case = rl.analyse("nsa-125m", s, ["H200"])
    assert case.total("flops") == pytest.approx(executed)
    md = "\n".join(rl.case_markdown(case, ["H200"]))
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| # |")).split("|")
    sum_row = next(line for line in lines if "**sum**" in line).split("|")
    useful_share = sum_row[[c.strip() for c in header].index("useful")].strip()
    assert useful_share == f"{100 * stats / executed:.0f}%"  # the share of executed FLOPs nsa.stats counts


def test_selection_model_is_consistent() -> None:
    s = rll.Shape(2, 5000, 16, 1, 64)
    t = np.arange(s.T)
    chosen = np.minimum(s.n, t // s.select_block + 1).sum() * s.B * s.G
    P = rll.selected._sizes(s.hpg, s.D, s.select_block, None)[1]
    unions = {u: rll.selection_model(s, P, u) for u in rll.UNIONS}
    for sel in unions.values():
        assert abs(sel.seg.sum() - chosen) <= s.ns * s.B * s.G  # per-block rounding
        assert sel.union.shape == (s.B * s.G, math.ceil(s.T / P))
    assert (unions["shared"].union <= unions["random"].union + 1e-9).all()
    assert (unions["random"].union <= unions["disjoint"].union + 1e-9).all()
    assert unions["disjoint"].union.max() <= P * s.n


def test_selection_from_a_real_idx() -> None:
    # B 1, T 4, G 1, n 3, blocks of 2 tokens: t0, t1 chose {0}; t2, t3 chose {0, 1}
    idx = torch.tensor([[[[0, -1, -1]], [[0, -1, -1]], [[0, 1, -1]], [[1, 0, -1]]]])
    sel = rll.selection_from_idx(idx, 2, 2)
    assert sel.union.tolist() == [[1, 2]]
    assert sel.seg.tolist() == [[4, 2]]
    assert sel.pairs == 1 + 2 + 3 + 4  # keys <= t inside the chosen blocks


@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("nc,b,g", [(127, 1, 1), (1023, 4, 1), (4095, 1, 4), (3, 32, 1), (0, 1, 1)])
def test_compressed_split_is_the_wrappers(nc: int, b: int, g: int, d: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.empty(b, 16, 16, d, device="meta")
    monkeypatch.setattr(T, "_sm_count", lambda device: SMS)
    with tuning.assumed_capability(rll.CAPABILITY):
        assert rll.cmp_split(nc, b, g, d, SMS) == T._cmp_split(q, nc, g)
    assert rll.cmp_split(nc, b, g, d, 0) == 1


def test_residency_and_balance() -> None:
    assert rl.resident(168, 0, 4) == 3 and rl.resident(255, 0, 4) == 2  # docs/kernels.md's register table
    assert rl.resident(128, 0, 8) == 2 and rl.resident(129, 0, 8) == 1
    assert rl.resident(64, 120 * 1024, 4) == 1  # shared memory binds
    record = rl.read_record(rl.latest_record())
    assert record[("_band_fwd", "nsa-125m window fwd")][2] == 4  # sm_90: 64 x 32 (band.FWD_TILES_SM90)
    assert rl.balance(np.ones(264), SMS) == 1.0
    assert rl.balance(np.ones(133), SMS) == pytest.approx(133 / (2 * SMS))
    assert rl.balance(np.array([4.0, 1, 1, 1, 1]), 2) == pytest.approx(8 / (2 * 4))


def test_cli_prints_the_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    measured = tmp_path / "results.json"
    row = dict(device="NVIDIA H200", layout="nsa-125m", seq_len=2048, batch=4, status="ok")
    rows = [dict(row, op=op, impl=impl, ms=ms) for op, impl, ms in (
        ("attn_fwd_train", "nsa_triton", 2.0), ("attn_bwd", "nsa_triton", 3.0),
        ("attn_fwd_train", "dense_cudnn", 1.0), ("attn_bwd", "dense_cudnn", 2.0))]
    measured.write_text(json.dumps(dict(
        rows=rows,
        kernels=[dict(impl="nsa_triton", layout="nsa-125m", seq_len=2048, batch=4, kernel="_sel_fwd", calls=1,
                      device_ms=0.75, share=0.15)])))
    out_json = tmp_path / "roofline.json"
    assert rl.main(["--layouts", "nsa-125m", "--seqs", "2048", "--batch", "4", "--measured", str(measured),
                    "--json", str(out_json)]) == 0
    md = capsys.readouterr().out
    assert "## nsa-125m, T 2048, batch 4" in md and "| dense flash (bound) |" in md
    assert "H100 ms | H100 / balance | H100 tiles at HBM | H200 ms" in md
    table = [line for line in md.splitlines() if re.match(r"\| \d+ \| `_", line)]
    assert len(table) == len(kernels(rll.nsa_launches(rll.Shape(4, 2048, 16, 1, 64), SMS)))
    assert "| `_sel_fwd` |" in md and "| 0.750 |" in md  # the measured kernel beside its bound
    assert "| nsa-125m | 2048 | 4 | H200 |" in md and "| 5.000 | 3.000 |" in md
    data = json.loads(out_json.read_text())
    assert data["cases"][0]["shape"]["T"] == 2048 and data["cases"][0]["measured"]["nsa_ms"] == 5.0
    names = {la["kernel"] for la in data["cases"][0]["launches"]}
    assert names >= {"_band_fwd", "_sel_bwd_dkdv", "_scores_topn"}


@pytest.mark.parametrize("flag", ["--measured", "--record"])
def test_cli_refuses_a_missing_or_unreadable_file_by_name(flag: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "results.json"
    with pytest.raises(SystemExit) as e:
        rl.main(["--seqs", "2048", flag, str(missing)])
    assert e.value.code == 2 and f"{flag} {missing}: no such file" in capsys.readouterr().err
    missing.write_text("<html>not json")
    with pytest.raises(SystemExit) as e:
        rl.main(["--seqs", "2048", flag, str(missing)])
    assert e.value.code == 2 and f"{flag} {missing}: not a readable JSON file" in capsys.readouterr().err


def test_flex_window_kernels_stand_against_the_band_window_launches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A profile of a 16-bit GPU step has FlexAttention's kernels for the window branch: they
    are summed into one line against the band kernels' window launches, whose bounds then
    leave the band rows (there the measured band kernels are the compressed branch's alone)."""
    measured = tmp_path / "results.json"
    key = dict(impl="nsa_triton", layout="nsa-125m", seq_len=2048, batch=4, calls=1, share=0.1)
    measured.write_text(json.dumps(dict(rows=[], kernels=[
        dict(key, kernel="_band_fwd", device_ms=0.5),
        dict(key, kernel="triton_tem_fused_flex_attention_0", device_ms=0.25),
        dict(key, kernel="triton_tem_fused_flex_attention_backward_1", device_ms=1.0),
        dict(key, kernel="some_torch_kernel", device_ms=0.125)])))
    assert rl.main(["--layouts", "nsa-125m", "--seqs", "2048", "--batch", "4", "--devices", "H200",
                    "--measured", str(measured)]) == 0
    md = capsys.readouterr().out
    case = rl.analyse("nsa-125m", rl.Shape(4, 2048, 16, 1, 64), ["H200"], "random",
                      rl.read_record(rl.latest_record()))
    rows = [r for r in case.rows if r.grid]
    band_cmp = sum(r.balanced_ms["H200"] for r in rows
                   if r.kernel == "_band_fwd" and r.branch.startswith("comp"))
    window = sum(r.balanced_ms["H200"] for r in rows if r.branch.startswith("window"))
    assert window > 0 and f"| `_band_fwd` | {rl._ms(band_cmp)} | 0.500 |" in md
    flex = "window branch on FlexAttention (2 kernels) vs the band kernels' bound"
    assert f"| {flex} | {rl._ms(window)} | 1.250 |" in md
    assert re.search(r"\| other kernels \(torch\) \| [0-9.]+ \| 0\.125 \|", md)


def test_sel_positions_sets_the_selected_programs_and_is_restored(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``--sel-positions P``: the selected forward/dQ rows are the launches the wrapper makes with
    P positions per program (P x 16 heads rows, T / P programs), neighbours that choose the same
    blocks re-read less per position the more share a program, and the kernels' own choice is
    back afterwards; out of range is refused."""
    from nsa.ops.triton import selected

    T = 2048
    reread: dict[int, float] = {}
    for p in (1, 4):
        out = tmp_path / f"p{p}.json"
        assert rl.main(["--layouts", "nsa-125m", "--seqs", str(T), "--batch", "2", "--devices", "H200",
                        "--union", "shared", "--sel-positions", str(p), "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["sel_positions"] == p and selected.POSITIONS is None
        fwd = next(la for la in data["cases"][0]["launches"] if la["kernel"] == "_sel_fwd")
        assert fwd["grid"][0] == T // p and f"R={max(16, 16 * p)} P={p}" in fwd["note"], fwd
        reread[p] = fwd["tile_bytes"] / fwd["min_bytes"]
    assert reread[4] < reread[1] / 2, reread
    capsys.readouterr()
    with pytest.raises(SystemExit):
        rl.main(["--sel-positions", "0"])
    assert "--sel-positions must be 1..16" in capsys.readouterr().err


@pytest.mark.slow
def test_mma_and_sass_read_the_sm90_compiles_of_every_kernel(tmp_path: Path) -> None:
    """``--mma`` compiles the kernels (Triton's compiler, no GPU): the dots of fewer than 64
    rows are the kernels whose PTX has no wgmma. ``--sass`` disassembles the same compiles:
    every kernel with dots has a hot loop holding the MMA instructions its PTX names (HGMMA
    for wgmma, HMMA for mma.sync), and its issue bound is its dot FLOPs at that loop's
    instructions per FLOP."""
    out_json = tmp_path / "mma.json"
    out = run_compiled(["-m", "bench.roofline", "--layouts", "nsa-125m", "--seqs", "2048", "--devices",
                        "H200", "--mma", "--sass", "--json", str(out_json)], timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Hot loops, sm_90 SASS" in out.stdout
    data = json.loads(out_json.read_text())
    launches = data["cases"][0]["launches"]
    kinds = {(la["kernel"], la["branch"]): la["mma"] for la in launches if la["grid"]}
    assert all(kinds.values()), kinds
    dev = data["devices"]["H200"]
    for la in launches:
        if la["grid"] and la["dot_rows"]:
            assert la["mma"] == ("wgmma" if la["dot_rows"] >= rl.WGMMA_ROWS else "mma.sync"), la["kernel"]
            hot = la["sass"]
            assert hot and hot["by_class"]["mma"] > 0 and hot["instructions"] > hot["by_class"]["mma"], la
            want = 1e3 * la["flops"] * hot["warp_instructions_per_flop"] / (4 * dev["sms"] * dev["clock_hz"])
            assert hot["issue_ms"]["H200"] == pytest.approx(want), la["kernel"]
        elif la["grid"]:
            assert la["sass"] is None, la["kernel"]  # no dot, no hot loop
