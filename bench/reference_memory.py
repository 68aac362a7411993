"""Peak memory and time of one NSA attention layer through the reference ops on CPU.

    python -m bench.reference_memory [--seqs 1024 2048 4096 8192] [--baseline-rev REV]
                                     [--threads 1] [--layout 16 1 64] [--chunk-elems N]

One fwd+bwd of the NSA attention core the GPU benchmark times (``bench.core.nsa_attention``:
compressed branch + scores, top-n, selected, window, gated sum) at the nsa-125m layout
(H=16, G=1, D=64; l=32, d=16, l'=64, n=16, w=512), fp32, batch 1, after a warm-up at seq 256.

Each (implementation, seq) runs in two fresh processes, so one case's allocations cannot
hide another's:

- ``time``: the growth of the resident set during the first call at this length over
  its state once the inputs exist (``ru_maxrss`` after it minus the RSS before it: what
  the OS sees, which also holds allocator caches, heap fragments that glibc keeps after a
  free, and the BLAS libraries' own buffers); then a second call's forward and backward
  wall time and process CPU time (the first call at a new length pays one-time setup;
  one thread: on a shared machine the CPU time is the steadier number).
- ``tensors``: the same call under ``torch.profiler(profile_memory=True)``: the peak of
  the bytes of tensors allocated during the call and still alive (torch's own
  accounting of every CPU tensor allocation and free). This is the algorithm's memory.

``--baseline-rev`` also runs ``nsa/ops/reference.py`` as it was at a git revision (e.g.
the dense-mask version before the gather rewrite) for an old-vs-new table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _rss_bytes() -> int:
    """Current resident set size (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _load_ops(rev: str | None) -> types.ModuleType:
    """The reference ops of this checkout, or of ``rev`` (its file, executed as a module)."""
    if rev is None:
        from nsa.ops import reference

        return reference
    src = subprocess.run(["git", "show", f"{rev}:nsa/ops/reference.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType(f"reference_at_{rev}")
    exec(compile(src, f"{rev}:nsa/ops/reference.py", "exec"), mod.__dict__)  # noqa: S102 - our own file
    return mod


def _inputs(T: int, dims: tuple[int, int, int]) -> tuple[list[Any], Any]:
    """The NSA core's inputs at seq T (fp32, batch 1, requiring grad) and a gradient for its output."""
    import torch

    from bench.core import attention_inputs

    torch.manual_seed(0)
    H, G, D = dims
    xs = [x.requires_grad_() for x in attention_inputs("nsa_reference", 1, T, H, G, D, "cpu", torch.float32)]
    return xs, torch.randn(1, T, H, D)


def peak_live_bytes(prof: Any) -> int:
    """Peak of the running sum of the allocation events a ``profile_memory`` profile
    recorded (sizes are negative for frees): the most tensor bytes alive at once among
    those allocated while profiling."""
    from torch._C._profiler import _EventType

    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation:
            sizes.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    cur = peak = 0
    for _, size in sorted(sizes):
        cur += size
        peak = max(peak, cur)
    return peak


def child(mode: str, rev: str | None, T: int, threads: int, dims: tuple[int, int, int],
          chunk_elems: int | None = None) -> dict[str, Any]:
    """One case in this (fresh) process; ``mode`` ``time`` or ``tensors`` (see the module doc)."""
    import torch

    from bench.core import nsa_attention

    torch.set_num_threads(threads)
    ops = _load_ops(rev)
    if chunk_elems is not None and hasattr(ops, "CHUNK_ELEMS"):
        ops.CHUNK_ELEMS = chunk_elems
    xs, grad_out = _inputs(256, dims)
    nsa_attention(ops, *xs).backward(grad_out)  # warm-up: libraries, thread pools, allocator arenas
    warm_max = _maxrss_bytes()
    xs, grad_out = _inputs(T, dims)  # the inputs exist before the baseline is read
    if mode == "tensors":
        cpu = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=cpu, profile_memory=True) as prof:
            nsa_attention(ops, *xs).backward(grad_out)
        return dict(tensor_peak_bytes=peak_live_bytes(prof))
    base = _rss_bytes()
    nsa_attention(ops, *xs).backward(grad_out)  # first call at this length: the RSS growth
    peak = _maxrss_bytes()
    for x in xs:
        x.grad = None
    c0, t0 = time.process_time(), time.perf_counter()  # second call: steady-state times
    out = nsa_attention(ops, *xs)
    t1 = time.perf_counter()
    out.backward(grad_out)
    t2, c2 = time.perf_counter(), time.process_time()
    return dict(fwd_s=t1 - t0, bwd_s=t2 - t1, cpu_s=c2 - c0, rss_growth_bytes=peak - base,
                rss_hidden=peak <= warm_max)


def _run_child(mode: str, rev: str | None, T: int, threads: int, dims: tuple[int, int, int],
               timeout: float, chunk_elems: int | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.reference_memory", "--child", mode, str(T), "--threads", str(threads),
           "--layout", *map(str, dims)] + (["--rev", rev] if rev else [])
    cmd += ["--chunk-elems", str(chunk_elems)] if chunk_elems else []
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"{mode}: timed out after {timeout:.0f} s")
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1][:120]
        return dict(error=f"{mode}: exit {p.returncode}: {tail}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(impl: str, rev: str | None, T: int, threads: int, dims: tuple[int, int, int],
            timeout: float, chunk_elems: int | None = None) -> dict[str, Any]:
    """Both fresh-process runs of one case, merged into one result."""
    r: dict[str, Any] = dict(impl=impl, seq=T)
    for mode in ("time", "tensors"):
        got = _run_child(mode, rev, T, threads, dims, timeout, chunk_elems)
        r.update(got)
        if "error" in got:
            break
    return r


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**20:,.0f} MiB"


