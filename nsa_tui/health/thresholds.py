"""The alert rules' thresholds: how long each phase may go without a step, and the other limits.

Their own module because three places hold them: the rules (``nsa_tui.health.alerts``), the
user's settings file (``nsa_tui.user.settings``, whose ``alerts`` section overrides them) and
the panel's services, which hand them to the detector.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1 << 30


@dataclass
class Thresholds:
    """Seconds unless named otherwise. Tests shrink them; the defaults suit real runs."""

    phase_s: dict[str, float] = field(default_factory=lambda: {
        "boot": 600.0, "data": 600.0, "compile": 1800.0, "checkpoint": 900.0, "eval": 900.0})
    first_step_s: float = 900.0  # train phase before any step time is known
    train_factor: float = 10.0  # x median recent step time
    train_floor_s: float = 60.0
    no_heartbeat_s: float = 30.0  # heartbeats come at least every 5 s in every phase
    quiet_s: float = 5.0  # a stuck rank whose beats lag the others' by this has stopped beating
    drift_steps: int = 2
    throughput_drop: float = 0.3  # the last window's median below this share of the earlier median
    throughput_window_s: float = 60.0  # at least; 5 x the median step time when steps are slower
    throughput_min_points: int = 3  # in the window and before it
    nccl_util_pct: float = 90.0
    nccl_power_frac: float = 0.4
    size_factor: float = 2.0  # params or seq off by more than this factor from the name
    disk_warn_bytes: int = 10 * GIB  # free space of the runs root's file system
    disk_critical_bytes: int = 1 * GIB


THROUGHPUT_WINDOW_MAX_S = 1200.0
BEAT_JITTER_S = 1.0  # ranks' beats lagging each other by less are in step (clock and timer jitter)
