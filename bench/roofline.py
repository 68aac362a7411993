"""Where one NSA fwd+bwd spends its time, bounded from the kernels' own tiling, without a GPU.

    python -m bench.roofline [--layouts nsa-125m paper] [--seqs 2048 16384 65536] [--batch B]
                             [--devices H100 H200] [--union random|disjoint|shared]
                             [--measured RESULTS.json] [--mma] [--sass] [--json OUT]

For every kernel launch of one attention fwd+bwd of ``bench.core.nsa_attention`` through
``nsa.ops.triton`` (what ``bench.run`` times: compressed attention with the fused top-n,
selected and window attention, the gated combine; no RoPE, no projections), at the
launch parameters the wrappers choose (tiles and warps from ``tuning.candidates``, i.e.
the default config; the selected kernels' ``_sizes``, the scores kernel's ``_tiles``),
it reports:

- **grid**: programs, programs per SM, waves (programs / (SMs x resident programs per
  SM; residency from the compile gate's sm_90 record of registers, shared memory and
  warps)), and **balance**: the mean SM load over the busiest SM's when programs are
  handed, in launch order, to the least-loaded SM, a program's cost being its dot FLOPs
  (its bytes for kernels without dots). 1.0 = no SM waits on another; a grid smaller
  than the SM count caps it at programs / SMs.
- **FLOPs executed**: every ``tl.dot`` the programs run, at tile size (masked rows and
  keys inside a visited tile included, 2 FLOPs per multiply-add); **useful**: 4 * D per
  visible (query, key) pair and head in the forward and in each backward kernel (dQ;
  dK/dV), which sums to ``nsa.stats``' 3x-forward convention; **masked**: what neither
  the useful work nor the kernel's recomputation (the backward's QK^T and dP, the scores
  kernel's QK^T) needs. Non-dot work (exp2, masks, the top-n's int64 sorts) is not counted.
- **dot M**: the fewest rows of the kernel's dots. sm_90's warp-group MMA
  (``wgmma.mma_async.m64nNk16``) multiplies 64-row tiles; smaller dots take the older
  ``mma.sync`` (every 32-row dot of these kernels did, compiled for sm_90 with Triton
  3.9: docs/kernels.md), which the peak below does not describe.
- **bytes**: ``min`` = each input read once and each output written once (a true lower
  bound); ``tiles`` = every program's tile loads and stores, every re-read across
  programs counted (what reaches HBM if L2 caught nothing); ``re-read`` = tiles / min;
  ``tiles at HBM`` = tiles / bandwidth.
- **bound** = max(FLOPs executed / peak, min bytes / bandwidth) per device, and that
  bound / balance. Kernels run one after another, so the sums are the fwd+bwd's bound.
  Torch ops between the kernels (the sort of the selected backward's index keys, the split
  dK/dV sum, autograd's sum of the three dQ) are rows of bytes only, estimated.
- **dense**: causal FlashAttention-2 at the same shapes (forward 2 matmuls, backward 5,
  over the T(T+1)/2 visible pairs per head; Q, K, V, O, dO, dQ, dK, dV and the row
  statistics moved once), the same bound formula.
- ``--measured``: a ``bench.run`` results JSON; its per-kernel profile and fwd+bwd rows of
  the same case are shown beside the bounds. ``--mma``: each kernel compiled for sm_90
  (the compile gate's machinery), and whether its PTX uses wgmma or mma.sync. ``--sass``:
  the same compiles disassembled (``bench.sass``): each kernel's hot loops, what one
  iteration of the leanest issues, and the **issue bound** (the warp instructions of its
  executed dot FLOPs at that loop's rate, over four per SM and cycle at the boost clock),
  beside the measured time with ``--measured``.

Peaks (bf16 dense tensor-core math, HBM bandwidth; both parts have 132 SMs, 64K
registers and 228 KiB of shared memory per SM), from NVIDIA's published H100 SXM and H200
SXM specifications, which list BF16 tensor-core throughput "with sparsity" (1,979
TFLOP/s): dense is half, 989.4 TFLOP/s; HBM3 3.35 TB/s (H100), HBM3e 4.8 TB/s (H200);
both boost to 1,980 MHz (the issue bound's clock).

The selected kernels' work depends on which blocks were chosen. Without a real selection
the model takes the forced blocks (initial, local) and the rest spread uniformly over the
eligible blocks (what random inputs, as in ``bench.run``, give); ``--union`` says how
the positions that share a forward/dQ program overlap: independent picks (``random``,
the default), none in common (``disjoint``, the most work) or the same (``shared``).

Everything here is a formula over the launch parameters: nothing is launched and no
GPU is needed. The launches themselves (grids, warps, each program's dot FLOPs and tile
bytes, the selection model) are ``bench.roofline_launches``, which mirrors the kernels'
loop bounds in one place each; this module adds the devices, occupancy and balance, the
bounds and the report. ``tests/test_bench_roofline.py`` checks the grids against the
wrappers' real launches and the dot FLOPs against the interpreter's count, program by
program.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report import refuse_unreadable  # noqa: E402
from bench.roofline_launches import CAPABILITY, UNIONS, Launch, Shape, _cdiv, dense_flash, nsa_launches  # noqa: E402
from bench.run import EXTRA_LAYOUTS, LAYOUTS  # noqa: E402
from nsa.ops.triton import selected  # noqa: E402

RECORDS = ROOT / "bench" / "results"


@dataclasses.dataclass(frozen=True)
class Device:
    """Peak bf16 dense tensor-core FLOP/s, HBM bytes/s, SMs and boost clock (module docstring:
    sources)."""

    name: str
    sms: int
    flops: float
    bandwidth: float
    clock_hz: float


DEVICES = {
    "H100": Device("H100 SXM", 132, 989.4e12, 3.35e12, 1.98e9),
    "H200": Device("H200 SXM", 132, 989.4e12, 4.8e12, 1.98e9),
}
# Per-SM limits of sm_90 (both parts): what bounds the resident programs of a kernel.
SM_REGS = 65536
SM_SMEM = 228 * 1024
SM_WARPS = 64
SM_BLOCKS = 32
SMEM_RESERVED = 1024  # per resident block
WGMMA_ROWS = 64  # sm_90's warp-group MMA (wgmma.mma_async.m64nNk16) multiplies 64-row tiles


# ----------------------------------------------------------------------------- occupancy and balance


def balance(cost: np.ndarray, sms: int) -> float:
    """Mean SM load / busiest SM's, programs handed in launch order to the least-loaded SM."""
    total = float(cost.sum())
    if cost.size == 0 or total <= 0:
        return 1.0
    hi, lo = float(cost.max()), float(cost.min())
    if hi - lo <= 1e-9 * hi:
        makespan = _cdiv(cost.size, sms) * hi
    else:
        loads = [0.0] * sms
        for c in cost.tolist():
            heapq.heapreplace(loads, loads[0] + c)
        makespan = max(loads)
    return total / (sms * makespan)


