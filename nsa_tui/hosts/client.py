"""The async client the panel and the CLI use to talk to one host's agent.

    client = HostClient("local" | "[user@]host[:port]" | "ssh-config-alias",
                        runs_root=None,            # default: the agent's ~/nsa-runs
                        confirm_host_key=None,     # async (host, fingerprint) -> bool
                        on_state=None)             # called with every ConnectionState
    await client.start()          # first connection; raises TransportError (retry=True: keep trying)
    client.hello                  # Hello: host, gpus, gpu_message, versions, runs_root, problems
    client.state                  # ConnectionState(status, retry_in_s, message)
    await client.runs()           # [RunView] newest first
    await client.run(run_id)      # RunView, with log_tail for crashed/failed runs
    await client.status(run_id)   # RunStatusReport: the view and every rank's newest beat
    await client.launch(config_path, nproc=None, overrides=(), name=None, upload=False)  # LaunchResult
    await client.describe(config_path, nproc=None, overrides=(), upload=False)  # ConfigSummary
    await client.plan(run_id, "fallback" | "resume")  # ActionPlan: what it would do
    await client.kill(run_id)     # KillResult
    await client.fallback(run_id, nproc=None, checkpoint=None)  # LaunchResult of the new run
                                  # (``again``: an earlier fallback's run)
    await client.resume(run_id)   # LaunchResult, same world size as before
    await client.preflight(...)   # PreflightResult: versions, rendezvous port, config (runs over hosts)
    await client.checkpoints(run_id)  # CheckpointList; read_/write_checkpoint_file move shards
    await client.dump(run_id)     # DumpResult
    await client.archive(run_id, archived=True)   # RunView (hidden from the default list)
    await client.delete(run_id, dry_run=False)    # DeleteResult: bytes it frees / freed
    await client.read_log(run_id, offset=0, max_bytes=1 << 20)  # LogChunk
    await client.alerts(run_id=None)  # AlertList: the host's recorded alerts (alerts.jsonl)
    await client.ack(run_id, alert)   # AlertState, acknowledged
    await client.evidence(run_id, alert)  # Evidence: the files captured for it
    async for ev in client.watch_alerts(): ...    # "alerts" once, then "alert" per change
    async for ev in client.watch(run_id): ...     # Event, survives reconnects (below)
    async for ev in client.watch_runs(): ...      # "runs" once, then "run" / "run_removed"
    async for sample in client.host_samples(): ... # HostSample per second
    client.drop_connection()      # cut the link now (a "reconnect" key; tests)
    await client.close()          # closes the channel; runs keep running

Records are the contract's (nsa.contract); an ``Event``'s ``data`` is already validated
for its kind (nsa.contract.protocol.EVENT_DATA). ``received`` is this machine's clock when
it arrived (alerts use it against clock skew).

The connection itself (reconnects, resumed watches, errors) is
``nsa_tui.hosts.connection``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from nsa.contract import HostSample, Metric, NodeLayout, RunStatusReport, RunView, StreamPos, decode_lines
from nsa.contract.evals import EvalList
from nsa.contract.replies import (
    ActionPlan,
    AlertList,
    AlertState,
    CheckpointList,
    ConfigSummary,
    DeleteResult,
    DumpResult,
    Evidence,
    FileChunk,
    KillResult,
    LaunchResult,
    LogChunk,
    PreflightResult,
)
from nsa.contract.rundir import METRICS_JSONL, TRAIN_LOG
from nsa.contract.slurm import SlurmRequest
from nsa_tui.hosts.connection import (
    AgentConnection,
    AgentError,
    ConnectionState,
    Event,
    Subscription,
)

__all__ = ["AgentError", "ConnectionState", "Event", "HostClient", "read_config_text"]


class HostClient(AgentConnection):
    """The agent's operations on one host, typed: each returns the contract's record (see the
    module docstring); the connection underneath reconnects on its own."""

    async def ping(self) -> dict[str, float]:
        return await self.request("ping", dict[str, float])

    async def runs(self) -> list[RunView]:
        return (await self.request("runs", dict[str, list[RunView]]))["runs"]

    async def run(self, run_id: str) -> RunView:
        return await self.request("run", RunView, run=run_id)

    async def status(self, run_id: str) -> RunStatusReport:
        return await self.request("status", RunStatusReport, run=run_id)

    async def launch(self, config_path: str, *, nproc: int | None = None, overrides: Sequence[str] = (),
                     name: str | None = None, upload: bool = False, on_failure: str | None = None,
                     force: bool = False, config_text: str | None = None, run_id: str | None = None,
                     nodes: NodeLayout | None = None, slurm: SlurmRequest | None = None) -> LaunchResult:
        """Validate on the host and start; ``upload`` sends this machine's file text along (errors
        still name ``config_path``; ``config_text``: that text, read already); ``on_failure``: the
        watchdog's policy for the run (restart, fallback, stop, none); ``force`` starts what
        ``describe`` would refuse; ``run_id``/``nodes``: one node of a run over several hosts."""
        args = _config_args(config_path, upload and config_text is None)
        if config_text is not None:
            args["config_text"] = config_text
        args.update(nproc=nproc, overrides=list(overrides), name=name)
        if on_failure is not None:
            args["on_failure"] = on_failure
        if force:
            args["force"] = True
        if run_id is not None:
            args["run_id"] = run_id
        if nodes is not None:
            args["nodes"] = nodes
        if slurm is not None:  # submitted as a Slurm batch job by the agent on the login node
            args["slurm"] = slurm
        return await self.request("launch", LaunchResult, **args)

    async def preflight(self, *, port: int | None = None, want_port: bool = False, nproc: int | None = None,
                        config_path: str | None = None, config_text: str | None = None,
                        overrides: Sequence[str] = (), marker_write: str | None = None,
                        marker_look: str | None = None, marker_remove: str | None = None) -> PreflightResult:
        """What the host says about taking part in a run over several hosts; starts nothing.
        ``marker_*``: the sharing probe of the runs root (sent only when asked for)."""
        markers = {k: v for k, v in (("marker_write", marker_write), ("marker_look", marker_look),
                                     ("marker_remove", marker_remove)) if v is not None}
        return await self.request("preflight", PreflightResult, port=port, want_port=want_port, nproc=nproc,
                                  config_path=config_path, config_text=config_text, overrides=list(overrides),
                                  **markers)

    async def describe(self, config_path: str, *, nproc: int | None = None, overrides: Sequence[str] = (),
                       upload: bool = False) -> ConfigSummary:
        """What the config is and whether it can run on the host; nothing starts."""
        args = _config_args(config_path, upload)
        args.update(nproc=nproc, overrides=list(overrides))
        return await self.request("describe", ConfigSummary, **args)

    async def plan(self, run_id: str, op: str) -> ActionPlan:
        """What ``fallback``/``resume`` of the run would do now (for a confirmation)."""
        return await self.request("plan", ActionPlan, run=run_id, action=op)

    async def kill(self, run_id: str, grace_s: float = 60.0) -> KillResult:
        return await self.request("kill", KillResult, run=run_id, grace_s=grace_s)

    async def fallback(self, run_id: str, grace_s: float = 60.0, nproc: int | None = None,
                       checkpoint: str | None = None) -> LaunchResult:
        return await self.request("fallback", LaunchResult, run=run_id, grace_s=grace_s, nproc=nproc,
                                  checkpoint=checkpoint)

    async def resume(self, run_id: str, nproc: int | None = None, checkpoint: str | None = None,
                     new_run_id: str | None = None, nodes: NodeLayout | None = None) -> LaunchResult:
        args: dict[str, Any] = {"run": run_id, "nproc": nproc, "checkpoint": checkpoint, "run_id": new_run_id}
        if nodes is not None:
            args["nodes"] = nodes
        return await self.request("resume", LaunchResult, **args)

    async def checkpoints(self, run_id: str) -> CheckpointList:
        return await self.request("checkpoints", CheckpointList, run=run_id)

    async def read_checkpoint_file(self, run_id: str, checkpoint: str, file: str, offset: int = 0,
                                   max_bytes: int = 4 << 20) -> FileChunk:
        return await self.request("read_checkpoint_file", FileChunk, run=run_id, checkpoint=checkpoint,
                                  file=file, offset=offset, max_bytes=max_bytes)

    async def write_checkpoint_file(self, run_id: str, checkpoint: str, file: str, offset: int, data: bytes,
                                    final: bool = False) -> dict[str, int]:
        return await self.request("write_checkpoint_file", dict[str, int], run=run_id, checkpoint=checkpoint,
                                  file=file, offset=offset, data=data, final=final)

    def peer_address(self) -> str | None:
        """The address this client reached the host at (SSH: the peer's IP), None for local."""
        get = getattr(self.transport, "peer_address", None)
        return get() if get is not None else None

    async def dump(self, run_id: str) -> DumpResult:
        return await self.request("dump", DumpResult, run=run_id)

    async def archive(self, run_id: str, archived: bool = True) -> RunView:
        """Hide a run that is not alive from the default run list (False: show it again)."""
        return await self.request("archive", RunView, run=run_id, archived=archived)

    async def delete(self, run_id: str, dry_run: bool = False) -> DeleteResult:
        """Remove a run that is not alive; ``dry_run``: only say how many bytes that frees."""
        return await self.request("delete", DeleteResult, run=run_id, dry_run=dry_run)

    async def read_log(self, run_id: str, offset: int = 0, max_bytes: int = 1 << 20,
                       file: str = TRAIN_LOG) -> LogChunk:
        """A piece of the run's train.log (or, ``file="metrics.jsonl"``, of its metrics lines)."""
        args: dict[str, Any] = {"run": run_id, "offset": offset, "max_bytes": max_bytes}
        if file != TRAIN_LOG:
            args["file"] = file
        return await self.request("read_log", LogChunk, **args)

    async def metrics(self, run_id: str) -> list[Metric]:
        """Every line of the run's metrics.jsonl as contract records (exports: O(run length),
        read in 4 MiB pieces; a malformed line is skipped)."""
        out: list[Metric] = []
        offset, carry = 0, b""
        while True:
            chunk = await self.read_log(run_id, offset, 4 << 20, file=METRICS_JSONL)
            data = carry + chunk.text.encode()
            lines = data.split(b"\n")
            carry = lines.pop()  # a line still being written waits for its newline
            out += decode_lines([ln for ln in lines if ln.strip()], Metric)
            if chunk.offset >= chunk.size or chunk.offset == offset:
                return out
            offset = chunk.offset

    async def alerts(self, run_id: str | None = None, history: int = 100) -> AlertList:
        return await self.request("alerts", AlertList, run=run_id, history=history)

    async def ack(self, run_id: str, alert: str, by: str | None = None) -> AlertState:
        return await self.request("ack", AlertState, run=run_id, alert=alert, by=by)

    async def evidence(self, run_id: str, alert: str) -> Evidence:
        return await self.request("evidence", Evidence, run=run_id, alert=alert)

    def watch(self, run_id: str, offsets: dict[str, StreamPos] | None = None,
              streams: Sequence[str] | None = None, **bounds: int) -> AsyncIterator[Event]:
        """Events of one run (docs/agent-protocol.md, "watch"): its bounded current view, then
        live. ``offsets`` continues streams from those positions (an event's ``pos``);
        ``bounds``: summary_points, recent_metrics, log_tail_bytes."""
        sub = Subscription("watch", {"run": run_id, "streams": list(streams) if streams else None, **bounds})
        sub.offsets = dict(offsets or {})
        return self._stream(sub)

    def watch_runs(self) -> AsyncIterator[Event]:
        """The run list (a ``runs`` event), then ``run`` for every change, ``run_removed``; after
        a reconnect the whole list again."""
        return self._stream(Subscription("watch_runs", {}))

    def watch_alerts(self, history: int = 100, run_id: str | None = None) -> AsyncIterator[Event]:
        """The host's recorded alerts: an ``alerts`` event (AlertList), then ``alert`` (AlertState)
        for every change; after a reconnect the whole list again."""
        return self._stream(Subscription("watch_alerts", {"history": history, "run": run_id}))

    async def _stream_until(self, sub: Subscription, last: str) -> AsyncIterator[Event]:
        """A one-shot stream (sample, eval): its events up to the one of kind ``last``, where it
        ends; unwatched as soon as it ends or the caller stops, not when it is collected."""
        events = self._stream(sub)
        try:
            async for ev in events:
                yield ev
                if ev.kind == last:
                    return
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def sample(self, run_id: str, *, checkpoint: str | None = None, prompt: str = "",
               max_new_tokens: int = 200, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None,
               device: str | None = None) -> AsyncIterator[Event]:
        """Text from the run's checkpoint as it is generated (docs/agent-protocol.md, "sample"):
        ``sample_start``, ``sample_text``..., then ``sample_done``, where the iteration ends;
        a failure is raised as AgentError."""
        args = {"run": run_id, "checkpoint": checkpoint, "prompt": prompt, "max_new_tokens": max_new_tokens,
                "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed, "device": device}
        return self._stream_until(Subscription("sample", args), "sample_done")

    def evaluate(self, run_id: str, *, checkpoint: str | None = None, lengths: Sequence[int] = (),
                 depths: Sequence[float] = (), trials: int = 4, seed: int | None = None,
                 beyond_context: bool = False, loss_sequences: int = 4, buckets: int = 8,
                 device: str | None = None) -> AsyncIterator[Event]:
        """A passkey evaluation of the run's checkpoint (docs/agent-protocol.md, "eval"):
        ``eval_start``, ``eval_progress``..., then ``eval_done`` (the PasskeyEval record, also
        appended to the run's records), where the iteration ends; a failure is raised as
        AgentError."""
        args = {"run": run_id, "checkpoint": checkpoint, "lengths": list(lengths), "depths": list(depths),
                "trials": trials, "seed": seed, "beyond_context": beyond_context,
                "loss_sequences": loss_sequences, "buckets": buckets, "device": device}
        return self._stream_until(Subscription("eval", args), "eval_done")

    async def evals(self, run_id: str) -> EvalList:
        """The run's evaluation records (eval/passkey.jsonl), oldest first."""
        return await self.request("evals", EvalList, run=run_id)

    async def host_samples(self, interval_s: float = 1.0) -> AsyncIterator[HostSample]:
        """Host samples, one per ``interval_s``; resumes after reconnects."""
        async for ev in self._stream(Subscription("watch_host", {"interval_s": interval_s})):
            yield ev.data

    def host_events(self, interval_s: float = 1.0) -> AsyncIterator[Event]:
        """Host samples as Events (kind ``host``)."""
        return self._stream(Subscription("watch_host", {"interval_s": interval_s}))


def _config_args(config_path: str, upload: bool) -> dict[str, Any]:
    """``config_path`` (a path on the host), or with ``upload`` this machine's file's text too."""
    args: dict[str, Any] = {"config_path": config_path}
    if upload:
        try:
            args["config_text"] = Path(config_path).expanduser().read_text()
        except OSError as exc:
            raise AgentError("bad_config", f"{config_path}: cannot read config file ({exc})") from exc
    return args


def read_config_text(config_path: str) -> str:
    """This machine's config file, to send along (``--upload``)."""
    return str(_config_args(config_path, True)["config_text"])
