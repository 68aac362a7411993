"""What a compiled kernel's loops issue: its SASS (the GPU's own instructions), read without a GPU.

A kernel whose FLOPs and bytes need a fraction of its measured time is bound by what its
warps issue: masks, exponentials, reductions across threads, sorts. The compile gate's
machinery compiles a launch for sm_90 on any machine; ``nvdisasm`` (shipped with Triton)
turns the cubin into SASS. Here a loop is a backward branch (its target at or before the
branch), and a kernel's **hot loops** are its innermost loops that hold matrix-multiply
instructions: the loops that walk the key or block tiles. For them:

- instructions per iteration, per warp, and how many are MMA (``HGMMA``: sm_90's warp-group
  MMA, ``HMMA``: ``mma.sync``), ``MUFU`` (exp2 and other special functions), ``SHFL``
  (exchanges between threads: reductions along a tile's rows, sort partners), ``BAR``
  (barriers) and memory (global, shared);
- the dot FLOPs one iteration of the program performs (an ``HGMMA.64xNx16`` is ``2 x 64 x N
  x 16`` for the warp group of four warps that issues it, an ``HMMA.16816`` ``2 x 16 x 8 x 16``
  per warp), hence **warp instructions per dot FLOP**.

``bench.roofline --sass`` multiplies that ratio by a launch's executed dot FLOPs: the warp
instructions the launch issues in its hot loops, and over the GPU's issue rate (four
schedulers per SM, one instruction each per cycle) the **issue bound**, a lower bound on
time that the FLOP and byte bounds do not see. It assumes the hot loops' iterations split
as their dot FLOPs do, and counts nothing outside them (prologues, epilogues, the top-n's
final sorts); a kernel measured well above it is bound by latency (too few warps to hide
dependent instructions), not by issue.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import subprocess
import tempfile
from pathlib import Path

ISSUE_PER_SM_CYCLE = 4  # sm_80/sm_90: four warp schedulers, one instruction each per cycle
# instruction classes shown per iteration (by mnemonic, predicates and modifiers stripped)
CLASSES = {
    "mma": ("HGMMA", "HMMA"),
    "mufu": ("MUFU",),
    "shfl": ("SHFL",),
    "bar": ("BAR",),
    "global": ("LDG", "STG", "ATOMG", "RED", "LDGSTS"),
    "shared": ("LDS", "STS", "LDSM"),
}
_ADDR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b(?:\.\w+)*\s+.*?(\.L_x_\d+)")
_HGMMA = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)")
_HMMA = re.compile(r"HMMA\.(16)(8)(8|16)\b")  # m16n8k16 is "16816", m16n8k8 "1688"


@dataclasses.dataclass(frozen=True)
class Loop:
    """One loop of a kernel's SASS: its byte range and the instructions in it."""

    start: int
    end: int  # address of its backward branch
    mnemonics: tuple[str, ...]
    mma_flops: int  # dot FLOPs of one iteration per warp group (HGMMA) or per warp (HMMA), as issued
    warp_group_mma: bool  # True: HGMMA (the flops are a warp group's), False: HMMA (a warp's)

    @property
    def instructions(self) -> int:
        return len(self.mnemonics)

    def count(self, kind: str) -> int:
        names = CLASSES[kind]
        return sum(1 for m in self.mnemonics if m in names)

    def contains(self, other: Loop) -> bool:
        return self is not other and self.start <= other.start and other.end <= self.end


def mnemonic(instruction: str) -> str:
    """``@!P0 HGMMA.64x64x16.F32.BF16 R24, ...`` -> ``HGMMA``."""
    body = re.sub(r"^@!?U?P\w+\s+", "", instruction.strip())
    return body.split()[0].split(".")[0] if body else ""


