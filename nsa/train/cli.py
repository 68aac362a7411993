"""``nsa-train --config PATH --run-dir DIR [--set section.key=value ...] [--resume auto|PATH]``.

No config, no run: there is no default config (docs/lessons.md). Output is line-buffered even
into a file, and the boot banner says what is being trained, on what, with which batch.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import platform
import socket
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from nsa.contract.rundir import (
    CHECKPOINTS,
    HEARTBEATS,
    NEW_RUN_ID_RE,
    RUN_JSON,
    STACKS,
    new_run_id,
    rank_of_file,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
SAVE_IN_FLIGHT_S = 120.0  # a failing rank waits at most this long for its checkpoint in flight


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nsa-train", description="Train an NSA (or dense) language model; "
                                "run as one process or under torchrun. Writes docs/run-directory.md's files.")
    p.add_argument("--config", required=True, help="YAML config file (required: there is no default)")
    p.add_argument("--run-dir", required=True, help="this run's own directory (created, mode 0700)")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="SECTION.KEY=VALUE",
                   help="override config values, e.g. --set train.steps=100 data.source=synthetic")
    p.add_argument("--parent-run", default=None, metavar="RUN_ID",
                   help=f"the run this one continues (fallback/resume): recorded in {RUN_JSON}")
    p.add_argument("--resume", default=None, metavar="auto|PATH",
                   help="auto: newest complete checkpoint of this run directory (none: start fresh); "
                        "PATH: a checkpoint directory, or a run directory to take its newest from")
    return p.parse_args(argv)


def run_id_for(name: str) -> str:
    """NSA_RUN_ID (set by the agent), else a new id of the one format (``new_run_id``) that every
    rank of a torchrun computes alike without talking: ``--rdzv-id`` when it is such an id
    (every host then has it), else the start time of torchrun's agent (the ranks' parent) and
    a token from the rendezvous id; a fresh one for a single process."""
    rid = os.environ.get("NSA_RUN_ID")
    if rid:
        return rid
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        if NEW_RUN_ID_RE.match(elastic):
            return elastic
        return new_run_id(name, when=parent_started(), token=hashlib.sha1(elastic.encode()).hexdigest()[:4])
    return new_run_id(name)


def parent_started() -> float:
    """When this process's parent started (Unix seconds, from /proc): the same for every rank
    torchrun's agent started; 0.0 where /proc cannot tell (the ranks still agree)."""
    try:
        fields = Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


def versions() -> dict[str, str | None]:
    import torch

    import nsa

    def ver(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": torch.__version__, "triton": ver("triton"),
            "nsa": nsa.__version__}


