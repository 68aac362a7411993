"""Host samples: per-GPU readings through NVML, CPU/RAM/disk through psutil.

NVML sits behind ``GpuSource`` so tests can feed fake readings, and so that a host
without NVML, without a driver or with a lost GPU yields N/A values and a message,
never a crash. Likewise a host without psutil (nsa-tui installed without its ``host``
extra) samples CPU and RAM as N/A and says so in ``HostSampler.problems``.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Protocol

try:
    import psutil
except ImportError:  # the panel-only install: readings are N/A, hello names the problem
    psutil = None  # type: ignore[assignment]  # an optional import: None when absent

from nsa.contract import GpuReading, HostSample
from nsa.contract.records import GpuRank, Usage
from nsa_tui.agent.procs import RUN_KEYS, environ_of, rank_of


class GpuSource(Protocol):
    """Where GPU readings come from. ``read`` returns (gpus or None, message)."""

    def read(self) -> tuple[list[GpuReading] | None, str]: ...

    def count(self) -> int: ...


def _na(fn: Any, *args: Any) -> Any:
    """Call one NVML getter; any NVML error (lost GPU, unsupported) gives None (N/A)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises many error classes; each means N/A
        return None


class NvmlSource:
    """Real NVML (module ``pynvml`` from nvidia-ml-py)."""

    def __init__(self) -> None:
        self.message = ""
        self.ok = False
        self.missing = False  # the module itself is absent (an install problem, not a GPU-less host)
        try:
            import pynvml
        except ImportError:
            self.missing = True
            self.message = "NVML unavailable: nvidia-ml-py not installed (pip install 'nsa-tui[host]')"
            return
        try:
            self.nv = pynvml
            pynvml.nvmlInit()
            self.ok = True
        except Exception as exc:  # noqa: BLE001 - library missing, no driver, ...
            self.message = f"NVML unavailable: {type(exc).__name__}: {exc}".strip()

    def count(self) -> int:
        if not self.ok:
            return 0
        return _na(self.nv.nvmlDeviceGetCount) or 0

    def read(self) -> tuple[list[GpuReading] | None, str]:
        if not self.ok:
            return None, self.message
        nv = self.nv
        n = _na(nv.nvmlDeviceGetCount)
        if n is None:
            return None, "NVML: cannot count GPUs (driver gone?)"
        gpus = []
        notes = []
        for i in range(n):
            h = _na(nv.nvmlDeviceGetHandleByIndex, i)
            if h is None:
                gpus.append(GpuReading(index=i))
                notes.append(f"GPU {i} not reachable")
                continue
            mem = _na(nv.nvmlDeviceGetMemoryInfo, h)
            util = _na(nv.nvmlDeviceGetUtilizationRates, h)
            power = _na(nv.nvmlDeviceGetPowerUsage, h)
            limit = _na(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            temp = _na(nv.nvmlDeviceGetTemperature, h, 0)  # 0: NVML_TEMPERATURE_GPU
            procs = _na(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
            name = _na(nv.nvmlDeviceGetName, h)
            gpus.append(GpuReading(
                index=i, name=_str(name), uuid=_str(_na(nv.nvmlDeviceGetUUID, h)),
                mem_used_bytes=mem.used if mem else None, mem_total_bytes=mem.total if mem else None,
                util_pct=util.gpu if util else None, power_w=power / 1000.0 if power is not None else None,
                power_limit_w=limit / 1000.0 if limit is not None else None, temp_c=temp,
                pids=[p.pid for p in procs]))
        return gpus, "; ".join(notes)


def _str(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


class HostSampler:
    """One sample per call: GPUs (or None + message), CPU %, RAM and disk of the runs root."""

    def __init__(self, runs_root: str, gpu_source: GpuSource | None = None) -> None:
        self.runs_root = runs_root
        self.gpu = gpu_source if gpu_source is not None else NvmlSource()
        missing = getattr(self.gpu, "missing", False)  # NvmlSource without NVML says why in ``message``
        self.problems: list[str] = [getattr(self.gpu, "message", "")] if missing else []
        if psutil is None:
            self.problems.append("psutil not installed: CPU and RAM are N/A (pip install 'nsa-tui[host]')")
        else:
            psutil.cpu_percent(None)  # prime: the first call has no interval to measure

    def sample(self) -> HostSample:
        """Each GPU also lists ``ranks``: the run id and rank of the processes on it."""
        gpus, message = self.gpu.read()
        for g in gpus or []:
            g.ranks = []
            for pid in g.pids:
                env = environ_of(pid, RUN_KEYS)
                if env.get("NSA_RUN_ID"):
                    g.ranks.append(GpuRank(pid=pid, run=env["NSA_RUN_ID"], rank=rank_of(env)))
        ram = Usage()
        if psutil is not None:
            vm = psutil.virtual_memory()
            ram = Usage(used_bytes=vm.total - vm.available, total_bytes=vm.total)
        try:
            du = shutil.disk_usage(self.runs_root if os.path.exists(self.runs_root) else "/")
            disk = Usage(used_bytes=du.used, total_bytes=du.total, free_bytes=du.free)
        except OSError:
            disk = Usage()
        return HostSample(ts=time.time(), gpus=gpus, gpu_message=message,
                          cpu_pct=psutil.cpu_percent(None) if psutil is not None else None,
                          cpu_count=os.cpu_count(), load_avg=list(os.getloadavg()), ram=ram, disk=disk)