def latest_record() -> Path | None:
    """The newest passing compile-gate record (bench/results/compile-triton-*.json)."""
    best: tuple[tuple[int, ...], Path] | None = None
    for path in RECORDS.glob("compile-triton-*.json"):
        try:
            data = json.loads(path.read_text())
            version = tuple(int(x) for x in str(data["triton"]).split("."))
        except (ValueError, KeyError, OSError):
            continue
        if data.get("passed") and (best is None or version > best[0]):
            best = (version, path)
    return best[1] if best else None


_LINE = re.compile(r"^OK\s+sm_(\d+)\s+(\w+)\s+regs\s+(\d+)\s.*?smem\s+(\d+) B\s+warps\s+(\d+)"
                   r"\s+stages\s+\d+\s*(\((default|alt)[^)]*\))?\s*\[(.*)\]\s*$")


def read_record(path: Path | None, arch: int = 90) -> dict[tuple[str, str], tuple[int, int, int]]:
    """``(kernel, case label) -> (registers, shared bytes, warps)`` of the default configs."""
    if path is None:
        return {}
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    for line in json.loads(path.read_text()).get("lines", []):
        m = _LINE.match(" ".join(line.split()))
        if not m or int(m.group(1)) != arch or m.group(7) == "alt":
            continue
        for case in m.group(8).split(", "):
            out.setdefault((m.group(2), case.strip()), (int(m.group(3)), int(m.group(4)), int(m.group(5))))
    return out


