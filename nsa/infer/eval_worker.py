"""``python -m nsa.infer.eval_worker``: a long-context evaluation of a run's checkpoint, as
event lines.

Like the sample worker (nsa/infer/worker.py): the agent runs it in a process of its own and
forwards its lines. The job is one JSON line on stdin (:class:`Job`); stdout gets
``{"event": kind, "data": ...}`` lines: ``eval_start``, ``eval_progress``... and
``eval_done`` (the PasskeyEval record, appended to the run's eval/passkey.jsonl before it is
sent), or one ``error`` line (``no_checkpoint``, ``bad_checkpoint``, ``bad_request``,
``eval_failed``) and exit status 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from nsa.contract.evals import EvalStart, append_eval
from nsa.contract.protocol import ErrorInfo
from nsa.infer.worker import emit


class Job(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    run: str
    run_dir: str
    step: int | None = None
    lengths: list[int]
    depths: list[float]
    trials: int = 1
    seed: int = 0
    digits: int = 5
    buckets: int = 8
    loss_sequences: int = 4
    device: str = "cpu"


def run(job: Job) -> None:
    """Load, evaluate with progress events, append the record, send it."""
    import torch

    from nsa.infer.evaluate import EvalPlan, check_plan, evaluate, make_record, val_windows
    from nsa.infer.load import find_checkpoint, load_model
    from nsa.infer.passkey import fixed_tokens
    from nsa.train.tokenizer import build_tokenizer

    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    run_dir = Path(job.run_dir)
    path = find_checkpoint(run_dir, job.step)
    model, cfg, meta = load_model(path, job.device)
    tok = build_tokenizer(cfg.data)
    plan = EvalPlan(lengths=job.lengths, depths=job.depths, trials=job.trials, seed=job.seed,
                    digits=job.digits, buckets=job.buckets, loss_sequences=job.loss_sequences)
    check_plan(plan, fixed_tokens(tok.encode, plan.digits))  # refused before the start is announced
    device = str(next(model.parameters()).device)
    emit("eval_start", EvalStart(run=job.run, checkpoint=path.name, step=meta.step, device=device,
                                  seed=job.seed, trained_context=cfg.train.seq_len, lengths=job.lengths,
                                  depths=job.depths, trials=job.trials, total=plan.total()))
    windows = val_windows(cfg, tok, max(job.lengths)) if job.loss_sequences else None
    result = evaluate(model, tok, plan, windows, progress=lambda ev: emit("eval_progress", ev))
    record = make_record(result, plan, run=job.run, step=meta.step, cfg=cfg, device=device, origin="cli")
    append_eval(run_dir, record)
    emit("eval_done", record)


def main() -> int:
    """Read the job, run it; any failure is one ``error`` line (its code says what kind)."""
    from nsa.infer.load import NoCheckpoint
    from nsa.train.checkpoint_error import CheckpointError

    try:
        job = msgspec.json.decode(sys.stdin.buffer.readline(), type=Job)
        run(job)
    except NoCheckpoint as exc:
        emit("error", ErrorInfo(code="no_checkpoint", message=str(exc)))
        return 1
    except CheckpointError as exc:
        emit("error", ErrorInfo(code="bad_checkpoint", message=str(exc)))
        return 1
    except ValueError as exc:  # the plan (a length too short for the prompt)
        emit("error", ErrorInfo(code="bad_request", message=str(exc)))
        return 1
    except Exception as exc:  # noqa: BLE001 - the agent shows it; the process ends here
        emit("error", ErrorInfo(code="eval_failed", message=f"{type(exc).__name__}: {exc}"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