def _mma_flops(instruction: str) -> tuple[int, bool]:
    m = _HGMMA.search(instruction)
    if m:
        rows, cols, k = (int(g) for g in m.groups())
        return 2 * rows * cols * k, True
    m = _HMMA.search(instruction)
    if m:
        rows, cols, k = (int(g) for g in m.groups())
        return 2 * rows * cols * k, False
    return 0, False


def loops(sass: str) -> list[Loop]:
    """Every loop of one kernel's ``nvdisasm`` listing, outermost first among nested ones."""
    labels: dict[str, int] = {}
    pending: list[str] = []
    code: list[tuple[int, str]] = []
    for line in sass.splitlines():
        label = _LABEL.match(line.strip())
        if label:
            pending.append(label.group(1))
            continue
        m = _ADDR.search(line)
        if m:
            addr = int(m.group(1), 16)
            labels.update((name, addr) for name in pending)
            pending = []
            code.append((addr, m.group(2)))
    found = []
    for addr, text in code:
        branch = _BRANCH.search(text)
        if branch and labels.get(branch.group(1), addr + 1) <= addr:
            start = labels[branch.group(1)]
            body = [t for a, t in code if start <= a <= addr]
            flops = [_mma_flops(t) for t in body]
            found.append(Loop(start, addr, tuple(mnemonic(t) for t in body), sum(f for f, _ in flops),
                              any(wg for _, wg in flops)))
    return sorted(found, key=lambda lp: (lp.start, -lp.end))


def hot_loops(found: list[Loop]) -> list[Loop]:
    """The innermost loops with MMA instructions (no loop inside them has any)."""
    with_mma = [lp for lp in found if lp.mma_flops]
    return [lp for lp in with_mma if not any(lp.contains(other) for other in with_mma)]


@dataclasses.dataclass(frozen=True)
class HotLoops:
    """A kernel's hot loops summed (per iteration of each), and what they issue per dot FLOP."""

    loops: int
    instructions: int
    by_class: dict[str, int]
    warp_instructions_per_flop: float  # for the whole program (``warps`` warps)
    outer: int  # instructions of the loops around them, outside them (once per outer iteration)

    def issue_ms(self, flops: float, sms: int, clock_hz: float) -> float:
        """Lower bound on the time of a launch executing ``flops`` dot FLOPs in these loops."""
        return 1e3 * flops * self.warp_instructions_per_flop / (ISSUE_PER_SM_CYCLE * sms * clock_hz)


def summarise(found: list[Loop], warps: int) -> HotLoops | None:
    """None for a kernel without MMA in a loop. A program of ``warps`` warps issues each loop
    instruction once per warp; an HGMMA's FLOPs are done once per warp group of 4 warps.
    ``outer``: what the innermost loop around each hot loop adds to it (the scores kernel's
    top-n merge per block tile, around its token-tile loop), not in the issue bound."""
    hot = hot_loops(found)
    if not hot:
        return None
    instr = sum(lp.instructions for lp in hot)
    flops = sum(lp.mma_flops * (max(1, warps // 4) if lp.warp_group_mma else warps) for lp in hot)
    outer = 0
    for lp in hot:
        around = [o for o in found if o.contains(lp)]
        if around:
            outer += min(around, key=lambda o: o.instructions).instructions - lp.instructions
    return HotLoops(len(hot), instr, {k: sum(lp.count(k) for lp in hot) for k in CLASSES},
                    instr * warps / flops, outer)


def nvdisasm() -> str:
    """The ``nvdisasm`` that comes with Triton's NVIDIA backend."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: this Triton has no nvdisasm")
    return str(path)


def disassemble(cubin: bytes) -> str:
    """SASS of a cubin (one kernel), as text."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([nvdisasm(), "-c", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvdisasm failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout


def mnemonic_counts(found: list[Loop]) -> collections.Counter[str]:
    """Mnemonics of the hot loops, most common first (for a closer look at one kernel)."""
    return collections.Counter(m for lp in hot_loops(found) for m in lp.mnemonics)
