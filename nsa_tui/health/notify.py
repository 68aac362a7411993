"""Delivering alerts where a person will see them: a command, a webhook (settings ``notify``).

A :class:`Notifier` owns one background thread and a queue: ``submit`` returns at once, so
neither training nor the watchdog's loop ever waits on a slow network. Each delivery is
tried ``retries`` times with exponential backoff (``backoff_s``, doubling); one that still
fails is reported to ``on_failure`` (the watchdog makes it an alert of its own, visible in
alerts.jsonl and the panel). A webhook URL carries its secret in its path or query (Slack,
Discord, ntfy topics): it is shown only as :func:`redact` makes it, in messages and logs.

Bodies: ``json`` (the alert event as the contract encodes it), ``slack`` (``{"text"}``),
``discord`` (``{"content"}``), ``ntfy`` (JSON publishing: ``{"topic", "title", "message",
"priority", "tags"}`` posted to the server's root). ``auto`` picks one from the URL's host.
"""

from __future__ import annotations

import queue
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nsa.contract import AlertEvent, encode
from nsa_tui.user.settings import NotifySettings

SEVERITY_RANK = {"warning": 0, "critical": 1}


class CommandFailed(Exception):
    """The notification command exited non-zero (the message: its code and last stderr line)."""


def redact(url: str) -> str:
    """``https://hooks.slack.com/services/T0/B0/XXXX?x=y`` -> ``https://hooks.slack.com/***``:
    scheme and host only (no user, password, path or query: any of them can be the secret)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        if parts.port:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "<webhook>"
    rest = "/***" if (parts.path not in ("", "/") or parts.query or parts.username) else ""
    return urlunsplit((parts.scheme, host, "", "", "")) + rest


def scrub(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` (and its path) replaced by its redaction."""
    if not secret:
        return text
    text = text.replace(secret, redact(secret))
    try:
        path = urlsplit(secret).path
    except ValueError:
        return text
    return text.replace(path, "/***") if len(path) > 1 else text


def sniff_format(url: str) -> str:
    host = (urlsplit(url).hostname or "").lower()
    path = urlsplit(url).path
    if host.endswith("hooks.slack.com"):
        return "slack"
    if host.endswith(("discord.com", "discordapp.com")) and "/api/webhooks/" in path:
        return "discord"
    if host.startswith("ntfy.") or host.endswith(".ntfy.sh") or host == "ntfy.sh":
        return "ntfy"
    return "json"


def headline(ev: AlertEvent) -> str:
    a = ev.alert
    rank = f" rank {a.rank}" if a.rank is not None else ""
    what = {"raised": "", "updated": " (updated)", "resolved": " resolved", "acknowledged": " acknowledged"}
    return f"[{a.severity.upper()}] {a.kind}{what.get(ev.action, '')} on {a.host} {a.run or ''}{rank}".strip()


def body(ev: AlertEvent, fmt: str, url: str) -> tuple[str, bytes]:
    """(URL to POST to, JSON body) for a webhook of format ``fmt``."""
    import json

    text = f"{headline(ev)}\n{ev.alert.message}"
    if ev.alert.evidence:
        text += "\nevidence: " + ", ".join(ev.alert.evidence)
    if fmt == "slack":
        return url, json.dumps({"text": text}).encode()
    if fmt == "discord":
        return url, json.dumps({"content": text[:2000]}).encode()
    if fmt == "ntfy":
        parts = urlsplit(url)
        topic = parts.path.strip("/")
        root = urlunsplit((parts.scheme, parts.netloc, "/", "", ""))
        critical = ev.alert.severity == "critical"
        return root, json.dumps({"topic": topic, "title": headline(ev), "message": ev.alert.message,
                                 "priority": 5 if critical else 3,
                                 "tags": ["rotating_light" if critical else "warning"]}).encode()
    return url, encode(ev)


@dataclass
class Delivery:
    """One notification to send through one channel."""

    channel: str  # "command" | "webhook"
    event: AlertEvent
    attempts: int = 0


