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
    """GPUs of the selected run's host, or 'no GPU' honestly."""

    _sig: tuple = ()
    _lines: tuple = ()

    def update_from(self, state: PanelState, now: float) -> None:
        host = state.current_host()
        sample = host.sample if host else None
        run = state.selected_run()
        placed = [ranks_on(g, run) for g in (sample.gpus or [])] if sample else []
        sig = (id(sample), sample.ts if sample else None, self.size.width, tuple(map(tuple, placed)))
        if sig == self._sig:
            return
        self._sig = sig
        parts: list[Any] = []
        if sample is None:
            parts.append(Text("GPUs: N/A (no sample yet)", style="dim"))
        else:
            parts.append(host_line(sample))
            if not sample.gpus:
                why = (sample.gpu_message or "none on this host").split(":")[0]
                parts.append(Text(f"GPUs: N/A — {why}", style="dim"))
            else:
                wide = self.size.width >= 60
                for g, on in zip(sample.gpus, placed):
                    parts.append(gpu_line(g, on, wide))
        from rich.console import Group

        lines = (sum(str(p).count("\n") + 1 if isinstance(p, Text) else 1 for p in parts), self.size.width)
        self.update(Group(*parts), layout=lines != self._lines)  # re-layout only when the height changes
        self._lines = lines
