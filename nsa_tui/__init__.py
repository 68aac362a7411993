"""nsa_tui: a terminal control panel for NSA training runs, local or over SSH.

Packages by job (docs/architecture.md draws the data path through them):

- ``app``: the Textual panel (state, reducer, services, screens, widgets);
- ``cli``: the ``nsa-tui`` command line;
- ``hosts``: the client of one host's agent, and runs over several hosts;
- ``transport``: the bytes to an agent, as a local subprocess or over SSH;
- ``agent``: what runs on the host (the agent, a run's supervisor and watchdog);
- ``slurm``: runs submitted through a Slurm login node (batch script, queue state, requeue);
- ``health``: alert rules, the alert ledger, root causes, stack dumps, notifications;
- ``user``: the user's settings and what the panel remembers between sessions;
- ``install``: nsa-tui's own code onto hosts and into child processes.

``fmt`` is the one module at the root: every number becomes text there, for the panel, the
CLI and the alerts alike.
"""

__version__ = "0.1.0"
