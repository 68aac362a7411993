"""``python -m nsa.infer.worker``: one sample from a run's checkpoint, as event lines.

The agent runs this in a process of its own (torch stays out of the agent, and a crash or
an out-of-memory here ends this process only). The job is one JSON line on stdin
(:class:`Job`); stdout gets ``{"event": kind, "data": ...}`` lines whose data are the
protocol's records (``sample_start``, ``sample_text``..., ``sample_done``), or one
``error`` line (ErrorInfo: ``no_checkpoint``, ``bad_checkpoint``, ``sample_failed``) and
exit status 1.
"""

from __future__ import annotations

import codecs
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from nsa.contract.protocol import ErrorInfo, SampleDone, SampleStart, SampleText


class Job(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    run: str
    run_dir: str
    step: int | None = None
    prompt: str = ""
    max_new_tokens: int = 200
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    device: str = "cpu"


def emit(event: str, data: Any) -> None:
    """One event line on stdout, which the agent relays to its client as it comes."""
    sys.stdout.buffer.write(msgspec.json.encode({"event": event, "data": data}) + b"\n")
    sys.stdout.buffer.flush()


def run(job: Job) -> None:
    """Load, prefill, then stream tokens as text (stopping at end-of-text)."""
    import torch

    from nsa.infer.graph import CUDA_GRAPH, decode_path
    from nsa.infer.load import find_checkpoint, load_model
    from nsa.infer.sample import stream
    from nsa.train.tokenizer import build_tokenizer

    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    path = find_checkpoint(Path(job.run_dir), job.step)
    model, cfg, meta = load_model(path, job.device)
    tok = build_tokenizer(cfg.data)
    prompt_tokens = [tok.eot, *(int(t) for t in tok.encode(job.prompt))]
    step = meta.step
    device = str(next(model.parameters()).device)
    how, why = decode_path(device)
    emit("sample_start", SampleStart(run=job.run, checkpoint=path.name, step=step, device=device,
                                      tokenizer=tok.name, seed=job.seed, prompt_tokens=prompt_tokens,
                                      decode_path=how if how == CUDA_GRAPH else f"{how} ({why})"))
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tokens: list[int] = []
    pieces: list[str] = []
    stop = "max_new_tokens"
    t0 = time.monotonic()
    for new in stream(model, [prompt_tokens], job.max_new_tokens, job.temperature, job.top_k, job.top_p,
                      job.seed):
        t = int(new[0])
        tokens.append(t)
        piece = text.decode(tok.token_bytes([t]))
        pieces.append(piece)
        emit("sample_text", SampleText(text=piece, tokens=[t]))
        if t == tok.eot:
            stop = "eot"
            break
    tail = text.decode(b"", final=True)
    if tail:
        pieces.append(tail)
        emit("sample_text", SampleText(text=tail, tokens=[]))
    emit("sample_done", SampleDone(run=job.run, checkpoint=path.name, step=step, device=device,
                                    seed=job.seed,
                                    prompt=job.prompt, prompt_tokens=prompt_tokens, text="".join(pieces),
                                    tokens=tokens, stop=stop,  # type: ignore[arg-type]
                                    seconds=round(time.monotonic() - t0, 3)))


def main() -> int:
    """Read the job, run it; any failure is one ``error`` line (its code says what kind)."""
    from nsa.infer.load import NoCheckpoint
    from nsa.train.checkpoint_error import CheckpointError

    try:
        job = msgspec.json.decode(sys.stdin.buffer.readline(), type=Job)
        run(job)
    except NoCheckpoint as exc:  # gone since the agent looked (pruned by the live run)
        emit("error", ErrorInfo(code="no_checkpoint", message=str(exc)))
        return 1
    except CheckpointError as exc:
        emit("error", ErrorInfo(code="bad_checkpoint", message=str(exc)))
        return 1
    except Exception as exc:  # noqa: BLE001 - the agent shows it; the process ends here
        emit("error", ErrorInfo(code="sample_failed", message=f"{type(exc).__name__}: {exc}"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
