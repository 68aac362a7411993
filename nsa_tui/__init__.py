"""nsa_tui: a terminal control panel for NSA training runs, local or over SSH."""

__version__ = "0.1.0"
