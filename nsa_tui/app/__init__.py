"""nsa-tui's control panel (Textual). `main` is what `nsa-tui` and `nsa-tui connect` call."""

from __future__ import annotations


def main(destinations: list[str]) -> None:
    """Run the panel on `destinations` ("local" or SSH destinations) until the user quits.

    Quitting leaves every run going; the message printed says which ones.
    """
    from nsa_tui.app.app import NsaApp

    app = NsaApp(destinations or ["local"])
    message = app.run()
    if message:
        print(message)


__all__ = ["main"]
