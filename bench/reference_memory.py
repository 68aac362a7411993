"""Peak memory and time of one NSA attention layer through the reference ops on CPU.

    python -m bench.reference_memory [--seqs 1024 2048 4096 8192] [--baseline-rev REV]
                                     [--threads 1] [--layout 16 1 64]

One fwd+bwd of the NSA attention core the GPU benchmark times (``bench.core.nsa_attention``:
compressed branch + scores, top-n, selected, window, gated sum) at
the nsa-125m layout (H=16, G=1, D=64; l=32, d=16, l'=64, n=16, w=512), fp32, batch 1.

Each (implementation, seq) runs in fresh subprocesses, so one case's allocations cannot
hide another's. The peak is the growth of the process's resident set over its state
after the inputs exist: ``ru_maxrss`` (the kernel's high-water mark) at the end minus the
current RSS just before the call. A warm-up at seq 256 first loads the libraries; its own
high-water mark must stay below the measured one, else the row says the peak is hidden.
Two runs per case: one with glibc's default malloc (times, process CPU time, and the RSS
a user sees, which includes recycled heap fragments), one with a fixed mmap threshold so
that RSS follows live tensor memory (``LIVE_MEMORY_ENV``; that run is slower, its time is
not reported).

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


def _inputs(T: int, dims: tuple[int, int, int]) -> tuple[list, object]:
    """The NSA core's inputs at seq T (fp32, batch 1, requiring grad) and a gradient for its output."""
    import torch

    from bench.core import attention_inputs

    torch.manual_seed(0)
    H, G, D = dims
    xs = [x.requires_grad_() for x in attention_inputs("nsa_reference", 1, T, H, G, D, "cpu", torch.float32)]
    return xs, torch.randn(1, T, H, D)


def child(impl: str, rev: str | None, T: int, threads: int, dims: tuple[int, int, int]) -> dict:
    """One case in this (fresh) process: times (wall and process CPU) and peak RSS growth."""
    import torch

    from bench.core import nsa_attention

    torch.set_num_threads(threads)
    ops = _load_ops(rev)
    xs, grad_out = _inputs(256, dims)
    nsa_attention(ops, *xs).backward(grad_out)  # warm-up: libraries, thread pools, allocator arenas
    warm_max = _maxrss_bytes()
    xs, grad_out = _inputs(T, dims)  # the inputs exist before the baseline is read
    base = _rss_bytes()
    c0, t0 = time.process_time(), time.perf_counter()
    out = nsa_attention(ops, *xs)
    t1 = time.perf_counter()
    out.backward(grad_out)
    t2, c2 = time.perf_counter(), time.process_time()
    peak = _maxrss_bytes()
    return dict(impl=impl, seq=T, fwd_s=t1 - t0, bwd_s=t2 - t1, cpu_s=c2 - c0, peak_growth_bytes=peak - base,
                hidden=peak <= warm_max)


# glibc returns a freed block to the OS only if it was mmap'ed, and by default raises its
# mmap threshold to the size of the blocks freed (up to 32 MiB), after which such blocks
# come from the heap and stay resident when freed: RSS then includes recycled heap
# fragments. A fixed threshold keeps every tensor mmap'ed, so RSS follows live tensor
# memory (slower: fresh pages are faulted in), so that run measures memory only.
LIVE_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def _run_case(impl: str, rev: str | None, T: int, threads: int, dims: tuple[int, int, int],
              timeout: float, env: dict[str, str] | None = None) -> dict:
    cmd = [sys.executable, "-m", "bench.reference_memory", "--child", impl, str(T), "--threads", str(threads),
           "--layout", *map(str, dims)]
    if rev:
        cmd += ["--rev", rev]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return dict(impl=impl, seq=T, error=f"timed out after {timeout:.0f} s")
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1][:120]
        return dict(impl=impl, seq=T, error=f"exit {p.returncode}: {tail}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(impl: str, rev: str | None, T: int, threads: int, dims: tuple[int, int, int],
            timeout: float) -> dict:
    """Two fresh processes: times and RSS growth with the default allocator, then the
    live-memory peak with ``LIVE_MEMORY_ENV``."""
    r = _run_case(impl, rev, T, threads, dims, timeout)
    if "error" in r:
        return r
    m = _run_case(impl, rev, T, threads, dims, timeout, LIVE_MEMORY_ENV)
    r["rss_growth_bytes"], r["rss_hidden"] = r.pop("peak_growth_bytes"), r.pop("hidden")
    if "error" in m:
        r["live_error"] = m["error"]
    else:
        r["live_peak_bytes"], r["live_hidden"] = m["peak_growth_bytes"], m["hidden"]
    return r


def _mib(r: dict, key: str, hidden: str) -> str:
    if key not in r:
        return r.get("live_error", "-")
    return f"{r[key] / 2**20:,.0f} MiB" + (" (hidden by warm-up)" if r[hidden] else "")


def format_table(results: list[dict]) -> str:
    """Markdown: one row per case; the live peak's ratio to the same implementation at half the seq."""
    by = {(r["impl"], r["seq"]): r for r in results}
    lines = ["| impl | seq | fwd s | bwd s | fwd+bwd s | CPU s | peak live memory | ratio to seq/2 "
             "| peak RSS growth (default malloc) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['impl']} | {r['seq']} | {r['error']} | | | | | | |")
            continue
        prev = by.get((r["impl"], r["seq"] // 2), {})
        ratio = "-"
        if r.get("live_peak_bytes", 0) > 0 and prev.get("live_peak_bytes", 0) > 0:
            ratio = f"{r['live_peak_bytes'] / prev['live_peak_bytes']:.2f}"
        lines.append(f"| {r['impl']} | {r['seq']} | {r['fwd_s']:.2f} | {r['bwd_s']:.2f} | "
                     f"{r['fwd_s'] + r['bwd_s']:.2f} | {r['cpu_s']:.2f} | "
                     f"{_mib(r, 'live_peak_bytes', 'live_hidden')} | {ratio} | "
                     f"{_mib(r, 'rss_growth_bytes', 'rss_hidden')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--baseline-rev", help="also measure nsa/ops/reference.py at this git revision")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--layout", type=int, nargs=3, default=[16, 1, 64], metavar=("H", "G", "D"))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    ap.add_argument("--child", nargs=2, metavar=("IMPL", "SEQ"), help=argparse.SUPPRESS)
    ap.add_argument("--rev", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dims = tuple(args.layout)
    if args.child:
        print(json.dumps(child(args.child[0], args.rev, int(args.child[1]), args.threads, dims)))
        return 0
    import torch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {load}; torch "
          f"{torch.__version__}, {args.threads} thread(s); H, G, D = {dims}; fp32, batch 1", flush=True)
    impls = [("new", None)]
    if args.baseline_rev:
        impls.append((f"old ({args.baseline_rev})", args.baseline_rev))
    results = []
    for name, rev in impls:
        for T in args.seqs:
            r = measure(name, rev, T, args.threads, dims, args.timeout)
            results.append(r)
            print(json.dumps(r), flush=True)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
