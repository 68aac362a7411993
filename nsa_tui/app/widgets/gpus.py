"""Per-GPU lines (memory, utilisation, power, temperature, rank) and host CPU/RAM/disk.

Every line is built to fit the pane's width (three forms, from one line with a memory bar
to a two-line form for very narrow panes), so the pane's height is exactly its number of
lines: nothing wraps behind its back and the last GPU is never cut off. Eight GPUs take
eight lines.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from nsa.contract import GpuReading, HostSample, on_gpu
from nsa_tui.app.state import HostState, PanelState, RunState
from nsa_tui.fmt import bar, fmt_pair_bytes, fmt_pct, is_num


def ranks_on(gpu: GpuReading, run: RunState | None) -> list[int]:
    """The selected run's ranks on this GPU (nsa.contract.on_gpu, the one placement rule), else
    the ranks the host saw on it by process (any run)."""
    if run is not None:
        mine = sorted(rank for rank, beat in run.beats.items() if on_gpu(gpu, beat))
        if mine:
            return mine
    return sorted({r.rank for r in gpu.ranks if r.rank is not None})


def host_lines(sample: HostSample, width: int) -> list[Text]:
    """CPU %, RAM used/total, disk used/total (N/A where the agent did not say): one line
    when it fits, else two."""
    cpu = Text.assemble(("CPU ", "bold"), fmt_pct(sample.cpu_pct))
    ram = Text.assemble(("RAM ", "bold"), fmt_pair_bytes(sample.ram.used_bytes, sample.ram.total_bytes))
    disk = Text.assemble(("disk ", "bold"), fmt_pair_bytes(sample.disk.used_bytes, sample.disk.total_bytes))
    lines = [Text("  ").join([cpu, ram, disk])]
    if lines[0].cell_len > width:
        lines = [Text("  ").join([cpu, ram]), disk]
    for t in lines:
        t.no_wrap, t.overflow = True, "ellipsis"
    return lines


def _power_temp(g: GpuReading, compact: bool) -> str:
    power, temp = g.power_w, g.temp_c
    sep = "" if compact else " "
    return (f"{f'{power:.0f}{sep}W' if is_num(power) else 'N/A W'}"
            f" {f'{temp:.0f}{sep}°C' if is_num(temp) else 'N/A °C'}")


def gpu_lines(g: GpuReading, on: list[int], width: int) -> list[Text]:
    """One GPU in the widest form that fits: 'GPU0 ████████ 61.2/80.0 GiB  97 % 312 W 64 °C
    rank 0', else 'GPU0 61/80 GiB 97% 312W 64°C r0', else that on two lines."""
    used, total = g.mem_used_bytes, g.mem_total_bytes
    frac = used / total if used is not None and total else None
    mem_style = "red" if is_num(frac) and frac > 0.95 else ""
    ranks = ",".join(map(str, on))
    name = Text(f"GPU{g.index} ", style="bold")
    wide = name.copy()
    wide.append(bar(frac, 8), style="red" if mem_style else "green")
    wide.append(f" {fmt_pair_bytes(used, total)}  {fmt_pct(g.util_pct)} {_power_temp(g, False)}")
    wide.append(f"  rank {ranks}" if on else "  no rank", style="cyan" if on else "dim")
    util = f"{g.util_pct:.0f}%" if is_num(g.util_pct) else "N/A"
    first = name.copy()
    first.append(fmt_pair_bytes(used, total, short=True), style=mem_style)
    rest = Text(f"{util} {_power_temp(g, True)}")
    rest.append(f" r{ranks}" if on else " ·", style="cyan" if on else "dim")
    one = Text(" ").join([first, rest])
    lines = next((form for form in ([wide], [one]) if form[0].cell_len <= width), [first, Text("  ") + rest])
    for t in lines:
        t.no_wrap, t.overflow = True, "ellipsis"
    return lines


class GpuTable(VerticalScroll):
    """GPUs of the selected run's host (of each of its hosts for a run over several hosts), or
    'no GPU' honestly. A pane too short for every GPU
    says so in its border and scrolls (tab to it, then the arrow keys)."""

    DEFAULT_CSS = """
    GpuTable > Static { height: auto; }
    """

    _sig: tuple = ()
    _height: tuple = ()

    def compose(self) -> ComposeResult:
        yield Static(id="gpu-lines")

    @property
    def content(self) -> object:
        """What the pane shows (its lines' renderable), as a Static's ``content``."""
        return self.query_one("#gpu-lines", Static).content

    def update_from(self, state: PanelState, now: float) -> None:
        run = state.selected_run()
        parts = state.parts_of(run) if run is not None else []
        shown: list[tuple[HostState | None, RunState | None]]
        if len(parts) > 1:  # a run over several hosts: each host's GPUs with that host's ranks
            shown = [(state.hosts.get(p.host), p) for p in parts]
        else:
            shown = [(state.current_host(), run)]
        samples = [h.sample if h else None for h, _ in shown]
        placed = [[ranks_on(g, r) for g in (s.gpus or [])] if s else [] for s, (_, r) in zip(samples, shown)]
        width = self.scrollable_content_region.width or self.size.width  # without a scroll bar
        more = self.max_scroll_y > 0
        sig = (tuple((id(s), s.ts if s else None) for s in samples), width,
               tuple(tuple(map(tuple, p)) for p in placed), more)
        if sig == self._sig:
            return
        self._sig = sig
        lines: list[Text] = []
        for (host, _r), sample, on_gpus in zip(shown, samples, placed):
            if len(shown) > 1:
                lines.append(Text(host.dest if host else "?", style="bold underline"))
            lines += self._host_lines(sample, on_gpus, width)
        height = (len(lines), width)
        # re-layout only when the height changes
        self.query_one("#gpu-lines", Static).update(Group(*lines), layout=height != self._height)
        self._height = height
        count = sum(len(s.gpus or []) for s in samples if s)
        subtitle = (f"{count} GPUs" if count > 2 else "") + (" · more: tab, ↓" if more else "")
        self.border_subtitle = subtitle or None

    @staticmethod
    def _host_lines(sample: HostSample | None, placed: list[list[int]], width: int) -> list[Text]:
        if sample is None:
            return [Text("GPUs: N/A (no sample yet)", style="dim")]
        lines = host_lines(sample, width)
        if not sample.gpus:
            why = (sample.gpu_message or "none on this host").split(":")[0]
            lines.append(Text(f"GPUs: N/A — {why}", style="dim", no_wrap=True, overflow="ellipsis"))
        else:
            for g, on in zip(sample.gpus, placed):
                lines += gpu_lines(g, on, width)
        return lines
