"""The host agent: runs on the GPU host, speaks docs/agent-protocol.md on stdin/stdout.

Modules: ``server`` (request loop), ``runs`` (run records, liveness), ``launcher``
(launch/kill/fallback/resume/dump), ``watch`` (streams with offsets), ``tail`` (line
reading), ``sampler`` (NVML/psutil host samples), ``supervise`` (a run's launcher).
"""