def other_run(run_dir: Path, run_id: str) -> str | None:
    """The id and status of a different run that already wrote ``run_dir/run.json``, if any
    (one directory, one run). Ranks of this run see their own id and go on."""
    from nsa.contract import read_json

    data = read_json(run_dir / RUN_JSON, dict[str, Any])  # any version's run.json names its run
    other = data.get("run_id") if data else None
    if not other or other == run_id:
        return None
    return f"{other} (status {data.get('status') if data else None})"


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        try:
            reconfigure = getattr(stream, "reconfigure", None)  # TextIOWrapper's (not TextIO's)
            if reconfigure is not None:
                reconfigure(line_buffering=True)  # unbuffered lines even into a file
        except (AttributeError, ValueError):
            pass
    args = parse_args(argv)
    os.umask(0o077)  # every file of the run (checkpoints, stacks, NCCL dumps) is its user's alone
    from nsa.train import threads

    try:  # before torch loads its OpenMP runtime (below)
        cpu = threads.configure()
    except ValueError as exc:
        print(f"nsa-train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from nsa.config import ConfigError, load_config, to_dict

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as exc:
        print(f"nsa-train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    run_id = run_id_for(cfg.name)
    other = other_run(Path(args.run_dir).expanduser(), run_id)
    if other and not args.resume:
        print(f"nsa-train: error: {args.run_dir} already holds run {other}: use a new run directory "
              "(or --resume auto to continue that run)", file=sys.stderr)
        return EXIT_USAGE

    from nsa.contract import PgTimeouts, RunInfo
    from nsa.contract.appended import rotate_bytes
    from nsa.train import distributed as D

    threads.apply(cpu)
    from nsa.train.faults import StackDumper, StopFlag, stop_when_launcher_dies
    from nsa.train.telemetry import Heartbeat, RunRecord, ensure_run_dir

    run_dir = ensure_run_dir(Path(args.run_dir).expanduser().resolve())
    rank, local_rank, world, launched = D.env_ranks()
    stop = StopFlag()
    stop.install()
    stop_when_launcher_dies(launched)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    dumper = StackDumper(run_dir / STACKS, rank)
    dumper.install()

    def log(msg: str) -> None:
        if rank == 0 or msg.startswith("[rank"):  # other ranks speak only about themselves
            print(msg, flush=True)

    try:
        device = D.pick_device(cfg.train, local_rank)
        rotate = rotate_bytes()  # NSA_ROTATE_BYTES: a bad value is said before anything is written
    except (RuntimeError, ValueError) as exc:
        print(f"nsa-train: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if rank == 0:
        import torch

        from nsa.torch_range import outside_tested

        warning = outside_tested(torch.__version__)
        if warning:
            log(f"warning: {warning}")
    hb = Heartbeat(run_dir, run_id, rank, local_rank, world, D.device_record(device),
                   cfg.train.heartbeat_interval_s, rotate_bytes=rotate)
    hb.start()
    record: RunRecord | None = None
    trainer = None
    try:
        from nsa.train import checkpoint as ckpt
        from nsa.train.trainer import Trainer

        if rank == 0:  # before anything can fail, so a failure always has a run.json to land in
            record = RunRecord(run_dir, RunInfo(
                run_id=run_id, name=cfg.name, config_path=cfg.source_path, config=to_dict(cfg),
                world_size=world, batch_size=cfg.train.batch_size, seq_len=cfg.train.seq_len,
                device=str(device), data_source=cfg.data.source, command=list(sys.argv), versions=versions(),
                host=socket.gethostname(), total_steps=cfg.train.steps, parent_run=args.parent_run,
                strategy=cfg.train.strategy, pid=os.getpid(), cpu_threads=cpu,
                pg_timeouts=PgTimeouts(start_s=cfg.train.pg_timeout_start_s, steady_s=cfg.train.pg_timeout_s),
                nnodes=int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)))
        resume = ckpt.resolve(args.resume, run_dir)
        if record and resume:
            record.update(resumed_from=str(resume))
        info = D.init(cfg.train, run_dir, device)
        trainer = Trainer(cfg, run_dir, info, hb, stop, record, resume, log)
        boot = trainer.setup()
        banner(log, cfg, args, run_id, run_dir, world, device, boot, trainer, resume)
        log(threads.describe(cpu))
        if record:
            from nsa.stats import train_flops_per_token

            record.update(param_count=boot["param_count"], grad_accum=boot["grad_accum"],
                          global_batch=boot["global_batch"], dtype=boot["dtype"],
                          data_source=boot["data_source"], resume_note=trainer.resume_note,
                          attention_ops=boot["attention_ops"],
                          train_flops_per_token=train_flops_per_token(cfg.model, cfg.train.seq_len))
        status = trainer.run()
        trainer.finish()
        overhead = trainer.telemetry_s / trainer.train_s if trainer.train_s else 0.0
        if status == "stopped":
            saved = f"checkpoint {trainer.last_ckpt} saved" if trainer.last_ckpt else "no checkpoint"
            reason = f"{stop.reason}: stopped after step {trainer.step}, {saved}"
        else:
            reason = f"finished {trainer.step} steps"
        log(f"{status}: {reason}; telemetry overhead {overhead * 100:.3f}% of step time")
        if record:
            record.update(status=status, exit_reason=reason, ended_at=time.time(), step=trainer.step,
                          tokens=trainer.tokens, telemetry_overhead=overhead)
        hb.stop("done")
        trainer.release()
        left = D.close()  # the final barrier can wait on a slow peer: stack dumps still work there
        if left:  # a defect: they would be torn down at interpreter exit, where gloo can abort
            log(f"warning: the process group was not freed at the end ({len(left)} gloo threads remain: "
                f"{', '.join(sorted(set(left)))})")
        dumper.close()
        return 0
    except BaseException as exc:  # every failure is recorded, then the process exits non-zero
        return fail(exc, rank, run_dir, hb, record, trainer, dumper)


def banner(log: Any, cfg: Any, args: argparse.Namespace, run_id: str, run_dir: Path, world: int, device: Any,
           boot: dict[str, Any], trainer: Any, resume: Path | None) -> None:
    from nsa.config import to_dict

    t = cfg.train
    log(f"nsa-train run {run_id} in {run_dir}")
    log(f"config {cfg.source_path} (overrides: {' '.join(args.set) or 'none'})")
    log("resolved config " + json.dumps(to_dict(cfg), sort_keys=True))
    attn = cfg.model.attention
    chosen = boot["attention_ops"]
    ops = chosen.backend
    check = chosen.self_check
    if chosen.backend == "sdpa" and check is not None:  # dense: RoPE's kernel, checked alone
        failures = "; ".join(check.failures)
        ops += (f" (RoPE kernel checked on {check.device}, {check.dtype}, in {check.seconds:.1f} s)"
                if check.ok else f" (RoPE on torch's formula, its kernel failed the check: {failures})")
    elif chosen.fallback_reason:
        ops += f" (requested {chosen.requested}; FALLBACK: {chosen.fallback_reason})"
    elif chosen.self_check:
        ops += f" (self-check passed on {chosen.self_check.device} in {chosen.self_check.seconds:.1f} s)"
    if chosen.window == "flexattention":
        ops += ", window branch: FlexAttention"
    log(f"model {attn.kind}: {boot['param_count']:,} parameters "
        f"(dim {cfg.model.dim}, {cfg.model.n_layers} layers, vocab {cfg.model.vocab_size}), "
        f"attention ops: {ops}")
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)
    how = t.strategy
    if trainer.flat_grads is not None:  # train.cuda_graph on several ranks (gradsync.py)
        how = "ddp: no DDP wrapper, gradients averaged in one all-reduce per step for train.cuda_graph"
    elif t.strategy == "ddp" and trainer.model is trainer.raw:  # one process (distributed.wrap)
        how = "ddp: one process, no DDP wrapper"
    log(f"world size {world} ({how}{f', {nodes} nodes' if nodes > 1 else ''}), device {device}, "
        f"dtype {boot['dtype']}")
    log(f"process-group timeouts: {t.pg_timeout_start_s:.0f} s while starting and checkpointing, "
        f"{t.pg_timeout_s:.0f} s in steady state; checkpoints {'async' if t.checkpoint_async else 'sync'} "
        "(DCP)")
    log(f"batch: {t.batch_size} sequences per rank x {world} ranks x {boot['grad_accum']} accumulation "
        f"= global batch {boot['global_batch']} sequences = {boot['global_batch'] * t.seq_len:,} tokens "
        f"per optimizer step (seq_len {t.seq_len})")
    log(f"data {boot['data_source']}, tokenizer {cfg.data.tokenizer}, {boot['n_streams']} data streams, "
        f"batches made by a {boot['loader']} (data.loader {cfg.data.loader})")
    if resume:
        log(f"resume from {resume} at step {trainer.step} ({trainer.tokens:,} tokens seen)")
    elif args.resume == "auto":
        log(f"--resume auto: no checkpoint in {run_dir / CHECKPOINTS}: starting from step 0")
    if trainer.resume_note:
        log(trainer.resume_note)


def fail(exc: BaseException, rank: int, run_dir: Path, hb: Any, record: Any, trainer: Any,
         dumper: Any) -> int:
    """Record a failure (status failed, reason with the traceback tail) and exit non-zero
    without waiting on peers that may be gone."""
    from nsa.train.trainer import NonFiniteLoss

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    step = trainer.step if trainer is not None else 0
    if trainer is not None and getattr(trainer, "ckpt", None) is not None:
        # a checkpoint still being written in the background is finished and kept where the other
        # ranks can finish it with us (they are healthy, or stopped together: a NaN); bounded, for
        # a peer that is gone or hung
        bound = min(SAVE_IN_FLIGHT_S, trainer.cfg.train.pg_timeout_s)
        wait_s = None if isinstance(exc, NonFiniteLoss) else bound
        try:
            trainer.ckpt.wait(wait_s)
            trainer.sync_last_checkpoint()
        except Exception:
            pass
    try:
        print(f"[rank {rank}] FAILED at step {step}:\n{tb}", file=sys.stderr, flush=True)
    except OSError:
        pass  # train.log on a full disk: run.json and the heartbeat still say it
    tail = "\n".join(tb.strip().splitlines()[-6:])
    phase = getattr(hb.phase, "value", hb.phase)
    no_space = "" if isinstance(exc, NonFiniteLoss) else out_of_space(exc, run_dir)
    if no_space:
        # kept short: there may be room for nothing but run.json's own blocks
        reason = (f"rank {rank} failed during {phase} after step {step}: no space left on device (ENOSPC): "
                  f"{no_space}; free space on the run directory's disk, then resume")
    elif isinstance(exc, NonFiniteLoss):
        kept = trainer.last_ckpt if trainer and trainer.last_ckpt else None
        ck = f"the last good checkpoint {kept} is kept" if kept else "no checkpoint was saved yet"
        reason = f"{exc}; every rank stopped; {ck}"
    else:
        where = f"at step {step + 1}" if phase in ("train", "compile", "data") and trainer and \
            getattr(trainer, "loader", None) else f"during {phase} (after step {step})"
        reason = f"rank {rank} failed {where}: {type(exc).__name__}: {exc}\n{tail}"
        if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
            reason = (f"rank {rank} failed {where}: a collective timed out (train.pg_timeout_s in steady "
                      f"state, train.pg_timeout_start_s while starting or checkpointing): a peer "
                      f"rank stopped responding (see the ranks' heartbeats)\n"
                      f"{type(exc).__name__}: {exc}\n{tail}")
    try:
        hb.stop("failed", error=reason[-2000:])
    except Exception:
        pass
    if record is not None:
        time.sleep(1.0)  # let a peer that failed first write its beat, then name it
        first = first_peer_failure(run_dir, rank)
        if first and not isinstance(exc, NonFiniteLoss) and not no_space:
            reason = f"{first}\n(rank {rank} then failed: {type(exc).__name__}: {str(exc)[:300]})"
        try:
            record.update(status="failed", exit_reason=reason, ended_at=time.time(),
                          step=trainer.step if trainer else 0, tokens=trainer.tokens if trainer else 0)
        except Exception:
            pass
    dumper.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FAILED)  # no teardown handshakes with dead or hung peers


