"""Every tile config of every tunable training kernel, timed where one NSA fwd+bwd launches it.

    python -m bench.tiles [--layouts nsa-125m paper] [--seqs 16384 65536] [--tokens 65536]
                          [--kernels NAME ...] [--rep-ms 100] [--device cuda|cpu|meta] [--json OUT]

The tunable kernels (``nsa/ops/triton/tuning.py``: the band kernels, the selected forward and
dQ, the scores and top-n) launch their first config unless ``NSA_TRITON_AUTOTUNE=1``; the
others are alternatives the compile gate proves compile without spills, and their order was
set from registers and spills, not from timings. This runs ``bench.core.nsa_attention``
forward and backward once (bf16 on CUDA, batch ``tokens // seq`` as ``bench.run``), records
each tunable launch with its real arguments, then relaunches it with each config its prune
keeps and reports:

- milliseconds per launch (CUDA: ``triton.testing.do_bench``'s median, L2 flushed between
  calls; CPU: the interpreter's wall time, not a speed);
- the config's time over the default's, and the fastest config per launch;
- whether the config's outputs agree with the default's (every tensor argument after the
  launch: floating ones within 1e-2 relative in 16-bit, 1e-5 in fp32; integer ones exactly;
  a split launch's partials by their sum, ``SPLIT_PARTIALS``), so a config that is fast
  because it is wrong shows up as one.

Where a run trains the window branch on FlexAttention (CUDA, bf16, a gradient wanted) the
band kernel's window launches do not happen and are not listed; ``NSA_FLEX_WINDOW=0`` puts
them back. ``--device meta`` (the default without CUDA) only lists the launches and the
configs an sm_90 GPU (H100, H200) would try: nothing runs. A GPU's result says which
config to make the default: the first entry of its table in the kernel's module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.check import rel_err  # noqa: E402
from bench.core import attention_inputs, nsa_attention  # noqa: E402
from bench.run import LAYOUTS, time_cuda  # noqa: E402
from nsa.ops.triton import tuning  # noqa: E402

META_CAPABILITY = 90  # --device meta lists the configs an H100 or H200 would launch


class TunedLaunch:
    """One launch of a tunable kernel with the arguments its wrapper passed."""

    def __init__(self, kernel: tuning.Tunable, grid: Any, args: tuple, kwargs: dict) -> None:
        self.kernel, self.grid, self.args, self.kwargs = kernel, grid, args, kwargs
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        self.capability = tuning.capability(device)  # the prunes' view when it was launched

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    @property
    def branch(self) -> str:
        """Which branch launched it (a band kernel is the window at stride 1)."""
        if self.name.startswith("_sel"):
            return "selected"
        if self.name == "_scores_topn":
            return "compressed"
        stride = dict(zip(self.kernel.arg_names, self.args))["STRIDE"]
        return "window" if stride == 1 else "compressed"

    def configs(self) -> list[Any]:
        with tuning.assumed_capability(self.capability):
            return tuning.candidates(self.kernel, self.args, self.kwargs)

    def run(self, config: Any) -> None:
        self.kernel.fn[self.grid](*self.args, **self.kwargs, **config.all_kwargs())


def describe(config: Any) -> str:
    tiles = " ".join(f"{k}={v}" for k, v in config.kwargs.items())
    return f"{tiles} warps {config.num_warps} stages {config.num_stages}".strip()


@contextlib.contextmanager
def recording(execute: bool) -> Iterator[list[TunedLaunch]]:
    """Record every ``tuning.launch`` made inside the block (and make it, if ``execute``;
    otherwise no kernel at all is launched: on meta tensors the wrappers only allocate)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    import nsa.ops.triton as package

    modules = [m for m in sys.modules.values()
               if m is not None and getattr(m, "__name__", "").startswith(package.__name__)
               and getattr(m, "launch", None) is tuning.launch]
    launches: list[TunedLaunch] = []
    original = tuning.launch

    def record(kernel: tuning.Tunable, grid: Any, *args: Any, **kwargs: Any) -> None:
        launches.append(TunedLaunch(kernel, grid, args, kwargs))
        if execute:
            original(kernel, grid, *args, **kwargs)

    runs = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}
    for m in modules:
        m.launch = record  # type: ignore[attr-defined]
    if not execute:
        for cls in runs:
            cls.run = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield launches
    finally:
        for cls, run in runs.items():
            cls.run = run  # type: ignore[method-assign]
        for m in modules:
            m.launch = original  # type: ignore[attr-defined]


# A split launch's fp32 partials (``[NSPLIT, ...]``), which its wrapper sums: each config
# cuts the split at other query tiles, so only the sum is the same from config to config.
SPLIT_PARTIALS = {"_band_bwd_dkdv": ("DK", "DV")}


def _tensors(launch: TunedLaunch) -> list[torch.Tensor]:
    """The launch's tensor arguments as what follows it reads them: split partials summed."""
    named = {**dict(zip(launch.kernel.arg_names, launch.args)), **launch.kwargs}
    summed = SPLIT_PARTIALS.get(launch.name, ()) if launch.kwargs.get("NSPLIT", 1) > 1 else ()
    return [a.detach().sum(0) if name in summed else a.detach()
            for name, a in named.items() if isinstance(a, torch.Tensor)]


def _disagreement(after: list[torch.Tensor], before: list[torch.Tensor]) -> float:
    """The largest relative difference over the launch's tensors (inf for integers that differ)."""
    worst = 0.0
    for a, b in zip(after, before):
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return float("inf")
            continue
        # a row LSE of +inf (no key seen) or an unwritten NaN counts as 0 on both sides
        worst = max(worst, rel_err(a.nan_to_num(posinf=0, neginf=0), b.nan_to_num(posinf=0, neginf=0)))
    return worst


