"""The one error of checkpoint loading, in a module of its own so that both checkpoint formats
(checkpoint, checkpoint_legacy) raise it without importing each other."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, or does not fit this run."""
