"""The panel's and the CLI's side of the hosts: talking to agents, and runs over several hosts.

``connection`` keeps one agent's channel over a transport (``nsa_tui.transport`` moves the
bytes): replies, events, reconnects and resumable subscriptions; ``client`` puts the agent's
operations on it, typed; ``coordinator`` steers one run over several hosts (launch, kill,
fallback) through their clients; ``merge`` turns the hosts' parts of a run into one view
(pure); ``spec`` reads a host list (``gpu1:/scratch/runs,gpu2``: hosts and their runs roots).
"""