def resident(regs: int, smem: int, warps: int) -> int:
    """Programs of one kernel an sm_90 SM holds at once (registers in 8s per thread)."""
    by_regs = SM_REGS // (_cdiv(regs, 8) * 8 * 32 * warps)
    by_smem = SM_SMEM // (smem + SMEM_RESERVED)
    return max(0, min(SM_BLOCKS, SM_WARPS // warps, by_regs, by_smem))


_OP = {"compressed": "compressed+selection", "window": "window", "selected": "selected",
       "combine": "gated combine"}


def _residency(record: dict, labels: Sequence[str], launch: Launch) -> int | None:
    op = f"{_OP[launch.branch]} {launch.phase}"
    for label in labels:
        got = record.get((launch.kernel, f"{label} {op}"))
        if got:
            return resident(*got)
    return None


# ----------------------------------------------------------------------------- analysis


@dataclasses.dataclass
class Row:
    """One launch's numbers (no per-program arrays): what the table and the JSON show."""

    kernel: str
    branch: str
    phase: str
    grid: list[int]
    programs: int
    warps: int
    resident: int | None
    balance: float
    flops: float
    useful: float
    ideal: float
    min_bytes: float
    tile_bytes: float
    note: str
    dot_rows: int
    ms: dict[str, float]  # device -> bound
    balanced_ms: dict[str, float]
    mma: str | None = None  # with --mma: the MMA instructions its sm_90 PTX uses
    sass: dict[str, Any] | None = None  # with --sass: its hot loops (bench.sass) and issue bound per device


@dataclasses.dataclass
class Case:
    layout: str
    shape: Shape
    rows: list[Row]
    dense: dict[str, float]  # device -> bound ms
    dense_flops: float
    dense_bytes: float
    measured: dict[str, Any] = dataclasses.field(default_factory=dict)

    def total(self, key: str, device: str | None = None) -> float:
        if device is None:
            return sum(getattr(r, key) for r in self.rows)
        return sum(getattr(r, key)[device] for r in self.rows)


def bound_ms(flops: float, nbytes: float, dev: Device) -> float:
    """max(FLOPs / peak, bytes / bandwidth), in ms."""
    return 1e3 * max(flops / dev.flops, nbytes / dev.bandwidth)


def analyse(layout: str, s: Shape, devices: Sequence[str], union: str = "random",
            record: dict | None = None) -> Case:
    """The launches of one case with their bounds on each device (same SM count assumed)."""
    sms = {DEVICES[d].sms for d in devices}
    if len(sms) != 1:
        raise ValueError("devices with different SM counts launch different grids: analyse them apart")
    n_sm = sms.pop()
    labels = [layout, f"D{s.D}-hpg{s.hpg}"]
    rows = []
    for launch in nsa_launches(s, n_sm, union=union):
        flops, tb = float(launch.flops.sum()), float(launch.tile_bytes.sum())
        cost = launch.flops if flops > 0 else launch.tile_bytes
        bal = balance(cost, n_sm) if launch.grid else 1.0
        ms = {d: bound_ms(flops, launch.min_bytes, DEVICES[d]) for d in devices}
        res = _residency(record or {}, labels, launch) if launch.grid else None
        rows.append(Row(launch.kernel, launch.branch, launch.phase, list(launch.grid), launch.programs,
                        launch.warps, res, bal, flops, launch.useful, launch.ideal, launch.min_bytes, tb,
                        launch.note, launch.dot_rows, ms, {d: v / bal for d, v in ms.items()}))
    dflops, dbytes = dense_flash(s)
    return Case(layout, s, rows, {d: bound_ms(dflops, dbytes, DEVICES[d]) for d in devices}, dflops, dbytes)


def compiled_kernels(layout: str, s: Shape, sms: int) -> dict[tuple[str, str], Any]:
    """``(kernel, branch) -> compiled kernel`` (its ``asm["ptx"]``, ``asm["cubin"]`` and
    ``metadata``): each default-config launch of the case compiled for sm_90 by the compile
    gate's machinery (Triton's real compiler, no GPU; minutes where Triton's cache lacks
    them). Needs the compiled kernels: not under ``TRITON_INTERPRET=1``."""
    from bench.compile_check import _compile
    from bench.compile_launches import Shape as GateShape
    from bench.compile_launches import drive_ops

    branch = {"compressed+selection": "compressed", "selected": "selected", "window": "window",
              "gated combine": "combine"}
    gate = GateShape(layout, s.B, s.T, s.H, s.G, s.D, s.block, s.stride, s.select_block, s.n, s.window)
    out: dict[tuple[str, str], Any] = {}
    for la in drive_ops(gate, sms, CAPABILITY):
        key = (la.name, branch.get(la.case[len(layout) + 1:].rsplit(" ", 1)[0], ""))
        if not key[1] or la.config.startswith("alt") or key in out:
            continue
        out[key] = _compile(la, 90)[0]
    return out


def mma_kind(kernel: Any) -> str:
    """"wgmma" | "mma.sync" | "-": the MMA instructions of a compiled kernel's PTX."""
    ptx = kernel.asm["ptx"]
    return "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "-"


def hot_loops(kernel: Any, flops: float, devices: Sequence[str]) -> dict[str, Any] | None:
    """A compiled kernel's hot loops (``bench.sass``) and the issue bound of ``flops`` dot
    FLOPs in them per device; None for a kernel without MMA in a loop."""
    from bench import sass

    hot = sass.summarise(sass.loops(sass.disassemble(kernel.asm["cubin"])), kernel.metadata.num_warps)
    if hot is None:
        return None
    return dict(dataclasses.asdict(hot), warps=kernel.metadata.num_warps,
                issue_ms={d: hot.issue_ms(flops, DEVICES[d].sms, DEVICES[d].clock_hz) for d in devices})


# ----------------------------------------------------------------------------- measured times


def load_measured(path: Path, case: Case) -> dict[str, Any]:
    """From a ``bench.run`` results JSON: the case's per-kernel device ms (``kernels``), the
    nsa_triton and fastest dense fwd+bwd ms (``attn_fwd_train`` + ``attn_bwd``) and the device."""
    data = json.loads(path.read_text())
    s = case.shape
    key = (case.layout, s.T, s.B)
    kernels: dict[str, float] = {}
    for k in data.get("kernels", []):
        if k.get("impl") == "nsa_triton" and (k.get("layout"), k.get("seq_len"), k.get("batch")) == key:
            if k.get("device_ms") is not None:
                kernels[k["kernel"]] = kernels.get(k["kernel"], 0.0) + float(k["device_ms"])
    ms: dict[str, dict[str, float]] = {}
    device = ""
    for r in data.get("rows", []):
        same = (r.get("layout"), r.get("seq_len"), r.get("batch")) == key
        if same and r.get("ms") and r.get("status") == "ok":
            ms.setdefault(r["impl"], {})[r["op"]] = float(r["ms"])
            device = device or str(r.get("device") or "")
    fwd_bwd = {impl: ops.get("attn_fwd_train", ops.get("attn_fwd", 0.0)) + ops["attn_bwd"]
               for impl, ops in ms.items() if "attn_bwd" in ops}
    dense = {k: v for k, v in fwd_bwd.items() if k.startswith("dense")}
    out: dict[str, Any] = dict(kernels=kernels, device=device, nsa_ms=fwd_bwd.get("nsa_triton"))
    if dense:
        best = min(dense, key=lambda k: dense[k])
        out.update(dense_impl=best, dense_ms=dense[best])
    return out


# ----------------------------------------------------------------------------- output


def _g(x: float) -> str:
    return f"{x / 1e9:,.1f}" if x >= 1e8 else f"{x / 1e9:.3f}"


def _mb(x: float) -> str:
    return f"{x / 1e6:,.0f}" if x >= 1e7 else f"{x / 1e6:.2f}"


def _ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _pct(a: float, b: float) -> str:
    return f"{100 * a / b:.0f}%" if b > 0 else "-"


def _which(d: str, device: str) -> bool:
    return d.lower() in device.lower()


def case_markdown(c: Case, devices: Sequence[str]) -> list[str]:
    """The per-launch table of one case, its totals and what stands out."""
    s = c.shape
    n_sm = DEVICES[devices[0]].sms
    head = (f"## {c.layout}, T {s.T}, batch {s.B} (H {s.H}, G {s.G}, D {s.D}; l {s.block}, d {s.stride}, "
            f"l' {s.select_block}, n {s.n}, w {s.window})")
    dev_cols = " | ".join(f"{d} ms | {d} / balance | {d} tiles at HBM" for d in devices)
    mma = any(r.mma for r in c.rows)
    measured = bool(c.measured.get("kernels") or c.measured.get("nsa_ms"))
    out = ["", head, "",
           "| # | kernel | branch | tiles | dot M | grid | programs/SM | resident/SM (warps) | waves | "
           f"balance | GFLOP | useful | masked | MB min | re-read | {dev_cols} |" + (" MMA |" if mma else ""),
           "|" + "---|" * (15 + 3 * len(devices) + mma)]
    for i, r in enumerate(c.rows, 1):
        grid = " x ".join(str(g) for g in r.grid) or "-"
        per_sm = f"{r.programs / n_sm:,.1f}" if r.grid else "-"
        res = "-" if r.resident is None else f"{r.resident} ({r.resident * r.warps}w)"
        waves = "-" if r.resident in (None, 0) or not r.grid else f"{r.programs / (n_sm * r.resident):,.1f}"
        masked = _pct(r.flops - r.ideal, r.flops) if r.flops > 0 else "-"
        reread = f"{r.tile_bytes / r.min_bytes:.1f}x" if r.min_bytes > 0 else "-"
        times = " | ".join(f"{_ms(r.ms[d])} | {_ms(r.balanced_ms[d])} | "
                           f"{_ms(1e3 * r.tile_bytes / DEVICES[d].bandwidth)}" for d in devices)
        useful = _pct(r.useful, r.flops) if r.flops else "-"
        line = (f"| {i} | `{r.kernel}` | {r.branch} {r.phase} | {r.note} | {r.dot_rows or '-'} | {grid} | "
                f"{per_sm} | {res} | {waves} | "
                f"{r.balance:.2f} | {_g(r.flops)} | {useful} | {masked} | "
                f"{_mb(r.min_bytes)} | {reread} | {times} |" + (f" {r.mma or '-'} |" if mma else ""))
        out.append(line)
    tf, tu, ti = c.total("flops"), c.total("useful"), c.total("ideal")
    tmin, ttile = c.total("min_bytes"), c.total("tile_bytes")
    totals = " | ".join(f"**{_ms(c.total('ms', d))}** | **{_ms(c.total('balanced_ms', d))}** | "
                        f"{_ms(1e3 * ttile / DEVICES[d].bandwidth)}" for d in devices)
    out.append(f"| | **sum** | fwd+bwd | | | {sum(1 for r in c.rows if r.grid)} kernels | | | | | {_g(tf)} | "
               f"{_pct(tu, tf)} | {_pct(tf - ti, tf)} | {_mb(tmin)} | {ttile / tmin:.1f}x | {totals} |")
    dense = " | ".join(f"{_ms(c.dense[d])} | {_ms(c.dense[d])} | -" for d in devices)
    out.append(f"| | dense flash (bound) | fwd+bwd | | | | | | | | {_g(c.dense_flops)} | "
               f"{_pct(c.dense_flops * 3 / 3.5, c.dense_flops)} | | {_mb(c.dense_bytes)} | | {dense} |")
    if any(r.sass for r in c.rows):
        out += _sass_lines(c, devices)
    if measured:
        out += _measured_lines(c, devices)
    out += ["", *findings(c, devices)]
    return out


def _sass_lines(c: Case, devices: Sequence[str]) -> list[str]:
    """``--sass``: each launch's hot loops, what one iteration issues per warp, and the issue
    bound beside the FLOP/byte bound."""
    dev = devices[-1]
    out = ["", f"Hot loops, sm_90 SASS (the leanest one's shortest way through an iteration, per warp; "
               f"in brackets the most instructions in a hot loop's body, every branch counted; `around` = "
               f"the enclosing loop's own instructions; issue bound on the {dev}):", "",
           "| # | kernel | branch | warps | loops | instr/iter | around | MMA | MUFU | SHFL | BAR | global | "
           f"shared | warp instr / kFLOP | {dev} issue ms | {dev} bound ms | issue / bound |",
           "|" + "---|" * 17]
    for i, r in enumerate(c.rows, 1):
        h = r.sass
        if not h:
            continue
        k = h["by_class"]
        issue = h["issue_ms"][dev]
        per_kflop = 1e3 * h["warp_instructions_per_flop"]
        most = f" ({h['most']})" if h["most"] != h["instructions"] else ""
        out.append(f"| {i} | `{r.kernel}` | {r.branch} {r.phase} | {h['warps']} | {h['loops']} | "
                   f"{h['instructions']}{most} | {h['outer'] or '-'} | {k['mma']} | {k['mufu']} | "
                   f"{k['shfl']} | "
                   f"{k['bar']} | {k['global']} | {k['shared']} | {per_kflop:.2f} | "
                   f"{_ms(issue)} | {_ms(r.ms[dev])} | {issue / r.ms[dev]:.1f}x |")
    return out


# torch.compile's names for FlexAttention's kernels (forward, backward and its delta)
FLEX_MARK = "flex_attention"


def _measured_lines(c: Case, devices: Sequence[str]) -> list[str]:
    """Bound vs measured per kernel name (the profiler sums the launches of a name); the
    profiled kernels that are none of ours (torch's) in one line, beside our torch rows;
    FlexAttention's (the window branch of a 16-bit GPU step) beside the band kernels'
    window launches."""
    m = c.measured
    dev = next((d for d in devices if _which(d, m.get("device", ""))), devices[-1])
    # a 16-bit step on a GPU trains the window branch on FlexAttention: its kernels stand
    # against the band kernels' window launches, which then are not among the band rows
    flex = {name: ms for name, ms in m["kernels"].items() if FLEX_MARK in name}
    window = [r for r in c.rows if flex and r.grid and r.branch.startswith("window")]
    by: dict[str, float] = {}
    for r in c.rows:
        if r.grid and not any(r is w for w in window):
            by[r.kernel] = by.get(r.kernel, 0.0) + r.balanced_ms[dev]
    got: dict[str, float] = {}
    other = 0.0
    for name, ms in m["kernels"].items():
        if name in flex:
            continue
        mine = next((k for k in by if name == k or name.startswith(k + "_")), None)
        if mine is None:
            other += ms
        else:
            got[mine] = got.get(mine, 0.0) + ms
    issue: dict[str, float] = {}
    for r in c.rows:
        if r.sass and not any(r is w for w in window):
            issue[r.kernel] = issue.get(r.kernel, 0.0) + r.sass["issue_ms"][dev]
    cols = " issue ms (`--sass`) | measured / issue |" if issue else ""
    out = ["", f"Measured ({m.get('device') or 'device not named'}) beside the {dev} bound / balance:", "",
           "| kernel | bound / balance ms | measured ms | measured / bound |" + cols,
           "|---|---|---|---|" + ("---|---|" if issue else "")]

    def line(name: str, bound: float, ms: float | None, issued: float | None = None) -> str:
        ratio = f"{ms / bound:.1f}x" if ms and bound > 0 else "-"
        text = f"| {name} | {_ms(bound)} | {'-' if ms is None else _ms(ms)} | {ratio} |"
        if issue:
            text += (f" {_ms(issued)} | {ms / issued:.1f}x |" if issued and ms else
                     f" {'-' if issued is None else _ms(issued)} | - |")
        return text

    for name in sorted(by, key=lambda k: -got.get(k, 0.0)):
        out.append(line(f"`{name}`", by[name], got.get(name), issue.get(name)))
    if flex:
        out.append(line(f"window branch on FlexAttention ({len(flex)} kernels) vs the band kernels' bound",
                        sum(r.balanced_ms[dev] for r in window), sum(flex.values())))
    torch_rows = sum(r.balanced_ms[dev] for r in c.rows if not r.grid)
    out.append(line("other kernels (torch)", torch_rows, other if m["kernels"] else None))
    if m.get("nsa_ms"):
        out.append(line("NSA fwd+bwd (bench rows)", c.total("balanced_ms", dev), m["nsa_ms"]))
    if m.get("dense_ms"):
        out.append(line(f"{m['dense_impl']} fwd+bwd (bench rows)", c.dense[dev], m["dense_ms"]))
    return out


def findings(c: Case, devices: Sequence[str]) -> list[str]:
    """Plain sentences: the biggest bounds, small grids, imbalance, masked work, re-reads."""
    dev = devices[-1]
    n_sm = DEVICES[dev].sms
    total = c.total("balanced_ms", dev)
    kern = [r for r in c.rows if r.grid]
    top = sorted(kern, key=lambda r: -r.balanced_ms[dev])[:4]
    lines = [f"- {dev}: NSA fwd+bwd bound {_ms(c.total('ms', dev))} ms, {_ms(total)} ms with each kernel's "
             f"imbalance; dense flash bound {_ms(c.dense[dev])} ms (dense / NSA "
             f"{c.dense[dev] / total:.2f}x). Largest: "
             + ", ".join(f"`{r.kernel}` {r.branch} {_pct(r.balanced_ms[dev], total)}" for r in top) + "."]
    small = [r for r in kern if r.programs < n_sm and r.flops > 0]
    if small:
        lines.append("- Fewer programs than SMs: " + ", ".join(
            f"`{r.kernel}` {r.branch} ({r.programs} for {n_sm})" for r in small) + ".")
    slow = [r for r in kern if r.balance < 0.8 and r.balanced_ms[dev] > 0.02 * total]
    if slow:
        lines.append("- Imbalance (balance < 0.8, > 2% of the time): " + ", ".join(
            f"`{r.kernel}` {r.branch} {r.balance:.2f}" for r in slow) + ".")
    waste = [r for r in kern if r.flops > 0 and (r.flops - r.ideal) > 0.3 * r.flops
             and r.balanced_ms[dev] > 0.02 * total]
    if waste:
        lines.append("- Masked work > 30% of a kernel's dot FLOPs: " + ", ".join(
            f"`{r.kernel}` {r.branch} {_pct(r.flops - r.ideal, r.flops)}" for r in waste) + ".")
    narrow = [r for r in kern if 0 < r.dot_rows < WGMMA_ROWS]
    if narrow:
        names = ", ".join(f"`{r.kernel}` {r.branch} (M={r.dot_rows})" for r in narrow)
        lines.append(f"- Dots of fewer than {WGMMA_ROWS} rows (sm_90's wgmma is m{WGMMA_ROWS}: these take "
                     f"the older mma.sync path): {names}, "
                     f"{_pct(sum(r.balanced_ms[dev] for r in narrow), total)} of the bound.")
    peak, bw = DEVICES[dev].flops, DEVICES[dev].bandwidth
    flop_bound = sum(r.ms[dev] for r in kern if r.flops / peak >= r.min_bytes / bw)
    lines.append(f"- FLOP-bound launches hold {_pct(flop_bound, c.total('ms', dev))} of the bound; executed "
                 f"dot FLOPs are {c.total('flops') / max(c.total('useful'), 1):.1f}x the useful ones "
                 f"(recompute {c.total('ideal') / max(c.total('useful'), 1):.1f}x); tile traffic is "
                 f"{c.total('tile_bytes') / c.total('min_bytes'):.1f}x the minimum bytes "
                 "(what L2 must absorb).")
    return lines


def summary_markdown(cases: Sequence[Case], devices: Sequence[str]) -> list[str]:
    out = ["", "## Summary: one attention fwd+bwd", "",
           "| layout | T | batch | device | NSA bound ms | NSA bound / balance ms | "
           "NSA useful FLOPs at peak ms | dense flash bound ms | dense / NSA | measured NSA ms | "
           "measured dense ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        for d in devices:
            m = c.measured if _which(d, c.measured.get("device", "")) else {}
            nsa_bal = c.total("balanced_ms", d)
            useful_ms = 1e3 * c.total("useful") / DEVICES[d].flops
            out.append(f"| {c.layout} | {c.shape.T} | {c.shape.B} | {d} | {_ms(c.total('ms', d))} | "
                       f"{_ms(nsa_bal)} | {_ms(useful_ms)} | {_ms(c.dense[d])} | "
                       f"{c.dense[d] / nsa_bal:.2f}x | {_ms(m['nsa_ms']) if m.get('nsa_ms') else '-'} | "
                       f"{_ms(m['dense_ms']) if m.get('dense_ms') else '-'} |")
    return out


def format_markdown(cases: Sequence[Case], devices: Sequence[str], record: Path | None, union: str) -> str:
    peaks = "; ".join(f"{d}: {DEVICES[d].flops / 1e12:.1f} TFLOP/s, {DEVICES[d].bandwidth / 1e12:.2f} TB/s, "
                      f"{DEVICES[d].sms} SMs" for d in devices)
    out = ["# Roofline of one NSA attention fwd+bwd (nsa.ops.triton, bf16)", "",
           f"Peaks: {peaks}. Residency: {record.name if record else 'no compile record'} (sm_90). "
           f"Selection model: {union}. Times are lower bounds: max(GFLOP / peak, MB min / bandwidth), "
           "then / balance. `useful`: share of the dot FLOPs that nsa.stats counts; `masked`: share that "
           "neither it nor the kernel's recomputation needs; `re-read`: tile loads / minimum bytes. "
           "The window rows are the band kernel's: a 16-bit training step on a GPU runs that branch on "
           "FlexAttention instead (nsa/ops/flex.py), not modelled here."]
    for c in cases:
        out += case_markdown(c, devices)
    out += summary_markdown(cases, devices)
    return "\n".join(out) + "\n"


def case_json(c: Case) -> dict[str, Any]:
    return dict(layout=c.layout, shape=dataclasses.asdict(c.shape), dense_ms=c.dense,
                dense_flops=c.dense_flops, dense_bytes=c.dense_bytes, measured=c.measured,
                launches=[dataclasses.asdict(r) for r in c.rows])


def main(argv: Sequence[str] | None = None) -> int:
    layouts = {**LAYOUTS, **EXTRA_LAYOUTS}
    ap = argparse.ArgumentParser(prog="python -m bench.roofline", description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(layouts))
    ap.add_argument("--seqs", nargs="+", type=int, default=[2048, 16384, 65536])
    ap.add_argument("--batch", type=int, default=None,
                    help="batch (default: max(1, --tokens // seq), as bench.run)")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--devices", nargs="+", default=list(DEVICES), choices=list(DEVICES))
    ap.add_argument("--union", choices=UNIONS, default="random",
                    help="free blocks of the positions sharing a selected forward/dQ program: independent "
                         "random picks (as bench.run's random inputs), disjoint (the most work) or shared "
                         "(the least)")
    ap.add_argument("--sel-positions", type=int, default=None, metavar="P",
                    help="query positions per selected forward/dQ program, as bench.run's option "
                         "(default: the kernels' own choice)")
    ap.add_argument("--record", type=Path, default=None, help="compile-gate record for residency "
                    "(default: the newest passing bench/results/compile-triton-*.json)")
    ap.add_argument("--measured", type=Path, default=None,
                    help="a bench.run results JSON to show beside the bounds")
    ap.add_argument("--mma", action="store_true",
                    help="compile each kernel for sm_90 (Triton's compiler, no GPU) and show whether its PTX "
                         "uses wgmma or mma.sync")
    ap.add_argument("--sass", action="store_true",
                    help="compile each kernel for sm_90 and disassemble it (nvdisasm, shipped with Triton): "
                         "its hot loops' instructions per iteration and the issue bound")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = ap.parse_args(argv)
    if args.batch is not None and args.batch < 1 or any(t < 1 for t in args.seqs):
        ap.error("--batch and --seqs must be positive")
    if (args.mma or args.sass) and os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("--mma and --sass compile the kernels: unset TRITON_INTERPRET")
    if args.sel_positions is not None and not 1 <= args.sel_positions <= selected.MAX_POSITIONS:
        ap.error(f"--sel-positions must be 1..{selected.MAX_POSITIONS} (rounded up to a power of two)")
    for flag, path in (("--measured", args.measured), ("--record", args.record)):
        if path is not None:
            refuse_unreadable(ap, flag, path)
    before = selected.POSITIONS
    selected.POSITIONS = args.sel_positions if args.sel_positions is not None else before
    try:
        return _run(args, layouts)
    finally:
        selected.POSITIONS = before


def _run(args: argparse.Namespace, layouts: dict[str, tuple[int, int, int]]) -> int:
    record_path = args.record or latest_record()
    record = read_record(record_path)
    cases = []
    for layout in args.layouts:
        H, G, D = layouts[layout]
        for T in args.seqs:
            B = args.batch or max(1, args.tokens // T)
            c = analyse(layout, Shape(B, T, H, G, D), args.devices, args.union, record)
            if args.measured:
                c.measured = load_measured(args.measured, c)
            if args.mma or args.sass:
                kernels = compiled_kernels(layout, c.shape, DEVICES[args.devices[0]].sms)
                for r in c.rows:
                    k = kernels.get((r.kernel, r.branch)) if r.grid else None
                    if k is not None and args.mma:
                        r.mma = mma_kind(k)
                    if k is not None and args.sass:
                        r.sass = hot_loops(k, r.flops, args.devices)
            cases.append(c)
    print(format_markdown(cases, args.devices, record_path, args.union), end="")
    if args.json:
        data = dict(devices={d: dataclasses.asdict(DEVICES[d]) for d in args.devices}, union=args.union,
                    sel_positions=selected.POSITIONS,
                    record=str(record_path) if record_path else None, cases=[case_json(c) for c in cases])
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