def out_of_space(exc: BaseException, run_dir: Path) -> str:
    """Why ``exc`` is a full disk ("" when it is not): an ENOSPC anywhere in its chain; a failed
    write (torch.save says only "file write failed") while the disk has next to nothing free; or
    any failure on a disk that is full (a peer that ran out of space first could not say so)."""
    import errno
    import shutil

    seen: set[int] = set()
    e: BaseException | None = exc
    write_failed = False
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in text:
            return f"{type(e).__name__}: {text[:200]}"
        write_failed = write_failed or isinstance(e, OSError) or "write failed" in text
        e = e.__cause__ or e.__context__
    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        return ""
    if free < (16 << 20 if write_failed else 1 << 20):
        return f"only {free} bytes free; {type(exc).__name__}: {str(exc)[:200]}"
    return ""


def first_peer_failure(run_dir: Path, me: int) -> str | None:
    """The earliest ``failed`` heartbeat of another rank on this host, if any."""
    from nsa.contract import Beat, Phase, last_record

    best: Beat | None = None
    for path in (run_dir / HEARTBEATS).iterdir() if (run_dir / HEARTBEATS).is_dir() else ():
        if rank_of_file(path.name) in (None, me):
            continue
        beat = last_record(path, Beat)
        if beat is not None and beat.phase == Phase.FAILED and beat.error:
            if best is None or beat.ts < best.ts:
                best = beat
    return best.error if best else None
