"""The host agent: runs on the GPU host, speaks docs/agent-protocol.md on stdin/stdout.

- requests: ``server`` (the request loop), ``ops`` (one handler per operation), ``errors``;
- reading runs: ``runs`` (the runs root, run views, status), ``owners`` (who owns a run's
  processes, leases), ``shared`` (a runs root shared by several hosts), ``procs`` (which
  processes belong to a run), ``watch`` and ``follow`` (a run's streams with positions),
  ``watchlists`` (the run list, host samples, alerts as subscriptions), ``sampler`` (host
  samples);
- changing runs: ``backend`` (the interface each way of running a job implements) and
  ``backends`` (which one a launch or a run gets): ``direct_backend`` over ``launcher``
  (launch, kill, dump) and ``relaunch`` (fallback, resume), ``slurm_backend`` (batch jobs
  through nsa_tui/slurm); ``runlock``, ``describe`` and ``preflight`` (checks before a launch), ``diskroom``,
  ``housekeeping`` (archive, delete), ``ckptfiles`` (checkpoint files between hosts);
- beside a run: ``supervise`` (the parent of torchrun), ``slurmwatch`` (beside a Slurm job),
  ``watchdog``, ``policy``, ``evidence``, ``dump``;
- judging what was trained: ``sample``, ``evaluate``.
"""
