"""Reading a checkpoint's ``.metadata`` (DCP's index) without running arbitrary pickles, and
checking a just-written index before its checkpoint is committed. Why a module of its own: the
save path (checkpoint.py), the load path and the sampler's loader (nsa/infer/load.py) all read an
index through this one allow-list."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader

from nsa.train.checkpoint_error import CheckpointError

DCP_METADATA = ".metadata"

_ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"), ("builtins", "set"), ("builtins", "frozenset")}


class _MetadataUnpickler(pickle.Unpickler):
    """DCP writes ``.metadata`` with pickle; this reads it with an allow-list: DCP's record
    types, torch's dtypes, layouts and memory formats, and a few harmless builtins. Anything
    else (``os.system``, say) is refused instead of run."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.distributed.checkpoint.metadata" or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch":
            obj = getattr(torch, name, None)
            if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        raise CheckpointError(f"{DCP_METADATA} refers to {module}.{name}, which a checkpoint index never "
                              "holds: refusing to load it (not a checkpoint of ours, or tampered with)")


class SafeReader(FileSystemReader):
    """DCP's file reader with ``.metadata`` read through the allow-list above."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = Path(self.path) / DCP_METADATA
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def check_index(tmp: Path, files: list[str]) -> None:
    """Read ``.metadata`` back as a load will (where this node has it): a checkpoint that could
    not be loaded, or whose index names a file the save did not write, is not committed."""
    if not (tmp / DCP_METADATA).is_file():
        return  # written on rank 0's node (runs roots of their own per node)
    try:
        index = SafeReader(str(tmp)).read_metadata()
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{tmp}: cannot read back the {DCP_METADATA} just written "
                              f"(torch {torch.__version__}): {type(exc).__name__}: {exc}") from exc
    named = {getattr(info, "relative_path", None) for info in (index.storage_data or {}).values()}
    absent = sorted(str(n) for n in named - set(files) if n)
    if absent:
        raise CheckpointError(f"{tmp}: {DCP_METADATA} names files the save did not write: "
                              f"{', '.join(absent)}")


