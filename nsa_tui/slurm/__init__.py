"""Runs on a Slurm cluster, reached through its login node (docs/slurm.md).

``script``: the batch script and sbatch's argument list (pure); ``queue``: reading squeue,
scontrol and sacct (parsing pure, the commands behind one small class); ``version``: which
flags a cluster's Slurm has; ``view``: a run's queue state and status; ``jobside``: what the
batch script runs on the allocation's first node before torchrun (its checkpoint, its
rendezvous port: ``rdzvport``). The agent's side (submit, cancel, relaunch) is
nsa_tui/agent/slurm_backend.py: this package imports nothing of the agent, so it stays the
pure half and the agent's launch backends depend on it, never the other way round.
"""