class Notifier:
    """Background delivery with retries (see the module docstring)."""

    def __init__(self, settings: NotifySettings, on_failure: Callable[[Delivery, str], None] | None = None,
                 on_success: Callable[[Delivery], None] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.s = settings
        self.on_failure = on_failure or (lambda d, why: None)
        self.on_success = on_success or (lambda d: None)
        self.log = log or (lambda msg: None)
        self.q: queue.Queue[Delivery | None] = queue.Queue()
        self.sent = 0
        self.failed = 0
        self._busy = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="nsa-notify", daemon=True)
        self._thread.start()

    @property
    def channels(self) -> list[str]:
        out = []
        if self.s.command:
            out.append("command")
        if self.s.webhook is not None:
            out.append("webhook")
        return out

    def wants(self, ev: AlertEvent) -> bool:
        """Whether settings ask for this event (action and severity)."""
        if ev.action not in self.s.events:
            return False
        return SEVERITY_RANK.get(ev.alert.severity, 0) >= SEVERITY_RANK[self.s.min_severity]

    def submit(self, ev: AlertEvent) -> None:
        """Queue ``ev`` for every configured channel; returns at once."""
        if not self.wants(ev):
            return
        for ch in self.channels:
            with self._lock:
                self._busy += 1
            self.q.put(Delivery(ch, ev))

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued delivery succeeded or gave up (the supervisor's exit)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._busy == 0:
                    return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.q.put(None)

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        retry: list[tuple[float, Delivery]] = []  # (when, delivery): backoff without blocking others
        while True:
            now = time.monotonic()
            due = [d for t, d in retry if t <= now]
            retry = [(t, d) for t, d in retry if t > now]
            for d in due:
                self._attempt(d, retry)
            wait = min((t for t, _ in retry), default=now + 1.0) - time.monotonic()
            try:
                item = self.q.get(timeout=max(0.01, min(1.0, wait)))
            except queue.Empty:
                continue
            if item is None:
                return
            self._attempt(item, retry)

    def _attempt(self, d: Delivery, retry: list[tuple[float, Delivery]]) -> None:
        d.attempts += 1
        try:
            self._send(d)
        except Exception as exc:  # noqa: BLE001 - any failure of a channel is retried, then reported
            why = self._why(exc)
            if d.attempts < self.s.retries:
                delay = self.s.backoff_s * 2 ** (d.attempts - 1)
                retry.append((time.monotonic() + delay, d))
                return
            self.failed += 1
            self.log(f"nsa-tui watchdog: notification of alert {d.event.id} via {self.describe(d.channel)} "
                     f"failed after {d.attempts} tries: {why}")
            self._done()
            self.on_failure(d, why)
            return
        self.sent += 1
        self._done()
        self.on_success(d)

    def _done(self) -> None:
        with self._lock:
            self._busy -= 1

    def describe(self, channel: str) -> str:
        if channel == "webhook" and self.s.webhook is not None:
            return f"webhook {redact(self.s.webhook.url)}"
        if channel == "command":
            cmd = self.s.command
            first = cmd[0] if isinstance(cmd, list) else (shlex.split(cmd or "") or ["?"])[0]
            return f"command {first}"
        return channel

    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, urllib.error.HTTPError):
            text = f"HTTP {exc.code} {exc.reason}"
        elif isinstance(exc, urllib.error.URLError):
            text = f"cannot reach the server: {exc.reason}"
        elif isinstance(exc, CommandFailed):
            text = str(exc)
        else:
            text = f"{type(exc).__name__}: {exc}"
        return scrub(text, self.s.webhook.url if self.s.webhook else None)[:300]

    def _send(self, d: Delivery) -> None:
        if d.channel == "command":
            cmd: Any = self.s.command
            argv = cmd if isinstance(cmd, list) else shlex.split(cmd)
            res = subprocess.run(argv, input=encode(d.event) + b"\n", capture_output=True,
                                 timeout=self.s.timeout_s)
            if res.returncode != 0:
                err = res.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
                raise CommandFailed(f"exit code {res.returncode} {err[0][:200]}".strip())
            return
        hook = self.s.webhook
        assert hook is not None
        fmt = sniff_format(hook.url) if hook.format == "auto" else hook.format
        url, data = body(d.event, fmt, hook.url)
        req = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "nsa-tui"})
        with urllib.request.urlopen(req, timeout=self.s.timeout_s) as resp:  # noqa: S310 - the user's URL
            resp.read(1024)
