"""Per-GPU table (memory bar, utilisation, power, temperature, rank) and host CPU/RAM/disk."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from nsa_tui.app.fmt import bar, fmt_pair_bytes, fmt_pct, is_num
from nsa_tui.app.state import PanelState


def pick(d: dict[str, Any], *names: str) -> Any:
    """The first present field among `names` (agents may name a field two ways)."""
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return None


def ranks_by_gpu(state: PanelState) -> dict[str, list[int]]:
    """Which rank of the selected run is on which GPU (by uuid and by index)."""
    run = state.selected_run()
    out: dict[str, list[int]] = {}
    if run is None:
        return out
    for rank, beat in sorted(run.heartbeats.items()):
        dev = beat.get("device") or {}
        if dev.get("type") != "cuda":
            continue
        # the uuid when known: under CUDA_VISIBLE_DEVICES (a fallback run) a rank's index is
        # its own numbering, so index 0 would also name the host's GPU 0
        key = dev.get("uuid") or f"#{dev.get('index')}"
        out.setdefault(str(key), []).append(rank)
    return out


def host_line(sample: dict[str, Any]) -> Text:
    """CPU %, RAM used/total, disk used/total; N/A where the agent did not say."""
    ram, disk = sample.get("ram") or {}, sample.get("disk") or {}
    cpu = pick(sample, "cpu_pct", "cpu_percent")
    mem_u, mem_t = pick(ram, "used_bytes"), pick(ram, "total_bytes")
    disk_u, disk_t = pick(disk, "used_bytes"), pick(disk, "total_bytes")
    t = Text()
    t.append("CPU ", style="bold")
    t.append(fmt_pct(cpu))
    t.append("  RAM ", style="bold")
    t.append(fmt_pair_bytes(mem_u, mem_t))
    t.append("  disk ", style="bold")
    t.append(fmt_pair_bytes(disk_u, disk_t))
    return t


def gpu_line(g: dict[str, Any], i: int, ranks: dict[str, list[int]], wide: bool) -> Text:
    """'0 ██████░░ 61.2/80.0 GiB  97 % 312 W 64 °C  rank 0' (two lines when narrow)."""
    idx = pick(g, "index")
    idx = i if idx is None else idx
    used = pick(g, "mem_used_bytes", "memory_used_bytes", "mem_used")
    total = pick(g, "mem_total_bytes", "memory_total_bytes", "mem_total")
    frac = used / total if is_num(used) and is_num(total) and total else None
    util = pick(g, "util_pct", "util_percent")
    power = pick(g, "power_w", "power")
    temp = pick(g, "temp_c", "temperature_c", "temp")
    on = ranks.get(str(pick(g, "uuid")), []) or ranks.get(f"#{idx}", [])
    on = on or sorted({r.get("rank") for r in g.get("ranks") or [] if r.get("rank") is not None})
    t = Text()
    t.append(f"GPU{idx} ", style="bold")
    t.append(bar(frac, 8), style="red" if is_num(frac) and frac > 0.95 else "green")
    t.append(f" {fmt_pair_bytes(used, total)}")
    t.append("\n  " if not wide else "  ")
    t.append(f"{fmt_pct(util)} {f'{power:.0f} W' if is_num(power) else 'N/A W'}"
             f" {f'{temp:.0f} °C' if is_num(temp) else 'N/A °C'}")
    t.append(f" rank {','.join(map(str, on))}" if on else " no rank", style="cyan" if on else "dim")
    return t


class GpuTable(Static):
    """GPUs of the selected run's host, or 'no GPU' honestly."""

    _sig: tuple = ()
    _lines: tuple = ()

    def update_from(self, state: PanelState, now: float) -> None:
        host = state.current_host()
        sample = host.sample if host else {}
        ranks = ranks_by_gpu(state)
        sig = (id(sample), sample.get("ts"), self.size.width, tuple((k, tuple(v)) for k, v in ranks.items()))
        if sig == self._sig:
            return
        self._sig = sig
        gpus = sample.get("gpus") or []
        parts: list[Any] = [host_line(sample)]
        if not gpus:
            why = str(sample.get("gpu_message") or "none on this host").split(":")[0]
            parts.append(Text(f"GPUs: N/A — {why}" if sample else "GPUs: N/A (no sample yet)", style="dim"))
        else:
            wide = self.size.width >= 60
            for i, g in enumerate(gpus):
                parts.append(gpu_line(g, i, ranks, wide))
        from rich.console import Group

        lines = (sum(str(p).count("\n") + 1 if isinstance(p, Text) else 1 for p in parts), self.size.width)
        self.update(Group(*parts), layout=lines != self._lines)  # re-layout only when the height changes
        self._lines = lines
