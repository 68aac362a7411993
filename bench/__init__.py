"""GPU benchmarks of the NSA kernels against dense attention (``python -m bench.run``)."""
