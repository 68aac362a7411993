"""Messages from the services to the app: what only the UI may do (dialogs, toasts, selection).

Why messages: services run in workers and must not reach into screens; the app decides
how to show things (and tests can watch the messages).
"""

from __future__ import annotations

import asyncio

from textual.message import Message


class Toast(Message):
    """Show a notification."""

    def __init__(self, text: str, title: str = "", severity: str = "information", timeout: float = 8) -> None:
        super().__init__()
        self.text, self.title, self.severity, self.timeout = text, title, severity, timeout


class AskHostKey(Message):
    """An unknown SSH host key: ask the user; the answer goes into ``answer``."""

    def __init__(self, host: str, fingerprint: str, answer: asyncio.Future[bool]) -> None:
        super().__init__()
        self.host, self.fingerprint, self.answer = host, fingerprint, answer


class SelectRun(Message):
    """Show this run everywhere (after a launch, fallback or resume)."""

    def __init__(self, host: str, run_id: str) -> None:
        super().__init__()
        self.host, self.run_id = host, run_id
