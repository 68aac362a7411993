"""The panel's and the CLI's side of the hosts: talking to agents, and runs over several hosts.

``client`` speaks the agent protocol to one host over a transport (``nsa_tui.transport``
moves the bytes), with reconnects and resumable watches; ``coordinator`` steers one run
over several hosts (launch, kill, fallback) through their clients; ``merge`` turns the
hosts' parts of a run into one view (pure).
"""
