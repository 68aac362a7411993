"""The words of the confirmations of k (stop), f (fall back) and r (resume): exactly what will
happen, to which processes, from which checkpoint, with which batch. Pure functions of the
run the panel shows and the host's plan (``plan`` op), so they are tested without a screen."""

from __future__ import annotations

from nsa.contract.replies import ActionPlan
from nsa.contract.rundir import step_name
from nsa_tui.app.state import RunState

FULL_STATE = "full state (weights, optimizer, step, LR schedule, data position)"


def _pids(pids: list[int]) -> str:
    shown = ", ".join(str(p) for p in pids[:8])
    return f" (pids {shown}{', …' if len(pids) > 8 else ''})" if pids else ""


def _stop(plan: ActionPlan, host: str, grace_s: float) -> str:
    ranks = plan.rank_pids
    others = [p for p in plan.pids if p not in ranks]
    n = len(plan.pids)
    text = f"SIGTERM to the {n} process{'es' if n != 1 else ''} of {plan.run_id} on {host}: "
    if ranks:
        text += (f"first its {len(ranks)} rank{'s' if len(ranks) != 1 else ''}{_pids(ranks)}, each of which "
                 "finishes its current step, saves a checkpoint and exits")
        if others:
            text += f"; then the launcher{_pids(others)}"
    else:
        text += f"no rank is up yet: the launcher{_pids(others)}"
    return text + f". Whatever remains after {grace_s:.0f} s gets SIGKILL."


def kill_text(run: RunState, grace_s: float, plan: ActionPlan) -> str:
    """``plan``: the host's ``plan`` of the kill (the run's processes as the host sees them now)."""
    info = run.view.info if run.view is not None else None
    total = f"/{info.total_steps}" if info is not None and info.total_steps is not None else ""
    return (_stop(plan, run.host, grace_s) + f"\nIt is at step {run.step}{total}. Nothing of the run is "
            "left running; r resumes it later from that checkpoint.")


def relaunch_text(plan: ActionPlan, run: RunState, grace_s: float) -> tuple[str, str, str]:
    """(title, body, yes-button label) of the confirmation of a fallback or resume."""
    if plan.again:
        return (f"{plan.op.capitalize()} of {run.name} was done before",
                f"A {plan.op} of {plan.run_id} already started {plan.again}. Yes selects that run; nothing "
                "new starts.", "Select it")
    ckpt = step_name(plan.checkpoint_step) if plan.checkpoint_step is not None else "the newest checkpoint"
    where = f" ({plan.checkpoint})" if plan.checkpoint else ""
    if plan.started_from:  # stopped before its first save: the checkpoint it was started from
        where += ", the checkpoint it started from (it saved none of its own)"
    batch = ""
    if plan.global_batch:
        accum = f" with grad_accum {plan.grad_accum}" if plan.grad_accum else ""
        batch = f" The global batch stays {plan.global_batch} sequences{accum}."
    device = run.view.info.device if run.view is not None else None
    if plan.op == "fallback":
        gpu = f"on GPU {plan.gpu} (the most free memory)" if plan.gpu is not None else "on one GPU"
        on = "on CPU" if device == "cpu" else gpu
        step1 = (f"1. Stop: {_stop(plan, run.host, grace_s)}" if plan.alive
                 else f"1. {plan.run_id} is not running: nothing to stop.")
        newest = (f"the checkpoint the stop saves (newest now: {ckpt}{where})" if plan.alive
                  else f"{ckpt}{where}")
        body = (f"{step1}\n2. Start {plan.name}: 1 process {on}, from {newest}, with {FULL_STATE}.{batch}"
                f"\nThe new run is linked to {plan.run_id} and selected; its chart continues from here.")
        return f"Fall back to one process: {run.name}?", body, "Fall back"
    n = plan.nproc
    body = (f"Start {plan.name}: {n} process{'es' if n != 1 else ''} from {ckpt}{where}, with {FULL_STATE}."
            f"{batch}\n{plan.run_id} stays as it is ({run.status.value}); the new run is linked to it and "
            "selected.")
    return f"Resume {run.name}?", body, "Resume"
