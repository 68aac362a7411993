"""Runs on a Slurm cluster, reached through its login node (docs/slurm.md).

``script``: the batch script and sbatch's argument list (pure); ``queue``: reading squeue,
scontrol and sacct (parsing pure, the commands behind one small class); ``version``: which
flags a cluster's Slurm has; ``ops``: the agent's side (submit, cancel, relaunch, view);
``jobside``: what the batch script runs on the allocation's first node before torchrun.
"""
