"""What a config is and whether it can run on this host, before anything starts.

Why: the launch dialog used to preselect a 125M GPU config streaming FineWeb-Edu from the
Hub; on a CPU box without network it started, retried the Hub five times and failed after
~45 s. ``describe`` says what a config is (parameters, sequence length, global batch, the
device it needs, its data) and ``problems`` says why it cannot run here; ``launch`` refuses
a config with problems (unless forced). Torch is not imported: parameters are counted from
the config (nsa/size.py).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from nsa.contract.replies import ConfigSummary
from nsa.contract.rundir import global_batch
from nsa_tui.agent.errors import OpError
from nsa_tui.fmt import fmt_count

HUB = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0
PROBE_CACHE_S = 60.0

_probe_cache: dict[str, tuple[float, str | None]] = {}


def validate_config(path: str, overrides: list[str], shown_as: str | None = None) -> Any:
    """Load and validate on the host; a bad config starts nothing (no default, no ignored key). Errors name
    ``shown_as``: the user's own path of an uploaded file, never its temporary copy."""
    try:
        from nsa.config import ConfigError, load_config
    except ImportError as exc:
        raise OpError("nsa_missing", f"cannot import nsa on this host: {exc}") from exc
    try:
        return load_config(path, overrides, shown_as=shown_as)
    except ConfigError as exc:
        raise OpError("bad_config", str(exc)) from exc


def check_nproc(nproc: Any) -> None:
    """A process count a launch can use (every backend checks it before creating anything)."""
    if nproc is not None and (not isinstance(nproc, int) or nproc < 1):
        raise OpError("bad_request", f"nproc must be a positive integer, got {nproc!r}")


def hub_endpoint(env: dict[str, str] | os._Environ[str] = os.environ) -> tuple[str, int]:
    """Where ``datasets`` would connect for the Hub: the HTTPS proxy if one is set, else
    HF_ENDPOINT (default huggingface.co), as (host, port)."""
    proxy = env.get("HTTPS_PROXY") or env.get("https_proxy")
    url = urlsplit(proxy if proxy else env.get("HF_ENDPOINT", HUB))
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.hostname or "huggingface.co", port


def hub_unreachable(env: dict[str, str] | os._Environ[str] = os.environ,
                    timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a TCP connection to the Hub (or the proxy) opens, else why not. Cached a minute:
    the dialog asks on every change of the form."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if env.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    host, port = hub_endpoint(env)
    key = f"{host}:{port}"
    hit = _probe_cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < PROBE_CACHE_S:
        return hit[1]
    try:
        with socket.create_connection((host, port), timeout=timeout):
            why = None
    except OSError as exc:
        why = f"{key}: {exc.strerror or exc}"
    _probe_cache[key] = (time.monotonic(), why)
    return why


TRAINER_MODULES = ("torch", "numpy", "psutil")  # imported by every run (the host extra)


def missing_modules(names: list[str]) -> list[str]:
    """Which of ``names`` this interpreter (the one the agent starts runs with) cannot import.
    Located, not imported: importing torch takes seconds."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken install: as good as none
            found = False
        if not found:
            missing.append(name)
    return missing


def training_side_missing(cfg: Any) -> str | None:
    """Why this host cannot train ``cfg`` at all (None when it can): the modules the trainer needs
    for it are not installed here (a watch-only install, ``pip install nsa-tui``). Said before
    anything starts, with the fix, instead of a run that dies at once on ``import torch``."""
    need = list(TRAINER_MODULES)
    if cfg.data.source in ("fineweb-edu", "files"):
        need.append("datasets")
    if cfg.data.tokenizer == "gpt2":
        need.append("tiktoken")
    missing = missing_modules(need)
    if not missing:
        return None
    return (f"the training side is not installed for {sys.executable} (no module {', '.join(missing)}: a "
            "watch-only install); install it there with pip install 'nsa-tui[host]', or from another "
            "machine with nsa-tui setup HOST")


def describe(cfg: Any, shown: str, nproc: int | None, gpus: int, gpu_message: str,
             probe: Callable[[], str | None] = hub_unreachable) -> ConfigSummary:
    """``cfg`` (a validated nsa.config.Config) on a host with ``gpus`` GPUs, started with
    ``nproc`` processes (None: the launch default, one per GPU or 1)."""
    from nsa.size import param_count

    t, d = cfg.train, cfg.data
    n = nproc or max(1, gpus)
    problems: list[str] = []
    notes: list[str] = []
    missing = training_side_missing(cfg)
    if missing:
        problems.append(missing)
    cuda_only = [why for cond, why in ((t.device == "cuda", "train.device is cuda"),
                                       (t.dtype == "bf16", "train.dtype bf16 runs on CUDA only")) if cond]
    needs = "CUDA" if cuda_only else ("CPU" if t.device == "cpu" else "CPU or CUDA")
    on_gpu = gpus > 0 and t.device != "cpu"
    runs_on = f"cuda ({gpus} GPU{'s' if gpus != 1 else ''})" if on_gpu else "cpu"
    if cuda_only and gpus == 0:
        why = f": {gpu_message}" if gpu_message else ""
        problems.append(f"needs CUDA ({'; '.join(cuda_only)}) but this host has no GPU{why}")
    elif on_gpu and n > gpus:
        problems.append(f"{n} processes but this host has {gpus} GPU{'s' if gpus != 1 else ''} "
                        "(one process per GPU)")
    params = param_count(cfg.model)
    if not on_gpu and params > 50_000_000:
        notes.append(f"{fmt_count(params)} parameters on CPU: expect minutes per step")
    if d.source == "fineweb-edu":
        data = f"fineweb-edu from the Hugging Face Hub ({d.fineweb_name}, streamed)"
        unreachable = probe()
        if unreachable:
            problems.append(f"data.source fineweb-edu streams from the Hugging Face Hub, which this host "
                            f"cannot reach ({unreachable})")
    elif d.source == "files":
        data = f"files: {', '.join(d.paths[:3])}{' ...' if len(d.paths) > 3 else ''}"
        for pat in d.paths:
            path = os.path.expanduser(pat)
            if os.path.isabs(path) and not glob.glob(path, recursive=True):
                problems.append(f"data.paths: {pat!r} matches no file on this host")
    elif d.source == "stdlib":
        data = "stdlib: the Python standard library's own source (offline)"
    else:
        data = "synthetic (generated, offline)"
    if d.tokenizer == "gpt2" and not d.gpt2_vocab_bpe:
        notes.append("tokenizer gpt2 without local files: tiktoken downloads them once")
    return ConfigSummary(
        config=shown, name=cfg.name, params=params, attention=cfg.model.attention.kind, seq_len=t.seq_len,
        batch_size=t.batch_size, grad_accum=t.grad_accum, nproc=n,
        global_batch=global_batch(t.batch_size, n, t.grad_accum), steps=t.steps, device=t.device,
        dtype=t.dtype, needs=needs, runs_on=runs_on, data=data, problems=problems, notes=notes)
