"""Notifications through a real HTTP server on 127.0.0.1 and real commands: bodies per format,
retries with backoff, a failure reported (never raised), secrets never in what is said."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nsa.contract import Alert, AlertEvent
from nsa_tui.health.notify import Notifier, body, redact, sniff_format
from nsa_tui.user.settings import NotifySettings, WebhookSettings

SECRET = "T0000/B0000/s3cr3tT0k3n"


class Hook:
    """A webhook receiver that answers ``status`` (a list: one per request, the last repeats)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.status = [200]
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests.append((self.path, json.loads(data)))
                code = hook.status.pop(0) if len(hook.status) > 1 else hook.status[0]
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()


def event(severity: str = "critical", action: str = "raised") -> AlertEvent:
    a = Alert(kind="stall", severity=severity, host="gpu1", run="r1", rank=1,  # type: ignore[arg-type]
              message="rank 1: step 20 has not advanced for 61 s", evidence=["stacks/watchdog-1.txt"])
    return AlertEvent(ts=1.0, action=action, id="3-stall", alert=a)  # type: ignore[arg-type]


def wait(cond, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("fmt", ["json", "slack", "discord", "ntfy"])
def test_each_format_posts_its_body(hook: Hook, fmt: str) -> None:
    n = Notifier(NotifySettings(webhook=WebhookSettings(url=f"{hook.url}/topic-{SECRET}", format=fmt)))  # type: ignore[arg-type]
    n.submit(event())
    assert n.drain(20) and n.sent == 1
    path, data = hook.requests[0]
    if fmt == "json":
        assert path == f"/topic-{SECRET}" and data["id"] == "3-stall" and data["alert"]["rank"] == 1
    elif fmt == "slack":
        assert "[CRITICAL] stall on gpu1 r1 rank 1" in data["text"] and "61 s" in data["text"]
    elif fmt == "discord":
        assert data["content"].startswith("[CRITICAL] stall")
    else:  # ntfy's JSON publishing: to the server's root, the topic in the body
        assert path == "/" and data["topic"] == f"topic-{SECRET}" and data["priority"] == 5
        assert data["title"].startswith("[CRITICAL] stall")


def test_formats_are_sniffed_from_the_host() -> None:
    assert sniff_format("https://hooks.slack.com/services/T/B/X") == "slack"
    assert sniff_format("https://discord.com/api/webhooks/1/abc") == "discord"
    assert sniff_format("https://ntfy.sh/mytopic") == "ntfy"
    assert sniff_format("https://example.org/hook") == "json"
    url, data = body(event(), "ntfy", "https://ntfy.example.net/alerts")
    assert url == "https://ntfy.example.net/" and json.loads(data)["topic"] == "alerts"


def test_a_failing_webhook_is_retried_with_backoff_then_reported_without_its_secret(hook: Hook) -> None:
    hook.status = [500, 500, 500, 200]
    failures: list[str] = []
    logged: list[str] = []
    url = f"{hook.url}/services/{SECRET}?token={SECRET}"
    n = Notifier(NotifySettings(webhook=WebhookSettings(url=url), retries=3, backoff_s=0.1),
                 on_failure=lambda d, why: failures.append(why), log=logged.append)
    t0 = time.monotonic()
    n.submit(event())
    submitted = time.monotonic() - t0
    assert submitted < 0.05  # never waits on the network
    assert n.drain(20)
    assert len(hook.requests) == 3 and n.failed == 1 and failures == ["HTTP 500 Internal Server Error"]
    assert time.monotonic() - t0 >= 0.1 + 0.2  # backoff: 0.1 s, then 0.2 s
    assert logged and "webhook http://127.0.0.1" in logged[0] and "/***" in logged[0]
    assert not any(SECRET in x for x in logged + failures)
    n.submit(event())  # the next one gets through (the 4th answer is 200)
    wait(lambda: n.sent == 1)


def test_an_unreachable_webhook_and_a_failing_command(tmp_path: Path) -> None:
    failures: list[str] = []
    url = f"http://127.0.0.1:1/hook/{SECRET}"  # nothing listens on port 1
    n = Notifier(NotifySettings(webhook=WebhookSettings(url=url), retries=1, timeout_s=5),
                 on_failure=lambda d, why: failures.append(f"{n.describe(d.channel)}: {why}"))
    n.submit(event())
    assert n.drain(20) and failures and "cannot reach the server" in failures[0]
    assert SECRET not in failures[0] and "http://127.0.0.1:1/***" in failures[0]
    out = tmp_path / "got.json"
    ok = Notifier(NotifySettings(command=[sys.executable, "-c", f"import sys; open({str(out)!r}, 'w').write("
                                                                "sys.stdin.read())"]))
    ok.submit(event())
    assert ok.drain(20) and json.loads(out.read_text())["id"] == "3-stall"
    bad: list[str] = []
    n2 = Notifier(NotifySettings(command="sh -c 'echo no pager >&2; exit 3'", retries=2, backoff_s=0.01),
                  on_failure=lambda d, why: bad.append(why))
    n2.submit(event())
    assert n2.drain(20) and bad == ["exit code 3 no pager"]


def test_only_the_events_and_severities_asked_for_are_sent(hook: Hook) -> None:
    n = Notifier(NotifySettings(webhook=WebhookSettings(url=hook.url), min_severity="critical",
                                events=["raised", "resolved"]))
    for ev in (event("warning"), event(action="updated"), event(), event(action="resolved")):
        n.submit(ev)
    assert n.drain(20) and n.sent == 2


def test_redact_keeps_only_scheme_and_host() -> None:
    assert redact("https://hooks.slack.com/services/T0/B0/XXXX") == "https://hooks.slack.com/***"
    assert redact("https://user:pw@ntfy.sh:8443/topic?auth=x") == "https://ntfy.sh:8443/***"
    assert redact("https://example.org") == "https://example.org"
