"""A Slurm job's state in words, for ``status``, ``runs`` and the panel (pure)."""

from __future__ import annotations

from nsa.contract.slurm import FINAL_STATES, QUEUED_STATES, SlurmState


def job_text(st: SlurmState) -> str:
    """``job 12 PENDING (Priority), expected start 2026-11-26T03:00:00`` / ``job 12 RUNNING on
    gpu[01-02]`` / ``job 12 TIMEOUT, exit code 0``; requeues counted."""
    out = f"job {st.job_id} {st.state}"
    if st.state in QUEUED_STATES:
        if st.reason:
            out += f" ({st.reason})"
        if st.start_time:
            out += f", expected start {st.start_time}"
    elif st.state in FINAL_STATES:
        if st.signal:
            out += f", killed by signal {st.signal}"
        elif st.exit_code is not None:
            out += f", exit code {st.exit_code}"
    elif st.nodes:
        out += f" on {st.nodes}"
    if st.restarts:
        out += f", requeued {st.restarts}x"
    return out


def short_text(st: SlurmState) -> str:
    """For a table cell: the pending reason, else the node list, else the end state."""
    if st.state in QUEUED_STATES:
        return st.reason or st.state
    if st.state in FINAL_STATES:
        return st.state
    return st.nodes or st.state
