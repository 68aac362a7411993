"""Per-GPU table (memory bar, utilisation, power, temperature, rank) and host CPU/RAM/disk."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from nsa.contract import GpuReading, HostSample, on_gpu
from nsa_tui.app.state import PanelState, RunState
from nsa_tui.fmt import bar, fmt_pair_bytes, fmt_pct, is_num


def ranks_on(gpu: GpuReading, run: RunState | None) -> list[int]:
    """The selected run's ranks on this GPU (nsa.contract.on_gpu, the one placement rule), else
    the ranks the host saw on it by process (any run)."""
    if run is not None:
        mine = sorted(rank for rank, beat in run.beats.items() if on_gpu(gpu, beat))
        if mine:
            return mine
    return sorted({r.rank for r in gpu.ranks if r.rank is not None})


def host_line(sample: HostSample) -> Text:
    """CPU %, RAM used/total, disk used/total; N/A where the agent did not say."""
    t = Text()
    t.append("CPU ", style="bold")
    t.append(fmt_pct(sample.cpu_pct))
    t.append("  RAM ", style="bold")
    t.append(fmt_pair_bytes(sample.ram.used_bytes, sample.ram.total_bytes))
    t.append("  disk ", style="bold")
    t.append(fmt_pair_bytes(sample.disk.used_bytes, sample.disk.total_bytes))
    return t


def gpu_line(g: GpuReading, on: list[int], wide: bool) -> Text:
    """'0 ██████░░ 61.2/80.0 GiB  97 % 312 W 64 °C  rank 0' (two lines when narrow)."""
    used, total = g.mem_used_bytes, g.mem_total_bytes
    frac = used / total if used is not None and total else None
    power, temp = g.power_w, g.temp_c
    t = Text()
    t.append(f"GPU{g.index} ", style="bold")
    t.append(bar(frac, 8), style="red" if is_num(frac) and frac > 0.95 else "green")
    t.append(f" {fmt_pair_bytes(used, total)}")
    t.append("\n  " if not wide else "  ")
    t.append(f"{fmt_pct(g.util_pct)} {f'{power:.0f} W' if is_num(power) else 'N/A W'}"
             f" {f'{temp:.0f} °C' if is_num(temp) else 'N/A °C'}")
    t.append(f" rank {','.join(map(str, on))}" if on else " no rank", style="cyan" if on else "dim")
    return t


class GpuTable(Static):
    """GPUs of the selected run's host (of each of its hosts for a run over several hosts), or
    'no GPU' honestly."""

    _sig: tuple = ()
    _lines: tuple = ()

    def update_from(self, state: PanelState, now: float) -> None:
        run = state.selected_run()
        parts = state.parts_of(run) if run is not None else []
        if len(parts) > 1:  # each host's GPUs with that host's ranks
            shown = [(state.hosts.get(p.host), p) for p in parts]
        else:
            shown = [(state.current_host(), run)]
        samples = [h.sample if h else None for h, _ in shown]
        placed = [[ranks_on(g, r) for g in (s.gpus or [])] if s else [] for s, (_, r) in zip(samples, shown)]
        sig = (tuple((id(s), s.ts if s else None) for s in samples), self.size.width,
               tuple(tuple(map(tuple, p)) for p in placed))
        if sig == self._sig:
            return
        self._sig = sig
        out: list[Any] = []
        for (host, _r), sample, on_gpus in zip(shown, samples, placed):
            if len(shown) > 1:
                out.append(Text(host.dest if host else "?", style="bold underline"))
            out += self._host_lines(sample, on_gpus)
        from rich.console import Group

        lines = (sum(str(p).count("\n") + 1 if isinstance(p, Text) else 1 for p in out), self.size.width)
        self.update(Group(*out), layout=lines != self._lines)  # re-layout only when the height changes
        self._lines = lines

    def _host_lines(self, sample: HostSample | None, placed: list[list[int]]) -> list[Any]:
        if sample is None:
            return [Text("GPUs: N/A (no sample yet)", style="dim")]
        out: list[Any] = [host_line(sample)]
        if not sample.gpus:
            why = (sample.gpu_message or "none on this host").split(":")[0]
            out.append(Text(f"GPUs: N/A — {why}", style="dim"))
        else:
            wide = self.size.width >= 60
            out += [gpu_line(g, on, wide) for g, on in zip(sample.gpus, placed)]
        return out
