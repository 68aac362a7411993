"""The training loop: model, optimizer, data streams, eval, checkpoints, telemetry.

What the loop is handed but does not decide lives beside it: the attention ops every rank
agrees on (attention_ops.py) and how a checkpoint continues on this world size (resume.py).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from nsa.config import Config, to_dict
from nsa.contract import CheckpointMeta, CudaGraph, EpochMetric, EvalMetric, GateShares, TrainMetric
from nsa.contract.io import JsonlWriter
from nsa.contract.rundir import CHECKPOINTS, RunDir, global_batch
from nsa.train import attention_ops, checkpoint_probe, longeval, resume
from nsa.train import checkpoint as ckpt
from nsa.train import distributed as D
from nsa.train.data import (
    EmptySplit,
    Packer,
    PrefetchLoader,
    StreamPos,
    own_streams,
    val_batches,
)
from nsa.train.faults import Faults, StopFlag
from nsa.train.gradsync import FlatGrads
from nsa.train.graphed import CudaGraphs, GraphedMicroStep, graph_refusal
from nsa.train.loader_process import LoaderSpec, ProcessLoader
from nsa.train.schedule import lr_at
from nsa.train.sources import build_source
from nsa.train.telemetry import Heartbeat, MetricsLog, RunRecord
from nsa.train.tokenizer import build_tokenizer

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel as DDP


class NonFiniteLoss(RuntimeError):
    """The loss became NaN/inf on some rank: every rank stops, the run is failed."""


def build_optimizer(model: nn.Module, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices (ndim >= 2) only, never on norms, biases or gates."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    t = cfg.train
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), **extra)


def param_digest(model: nn.Module) -> str:
    """sha256 over every (full) parameter: equal on every rank of a correct DDP/FSDP run."""
    h = hashlib.sha256()
    for name, p in sorted(D.unwrap(model).named_parameters()):
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, info: D.DistInfo, hb: Heartbeat, stop: StopFlag,
                 record: RunRecord | None, resume: Path | None, log: Callable[[str], None]) -> None:
        self.cfg, self.run_dir, self.info, self.hb, self.stop = cfg, run_dir, info, hb, stop
        self.record, self.resume_path, self.log = record, resume, log
        self.faults = Faults(cfg.debug, info.rank)
        self.metrics = MetricsLog(run_dir) if info.is_main else None
        self.debug_log = (JsonlWriter(RunDir(run_dir).debug(info.rank))
                          if cfg.debug.record_rank_state else None)
        self.step = 0
        self.tokens = 0
        self.last_ckpt: str | None = None
        self.telemetry_s = 0.0
        self.train_s = 0.0
        self.stop_agreed = False
        self.last_grad_norm: float | None = None  # read by _agree with the loss, for the metrics line
        self.micro: GraphedMicroStep | None = None  # train.cuda_graph, once proved (prepare_graph)
        self._graph_decided = False
        # DDP's averaging without its wrapper, for graphed micro-steps on several ranks (setup)
        self.flat_grads: FlatGrads | None = None
        self.graphs = CudaGraphs()  # the CUDA calls of a capture (a test's fake on a CPU)
        self.last_gates: GateShares | None = None
        import psutil

        self._proc = psutil.Process()

    # ------------------------------------------------------------------ setup
    def setup(self) -> dict[str, Any]:
        cfg, info = self.cfg, self.info
        t = cfg.train
        self.use_bf16 = t.dtype == "bf16" or (t.dtype == "auto" and info.device.type == "cuda")
        if self.use_bf16 and info.device.type != "cuda":
            raise RuntimeError("train.dtype bf16 needs CUDA here; use dtype auto or fp32 on CPU")
        self.attention_ops = attention_ops.agree(cfg.model, info.device, self.use_bf16, info.rank, self.hb,
                                                 self.log)
        # the first step compiles: the blocks (train.compile), FlexAttention's window kernels
        self._compiles = t.compile or self.attention_ops.window == "flexattention"
        from nsa import build_model

        torch.manual_seed(t.seed)  # identical initial weights on every rank
        model = build_model(cfg.model).to(info.device)
        self.param_count = sum(p.numel() for p in model.parameters())
        model.activation_checkpointing = t.activation_checkpointing
        if t.compile:
            for block in model.blocks:
                block.compile()
        self.raw = model
        # micro-steps replayed from a graph cannot hold DDP's reducer (gradsync.py): the gradients
        # are averaged in one all-reduce per step instead, whether the graph's proof passes or not
        flat = self._graph_refusal() is None and D.replicates(t.strategy, info.world_size)
        self.model = model if flat else D.wrap(model, t.strategy, info, bf16=self.use_bf16)
        self.optimizer = build_optimizer(self.model, cfg, info.device)
        self.timeouts = D.Timeouts(t.pg_timeout_start_s, t.pg_timeout_s, self.log)
        self.ckpt = ckpt.Checkpointer(self.run_dir / CHECKPOINTS, t.keep_checkpoints,
                                      committer=ckpt.is_committer(info.rank, info.local_rank),
                                      use_async=t.checkpoint_async,
                                      timeout_s=t.pg_timeout_start_s, log=self.log if info.is_main else None,
                                      before_commit=self.faults.maybe_die_in_save)
        self.hb.set_phase("checkpoint")  # the first save is not the first time its code runs
        checkpoint_probe.prove(self.ckpt, t.strategy, info, self.use_bf16, self.log)
        self.grad_accum, self.n_streams, self.micro_per_stream = t.grad_accum, info.world_size, t.grad_accum
        positions: dict[int, StreamPos] = {}
        self.resume_note: str | None = None
        if self.resume_path is not None:
            positions = self._load_checkpoint(self.resume_path)
        if flat:  # after the load: DCP creates the optimizer's state to load into only while no
            # parameter has a gradient
            self.flat_grads = FlatGrads([p for p in model.parameters() if p.requires_grad], info.world_size)
            self.flat_grads.broadcast_parameters()
        self.global_batch = global_batch(t.batch_size, info.world_size, self.grad_accum)
        self._setup_data(positions)
        return {"param_count": self.param_count, "grad_accum": self.grad_accum,
                "attention_ops": self.attention_ops, "global_batch": self.global_batch,
                "dtype": "bf16 autocast, fp32 params" if self.use_bf16 else "fp32",
                "data_source": self.source.description, "n_streams": self.n_streams,
                "loader": self.loader_kind}

    def _load_checkpoint(self, path: Path) -> dict[int, StreamPos]:
        """Continue the checkpoint at ``path`` (resume.py decides the layout or refuses)."""
        info = self.info
        meta = ckpt.read_meta(path)
        plan = resume.layout(path, meta, self.cfg, info.world_size, info.rank)
        self.grad_accum, self.n_streams = plan.grad_accum, plan.n_streams
        self.micro_per_stream = plan.micro_per_stream
        self.resume_note = plan.note
        note = ckpt.load(path, meta, self.model, self.optimizer, info.rank, info.device)
        if note:
            self.log(note)
        if self.debug_log:
            self.debug_log.write({"loaded_step": meta.step, "param_digest": param_digest(self.model)})
        self.step, self.tokens = meta.step, meta.tokens
        own = path.parent.resolve() == (self.run_dir / CHECKPOINTS).resolve()
        self.last_ckpt = path.name if own else str(path)  # the last good one until a new save
        positions, reshard_note = resume.positions(meta, plan)
        if reshard_note:
            self.log(reshard_note)
        return positions

    def _setup_data(self, positions: dict[int, StreamPos]) -> None:
        cfg, info = self.cfg, self.info
        self.hb.set_phase("data")
        self.source = build_source(cfg.data)
        self.tokenizer = build_tokenizer(cfg.data)
        if self.tokenizer.vocab_size > cfg.model.vocab_size:
            raise RuntimeError(f"tokenizer {self.tokenizer.name} needs vocab {self.tokenizer.vocab_size} > "
                               f"model.vocab_size {cfg.model.vocab_size}")
        window = cfg.train.seq_len + 1
        mine = own_streams(self.n_streams, info.world_size, info.rank) or [info.rank]
        self.my_streams = mine
        pin = info.device.type == "cuda"
        self.loader_kind = cfg.data.loader if cfg.data.loader != "auto" else ("process" if pin else "thread")
        if self.loader_kind == "process":  # the child opens the source; its errors come with a batch
            self.positions = {s: positions.get(s) or StreamPos() for s in mine}
            spec = LoaderSpec(cfg.data, mine, self.n_streams, window, dict(self.positions),
                              self.micro_per_stream, cfg.train.batch_size, cfg.debug.slow_data_s)
            self.loader: PrefetchLoader | ProcessLoader = ProcessLoader(spec, cfg.data.prefetch_batches, pin)
        else:
            packers = {s: Packer(self.source, self.tokenizer, s, self.n_streams, "train", window,
                                 pos=positions.get(s)) for s in mine}
            self.positions = {s: p.pos for s, p in packers.items()}
            self.loader = PrefetchLoader(packers, self.micro_per_stream, cfg.train.batch_size,
                                         cfg.data.prefetch_batches, cfg.debug.slow_data_s, pin=pin)
        self._val: list[torch.Tensor] | None = None

    # ------------------------------------------------------------------ steps
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.use_bf16:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _loss(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(self.info.device, non_blocking=True)
        x, y = tokens[:, :-1], tokens[:, 1:]
        with self._autocast():
            logits = self.model(x)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))  # fp32 loss

    def _sync_ctx(self, last: bool) -> contextlib.AbstractContextManager:
        """Gradient all-reduce only on the last micro-batch of an optimizer step."""
        if self.cfg.train.strategy == "fsdp":
            cast("FSDPModule", self.model).set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        replicated = D.replicates(self.cfg.train.strategy, self.info.world_size)
        if last or not replicated or self.flat_grads is not None:  # flat: averaged after the last
            return contextlib.nullcontext()
        return cast("DDP", self.model).no_sync()

    def _next_batch(self):
        if not self.loader.ready():
            self.hb.set_phase("data")  # the step waits for data: the panel sees it
        batch = self.loader.next()
        self.hb.set_phase("compile" if self._compiles and self.step == self._start_step else "train")
        for msg in batch.events:
            self.log(f"[rank {self.info.rank}] data: {msg}")
            if self.metrics:
                self.metrics.write(EpochMetric(ts=time.time(), step=self.step,
                                               epoch=batch.positions[batch.stream].epoch, split="train",
                                               message=msg))
        return batch

    def train_step(self) -> tuple[float, torch.Tensor | None]:
        """One optimizer step: accumulate, agree on loss/stop/NaN across ranks, clip, update.

        The host reads the device once (``_agree``), before the update: a non-finite loss or
        gradient must stop every rank before it reaches the weights. The grad norm (and, on a
        logging step, the gate shares) come to the host in the same read, as ``last_grad_norm``
        and ``last_gates``."""
        step_idx = self.step  # 0-based index of the step being computed; it completes as step+1
        self.faults.maybe_crash(step_idx + 1)
        loss_sum = torch.zeros((), device=self.info.device)
        for m in range(self.grad_accum):
            batch = self._next_batch()
            if self.debug_log:
                self.debug_log.write({"step": step_idx + 1, "micro": m, "stream": batch.stream,
                                      "digest": batch.digest()})
            with self._sync_ctx(m == self.grad_accum - 1):
                if self.micro is not None:  # a replay: the same work, one launch
                    loss = self.micro.step(batch.tokens)
                else:
                    loss = self._loss(batch.tokens)
                    if m == 0 and self.faults.nan_now(step_idx + 1):
                        loss = loss * float("nan")
                    (loss / self.grad_accum).backward()
            loss_sum += loss.detach()
            self.positions = batch.positions
        if self.flat_grads is not None:
            self.flat_grads.average()
        # The norm, always (grad_clip 0 = no clipping, max_norm inf): logged, and computed before
        # the agreement so that a non-finite norm stops the step too.
        max_norm = self.cfg.train.grad_clip if self.cfg.train.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor; resolve it on every rank
            grad_norm = grad_norm.full_tensor()
        logged = self._logs(step_idx + 1) and hasattr(self.raw, "gate_shares")
        shares = self.raw.gate_shares() if logged else None  # read with the loss, on logging steps only
        loss_mean = self._agree(step_idx, loss_sum / self.grad_accum, grad_norm, shares)
        lr = lr_at(step_idx, lr=self.cfg.train.lr, min_lr=self.cfg.train.min_lr,
                   warmup_steps=self.cfg.train.warmup_steps, total_steps=self.cfg.train.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        # a graph adds into the gradients it captured, the flat all-reduce averages the buffer
        # they are views of: zeroed in place, never freed
        self.optimizer.zero_grad(set_to_none=self.micro is None and self.flat_grads is None)
        self.step += 1
        self.tokens += self.global_batch * self.cfg.train.seq_len
        self.last_lr = lr
        return loss_mean, grad_norm

    def prepare_graph(self) -> None:
        """train.cuda_graph: capture the micro-step and prove it against eager on a batch of
        random tokens (graphed.py), or say why the run steps eagerly."""
        t = self.cfg.train
        if not t.cuda_graph or self._graph_decided:  # once per process (a benchmark runs the loop again)
            return
        self._graph_decided = True
        why = self._graph_refusal()
        if why is None:
            self.hb.set_phase("compile")
            params = [p for p in self.model.parameters() if p.requires_grad]
            micro = GraphedMicroStep(self._loss, params, self.grad_accum, self.graphs)
            example = torch.randint(0, self.tokenizer.vocab_size, (t.batch_size, t.seq_len + 1),
                                    device=self.info.device)
            t0 = time.perf_counter()
            proved = micro.prepare(example)
            why = micro.why
            if self.info.world_size > 1:  # every rank replays, or none does
                verdicts = D.all_gather_objects(why if not proved else None)
                failed = [(r, w) for r, w in enumerate(verdicts) if w is not None]
                proved = not failed
                why = micro.why if proved else "; ".join(f"rank {r}: {w}" for r, w in failed)
            self.micro = micro if proved else None
            why = f"{why}; {time.perf_counter() - t0:.1f} s"
            if self.flat_grads is not None:
                why += (f"; gradients averaged over {self.info.world_size} ranks in one all-reduce of "
                        f"{self.flat_grads.nbytes / 2**20:.0f} MiB per step, without DDP's wrapper")
        self.log(f"train.cuda_graph: {'replayed' if self.micro else 'eager micro-steps'}: {why}")
        if self.record:
            self.record.update(cuda_graph=CudaGraph(replayed=self.micro is not None, reason=why))

    def _graph_refusal(self) -> str | None:
        """Why this run's micro-steps cannot replay a CUDA graph (None: they will try)."""
        t = self.cfg.train
        if not t.cuda_graph:
            return "train.cuda_graph is off"
        return graph_refusal(self.info.device, t.strategy, self.cfg.debug.nan_at_step)

    def _logs(self, step: int) -> bool:
        """Whether this rank writes a metrics line after ``step`` (rank 0, every ``log_every``)."""
        t = self.cfg.train
        return self.metrics is not None and (step % t.log_every == 0 or step == t.steps)

    def _agree(self, step_idx: int, local: torch.Tensor, grad_norm: torch.Tensor,
               shares: torch.Tensor | None) -> float:
        """Every rank's verdict on this step in one all-reduce (skipped on one rank), read with
        the grad norm and gate shares in one ``.tolist()``: the step's only host sync, so the
        GPU queue drains once per step, not once per value. Raises ``NonFiniteLoss`` (every
        rank alike); sets ``stop_agreed``; returns the mean loss over ranks."""
        w = self.info.world_size
        finite = torch.isfinite(local)
        flags = torch.zeros(3 + w, device=self.info.device)
        flags[0] = torch.where(finite, local, torch.zeros_like(local))
        if self.stop.is_set():
            flags[1].fill_(1.0)  # a kernel argument, not a tensor of host data to upload
        flags[2 + self.info.rank] = (~finite).float()
        flags[2 + w] = (~torch.isfinite(grad_norm)).float()  # a finite loss, non-finite gradient: poison
        if w > 1:
            torch.distributed.all_reduce(flags)
        mine = [grad_norm.detach().float().reshape(1)] + ([] if shares is None else [shares.detach().float()])
        vals = torch.cat([flags, *mine]).tolist()  # the one device->host transfer
        bad = [r for r in range(w) if vals[2 + r] > 0]
        if bad:
            raise NonFiniteLoss(f"non-finite loss at step {step_idx + 1} on rank(s) {bad}")
        if vals[2 + w] > 0:
            raise NonFiniteLoss(f"non-finite gradient norm (nan/inf) at step {step_idx + 1} "
                                "with a finite loss")
        self.stop_agreed = vals[1] > 0  # every rank saw the same sum: they stop together
        if self.stop_agreed:
            self.stop.set(self.stop.reason or "SIGTERM on another rank")
        self.last_grad_norm = vals[3 + w]  # this rank's; equal on every rank (DDP, FSDP full norm)
        self.last_gates = None
        if shares is not None:
            c, s, win = vals[4 + w:]
            self.last_gates = GateShares(compressed=c, selected=s, window=win)
        return vals[0] / w

    # ------------------------------------------------------------------ eval / save
    def evaluate(self) -> float | None:
        t = self.cfg.train
        if t.eval_batches == 0:
            return None
        self.hb.set_phase("eval")
        if self._val is None:
            packers = []
            for s in self.my_streams:
                try:
                    packers.append(Packer(self.source, self.tokenizer, s, self.n_streams, "val",
                                          t.seq_len + 1, wrap=False))
                except EmptySplit as exc:  # a small corpus: no batches here, every rank agrees below
                    self.log(f"[rank {self.info.rank}] eval: {exc}")
            self._val = val_batches(packers, t.eval_batches, t.batch_size)
        count = torch.tensor([len(self._val)], device=self.info.device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN)
        n = int(count.item())  # the same number of forwards on every rank (FSDP needs it)
        if n == 0:
            self.log("eval: no validation batches (too few validation documents); skipped")
            return None
        self.model.eval()
        total = torch.zeros((), device=self.info.device)
        with torch.no_grad():
            for tokens in self._val[:n]:
                total += self._loss(tokens)
        self.model.train()
        torch.distributed.all_reduce(total)
        return float(total) / (n * self.info.world_size)

    def save(self, block: bool = False) -> None:
        """Every rank writes its shard (docs/run-directory.md); ``block``: committed on return (a
        stop, the last step), else written in the background when train.checkpoint_async."""
        self.hb.set_phase("checkpoint")
        with self.timeouts.long():
            positions = D.all_gather_objects({str(s): vars(p) for s, p in self.positions.items()})
            merged = {k: v for part in positions for k, v in part.items()}
            meta = CheckpointMeta(step=self.step, tokens=self.tokens, world_size=self.info.world_size,
                                  grad_accum=self.grad_accum, batch_size=self.cfg.train.batch_size,
                                  global_batch=self.global_batch, seq_len=self.cfg.train.seq_len,
                                  n_streams=self.n_streams, data_positions=merged, config=to_dict(self.cfg),
                                  run_id=self.hb.run_id, strategy=self.cfg.train.strategy,
                                  device_type=self.info.device.type)
            self.ckpt.save(self.step, self.model, self.optimizer, meta, self.info.rank, self.info.device,
                           block=block)
        self.sync_last_checkpoint()
        self.hb.set_phase("train")

    def sync_last_checkpoint(self) -> None:
        """``last_ckpt``: the newest committed checkpoint (async saves commit in the background)."""
        if self.ckpt.last_saved:
            self.last_ckpt = self.ckpt.last_saved

    # ------------------------------------------------------------------ loop
    def run(self) -> str:
        """Train to ``train.steps``; returns ``finished`` or ``stopped``."""
        t = self.cfg.train
        self._start_step = self.step
        flag = torch.tensor([1.0 if self.stop.is_set() else 0.0], device=self.info.device)
        torch.distributed.all_reduce(flag)  # a stop during boot: leave before training at all
        if flag.item() > 0:
            self.stop.set(self.stop.reason or "SIGTERM on another rank")
            return "stopped"  # nothing new to save; last_ckpt is what we resumed from, if anything
        self.prepare_graph()
        self.hb.set_phase("compile" if self._compiles else "train")
        if self.record:
            self.record.update(status="running", step=self.step, tokens=self.tokens)
        last_end = time.perf_counter()
        while self.step < t.steps:
            loss, _ = self.train_step()
            self.timeouts.steady()  # joined, compiled, one step done: hangs now fail fast
            self.ckpt.poll()  # a background save that finished is committed here
            self.sync_last_checkpoint()
            now = time.perf_counter()
            step_time, last_end = now - last_end, now
            self.train_s += step_time
            t0 = time.perf_counter()
            self.hb.step_beat(self.step)
            if self._logs(self.step):
                self._log_metrics(loss, step_time)
            if self.record:
                self.record.progress(self.step, self.tokens)
            self.telemetry_s += time.perf_counter() - t0
            self.faults.maybe_hang(self.step)
            stopping = self.stop_agreed
            if self.faults.stop_now(self.step):  # same config on every rank: they agree
                self.stop.set(f"debug.stop_at_step={self.step}")
                stopping = True
            if self.step % t.eval_every == 0 or self.step == t.steps:
                with self.timeouts.long() if self._val is None else contextlib.nullcontext():
                    val = self.evaluate()  # the first eval builds its batches (and may compile)
                if val is not None and self.metrics:
                    self.metrics.write(EvalMetric(ts=time.time(), step=self.step, val_loss=val,
                                                  tokens=self.tokens))
                    self.log(f"eval step {self.step}: val_loss {val:.4f}")
                self.hb.set_phase("train")
            if longeval.due(self.cfg, self.step):
                self.hb.set_phase("eval")
                with self.timeouts.long():
                    longeval.run(self.cfg, self.raw, self.tokenizer, self.run_dir, self.hb.run_id, self.step,
                                 self.info.is_main, self.log)
                self.hb.set_phase("train")
            if stopping or self.step % t.save_every == 0 or self.step == t.steps:
                self.save(block=stopping or self.step == t.steps)
            if stopping:
                return "stopped"
            last_end = time.perf_counter()  # eval and checkpoint time are not step time
        return "finished"

    def _log_metrics(self, loss: float, step_time: float) -> None:
        """The step's metrics line and log line, from values already on the host (``_agree``)."""
        assert self.metrics is not None  # called on the main rank only, which logs metrics
        gates, gn = self.last_gates, self.last_grad_norm
        if self.info.device.type == "cuda":  # the caching allocator's counters: no device sync
            stats = torch.cuda.memory_stats(self.info.device)
            alloc = stats.get("allocated_bytes.all.current", 0)
            reserved = stats.get("reserved_bytes.all.current", 0)
        else:
            alloc = reserved = self._proc.memory_info().rss  # CPU: process RSS (psutil)
        tps = self.global_batch * self.cfg.train.seq_len / step_time if step_time > 0 else None
        self.metrics.write(TrainMetric(
            ts=time.time(), step=self.step, loss=loss, lr=self.last_lr, tokens=self.tokens, tokens_per_s=tps,
            step_time_s=step_time, grad_norm=gn, gate_shares=gates, mem_allocated_bytes=alloc,
            mem_reserved_bytes=reserved))
        gate_txt = (f" gates c/s/w {gates.compressed:.2f}/{gates.selected:.2f}/{gates.window:.2f}"
                    if gates else "")
        self.log(f"step {self.step}/{self.cfg.train.steps} loss {loss:.4f} lr {self.last_lr:.3g} "
                 f"grad_norm {gn if gn is None else round(gn, 3)} {tps or 0:.0f} tok/s "
                 f"{step_time * 1000:.0f} ms/step{gate_txt}")

    def finish(self) -> None:
        self.ckpt.close()
        self.sync_last_checkpoint()
        if self.metrics:
            self.metrics.close()
        if self.debug_log:
            self.debug_log.write({"final_step": self.step, "param_digest": param_digest(self.model)})
            self.debug_log.close()
        self.loader.close()

    def release(self) -> None:
        """Drop the model, the optimizer and the checkpointer (the run is over): a DDP wrapper's
        reducer and the checkpoint group hold the process group, which ``D.close()`` can free
        only once nothing else does."""
        del self.model, self.raw, self.optimizer, self.ckpt
        gc.collect()
