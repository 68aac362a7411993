"""The panes of the main screen; each draws from plain state (nsa_tui.app.state)."""
