"""Getting nsa-tui's own code where it runs: onto SSH hosts, and into child processes.

``setup_host`` (``nsa-tui setup HOST``) installs the running version on a host, keeping its
torch; ``wheel`` builds a wheel of the running code however it was installed; ``pkgpath``
gives child processes (agent, supervisor, ranks) the same import path as this process.
"""
