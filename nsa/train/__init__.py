"""nsa-train: the torchrun training runtime and the run directory it writes (docs/run-directory.md)."""