def capture(layout: str, T: int, tokens: int, device: str) -> tuple[list[TunedLaunch], int]:
    """The tunable launches of one ``nsa_attention`` fwd+bwd at ``layout`` and ``T`` (and the batch)."""
    import nsa.ops.triton as ops

    H, G, D = LAYOUTS[layout]
    B = max(1, tokens // T)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    xs = [x.requires_grad_() for x in attention_inputs("nsa", B, T, H, G, D, device, dt)]
    arch = tuning.assumed_capability(META_CAPABILITY) if device == "meta" else contextlib.nullcontext()
    with arch, recording(execute=device != "meta") as launches:
        out = nsa_attention(ops, *xs)
        out.backward(torch.ones_like(out) if device == "meta" else torch.randn_like(out))
    return launches, B


def sweep(launch: TunedLaunch, rep_ms: int) -> list[dict[str, Any]]:
    """Each config of ``launch``: milliseconds, ratio to the default, agreement with it."""
    configs = launch.configs()
    launch.run(configs[0])
    reference = [t.clone() for t in _tensors(launch)]
    bar = 1e-2 if any(t.dtype in (torch.float16, torch.bfloat16) for t in reference) else 1e-5
    rows = []
    for i, config in enumerate(configs):
        ms = _time(launch, config, rep_ms)
        diff = _disagreement(_tensors(launch), reference)
        rows.append(dict(kernel=launch.name, branch=launch.branch, config=describe(config),
                         default=i == 0, ms=ms, agrees=diff <= bar, rel_diff=diff))
        launch.run(configs[0])
    base = rows[0]["ms"]
    for r in rows:
        r["vs_default"] = r["ms"] / base if base else None
    return rows


def _time(launch: TunedLaunch, config: Any, rep_ms: int) -> float:
    """Median ms of the launch with ``config`` (its compile happens in the warm-up); on CPU
    one interpreted launch, timed only to show the tool works."""
    if _tensors(launch)[0].is_cuda:
        from triton.testing import do_bench

        return float(do_bench(lambda: launch.run(config), warmup=max(1, rep_ms // 4), rep=rep_ms,
                              return_mode="median"))
    return time_cuda(lambda _: launch.run(config), None, 0, 1)[0]


def format_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| layout | T | batch | kernel | branch | config | ms | / default | agrees |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = "-" if r["ms"] is None else f"{r['ms']:.3f}"
        ratio = "-" if r.get("vs_default") is None else f"{r['vs_default']:.2f}"
        agrees = "-" if r.get("agrees") is None else ("yes" if r["agrees"] else f"NO ({r['rel_diff']:.1e})")
        mark = " (default)" if r["default"] else ""
        out.append(f"| {r['layout']} | {r['T']} | {r['batch']} | `{r['kernel']}` | {r['branch']} | "
                   f"{r['config']}{mark} | {ms} | {ratio} | {agrees} |")
    return out


def fastest(rows: list[dict[str, Any]]) -> list[str]:
    """One line per launch whose fastest agreeing config is not the default."""
    lines = []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["layout"], r["T"], r["kernel"], r["branch"], r["launch"]), []).append(r)
    for key, group in groups.items():
        timed = [r for r in group if r["ms"] is not None and r["agrees"]]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["ms"])
        if not best["default"]:
            lines.append(f"- {key[0]} T {key[1]} `{key[2]}` ({key[3]}): {best['config']} is "
                         f"{1 / best['vs_default']:.2f}x the default's speed")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tiles", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    ap.add_argument("--seqs", nargs="+", type=int, default=[16384, 65536])
    ap.add_argument("--tokens", type=int, default=65536, help="batch = tokens // seq (bench.run's)")
    ap.add_argument("--kernels", nargs="+", default=None, metavar="NAME",
                    help="only these kernels (e.g. _band_bwd_dkdv); default: every tunable one launched")
    ap.add_argument("--rep-ms", type=int, default=100,
                    help="milliseconds of timed launches per config on CUDA (do_bench's rep)")
    ap.add_argument("--device", choices=["cuda", "cpu", "meta"],
                    default="cuda" if torch.cuda.is_available() else "meta")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (--device meta lists the launches)")
    if args.device == "cpu" and not tuning._interpreting():
        ap.error("--device cpu runs the kernels in Triton's interpreter: "
                 "set TRITON_INTERPRET=1 before starting")
    where = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    meta = dict(device=where, torch=torch.__version__, triton=_triton_version())
    rows: list[dict[str, Any]] = []
    for layout in args.layouts:
        for T in args.seqs:
            launches, B = capture(layout, T, args.tokens, args.device)
            for n, launch in enumerate(launches):
                if args.kernels and launch.name not in args.kernels:
                    continue
                if args.device == "meta":
                    got = [dict(kernel=launch.name, branch=launch.branch, config=describe(c), default=i == 0,
                                ms=None, agrees=None, rel_diff=None, vs_default=None)
                           for i, c in enumerate(launch.configs())]
                else:
                    got = sweep(launch, args.rep_ms)
                for r in got:
                    r.update(layout=layout, T=T, batch=B, launch=n)
                rows += got
                print("\n".join(format_table(got)[2:]), flush=True)
                if args.json:  # after every launch: a run stopped by its time limit keeps its rows
                    args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
            del launches
            if args.device == "cuda":
                torch.cuda.empty_cache()
    print(f"\n## Tile configs, {where}\n")
    print("\n".join(format_table(rows)))
    lines = fastest(rows)
    if lines:
        print("\nFaster than the default:\n" + "\n".join(lines))
    return 0


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