def format_table(results: list[dict[str, Any]]) -> str:
    """Markdown: one row per case; the tensor peak's ratio to the same implementation at half the seq."""
    by = {(r["impl"], r["seq"]): r for r in results}
    lines = ["| impl | seq | fwd s | bwd s | fwd+bwd s | CPU s | peak tensor memory | ratio to seq/2 "
             "| RSS growth |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "fwd_s" not in r:
            lines.append(f"| {r['impl']} | {r['seq']} | {r.get('error', '?')} | | | | | | |")
            continue
        prev = by.get((r["impl"], r["seq"] // 2), {})
        peak, before = r.get("tensor_peak_bytes"), prev.get("tensor_peak_bytes")
        ratio = f"{peak / before:.2f}" if peak and before else "-"
        rss = _mib(r["rss_growth_bytes"]) + (" (hidden by warm-up)" if r["rss_hidden"] else "")
        lines.append(f"| {r['impl']} | {r['seq']} | {r['fwd_s']:.2f} | {r['bwd_s']:.2f} | "
                     f"{r['fwd_s'] + r['bwd_s']:.2f} | {r['cpu_s']:.2f} | "
                     f"{_mib(peak) if peak else r.get('error', '-')} | {ratio} | {rss} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--baseline-rev", help="also measure nsa/ops/reference.py at this git revision")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--layout", type=int, nargs=3, default=[16, 1, 64], metavar=("H", "G", "D"))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process")
    ap.add_argument("--chunk-elems", type=int, help="the reference's CHUNK_ELEMS (default: its own)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "SEQ"), help=argparse.SUPPRESS)
    ap.add_argument("--rev", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dims = tuple(args.layout)
    if args.child:
        print(json.dumps(child(args.child[0], args.rev, int(args.child[1]), args.threads, dims,
                               args.chunk_elems)))
        return 0
    import torch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, load {load}; torch {torch.__version__}, "
          f"{args.threads} thread(s); H, G, D = {dims}; fp32, batch 1", flush=True)
    impls: list[tuple[str, str | None]] = [("new", None)]
    if args.baseline_rev:
        impls.append((f"old ({args.baseline_rev})", args.baseline_rev))
    results = []
    for name, rev in impls:
        for T in args.seqs:
            r = measure(name, rev, T, args.threads, dims, args.timeout, args.chunk_elems)
            results.append(r)
            print(json.dumps(r), flush=True)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
