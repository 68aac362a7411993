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

``bench.roofline --sass`` multiplies the leanest hot loop's ratio by a launch's executed dot
FLOPs: the fewest warp instructions that many FLOPs can take, and over the GPU's issue rate
(four schedulers per SM, one instruction each per cycle) the **issue bound**, a lower bound
on time that the FLOP and byte bounds do not see. A kernel with several hot loops (an
unmasked loop for most tiles and a masked one for the diagonal's, say) runs most of its
iterations in the leanest one; the others, and everything outside the hot loops (prologues,
epilogues, the top-n's final sorts), are not counted. A kernel measured well above its issue
bound is bound by latency (too few warps to hide dependent instructions), not by issue.
"""

from __future__ import annotations

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
    """One loop of a kernel's SASS: its byte range, the instructions in it, and the shortest
    way through one iteration (``lean``: an if/else in the body takes its shorter side, a
    skipped block is skipped), which is what an iteration that needs no mask issues."""

    start: int
    end: int  # address of its backward branch
    mnemonics: tuple[str, ...]
    flops: tuple[int, ...]  # per instruction: an MMA's dot FLOPs (a warp group's: HGMMA; a warp's: HMMA)
    warp_group_mma: bool  # True: HGMMA (the flops are a warp group's), False: HMMA (a warp's)
    lean: tuple[int, ...]  # indices of the body's instructions on the shortest way through

    @property
    def instructions(self) -> int:
        return len(self.mnemonics)

    @property
    def mma_flops(self) -> int:
        return sum(self.flops)

    @property
    def lean_flops(self) -> int:
        return sum(self.flops[i] for i in self.lean)

    def count(self, kind: str, lean: bool = False) -> int:
        names = CLASSES[kind]
        return sum(1 for i, m in enumerate(self.mnemonics) if m in names and (not lean or i in self.lean))

    def contains(self, other: Loop) -> bool:
        return self is not other and self.start <= other.start and other.end <= self.end


def mnemonic(instruction: str) -> str:
    """``@!P0 HGMMA.64x64x16.F32.BF16 R24, ...`` -> ``HGMMA``."""
    body = re.sub(r"^@!?U?P\w+\s+", "", instruction.strip())
    return body.split()[0].split(".")[0] if body else ""


def _mma_flops(instruction: str) -> tuple[int, bool]:
    for pattern, warp_group in ((_HGMMA, True), (_HMMA, False)):
        m = pattern.search(instruction)
        if m:
            rows, cols, k = (int(g) for g in m.groups())
            return 2 * rows * cols * k, warp_group
    return 0, False


def _shortest_way(body: list[tuple[int, str]], labels: dict[str, int]) -> tuple[int, ...]:
    """Indices of the fewest instructions from a loop's first to its backward branch (the
    last), taking or not each forward branch inside it; a path that leaves the loop or ends
    the kernel does not count."""
    index = {addr: i for i, (addr, _) in enumerate(body)}
    last = len(body) - 1
    best: list[tuple[int, int] | None] = [None] * len(body)  # (instructions to the end, next index)
    best[last] = (1, -1)
    for i in range(last - 1, -1, -1):
        addr, text = body[i]
        op = mnemonic(text)
        branch = _BRANCH.search(text)
        conditional = text.lstrip().startswith("@")
        succ = []
        if branch and index.get(labels.get(branch.group(1), -1), -1) > i:
            succ.append(index[labels[branch.group(1)]])
        if op not in ("EXIT", "RET") and (not branch or conditional):
            succ.append(i + 1)
        options = [(best[j][0], j) for j in succ if best[j] is not None]  # type: ignore[index]
        if options:
            n, j = min(options)
            best[i] = (n + 1, j)
    if best[0] is None:
        return tuple(range(len(body)))
    way, i = [], 0
    while i != -1:
        way.append(i)
        i = best[i][1]  # type: ignore[index]
    return tuple(way)


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
            body = [(a, t) for a, t in code if start <= a <= addr]
            flops = [_mma_flops(t) for _, t in body]
            found.append(Loop(start, addr, tuple(mnemonic(t) for _, t in body), tuple(f for f, _ in flops),
                              any(wg for _, wg in flops), _shortest_way(body, labels)))
    return sorted(found, key=lambda lp: (lp.start, -lp.end))


def hot_loops(found: list[Loop]) -> list[Loop]:
    """The innermost loops with MMA instructions (no loop inside them has any)."""
    with_mma = [lp for lp in found if lp.mma_flops]
    return [lp for lp in with_mma if not any(lp.contains(other) for other in with_mma)]


@dataclasses.dataclass(frozen=True)
class HotLoops:
    """A kernel's leanest hot loop (per iteration, its shortest way through) and what it issues
    per dot FLOP; the most instructions in any of its hot loops' bodies."""

    loops: int
    instructions: int
    by_class: dict[str, int]
    warp_instructions_per_flop: float  # for the whole program (``warps`` warps)
    outer: int  # instructions of the loop around it, outside it (once per outer iteration)
    most: int  # instructions in the fullest hot loop's body, every branch's side counted

    def issue_ms(self, flops: float, sms: int, clock_hz: float) -> float:
        """Lower bound on the time of a launch executing ``flops`` dot FLOPs in these loops."""
        return 1e3 * flops * self.warp_instructions_per_flop / (ISSUE_PER_SM_CYCLE * sms * clock_hz)


def summarise(found: list[Loop], warps: int) -> HotLoops | None:
    """None for a kernel without MMA in a loop. A program of ``warps`` warps issues each loop
    instruction once per warp; an HGMMA's FLOPs are done once per warp group of 4 warps.
    ``outer``: what the innermost loop around the leanest hot loop adds to it (the scores
    kernel's top-n merge per block tile, around its token-tile loop), not in the issue bound."""
    hot = hot_loops(found)
    if not hot:
        return None

    def per_flop(lp: Loop) -> float:
        instr, flops = (len(lp.lean), lp.lean_flops) if lp.lean_flops else (lp.instructions, lp.mma_flops)
        return instr * warps / (flops * (max(1, warps // 4) if lp.warp_group_mma else warps))

    lean = min(hot, key=per_flop)
    on_way = lean.lean_flops > 0
    around = [o for o in found if o.contains(lean)]
    outer = min(around, key=lambda o: o.instructions).instructions - lean.instructions if around else 0
    return HotLoops(len(hot), len(lean.lean) if on_way else lean.instructions,
                    {k: lean.count(k, lean=on_way) for k in CLASSES}, per_flop(lean), outer,
                    max(lp.instructions for lp in hot))


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
