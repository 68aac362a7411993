"""Count what would stall a GPU's host, on any device: the checks a CPU-only test can make of
code that must run without host syncs (a decode step captured as a CUDA graph, a training
step that keeps the GPU fed).

On CUDA, the host waits for the device whenever a value computed there is read on the host
(``.item()``, ``int(t)``, ``if t:``, ``.tolist()``, ``.cpu()``) or an op's output shape
depends on values (``nonzero``, boolean-mask indexing, ``unique``); and a tensor built from
host data inside the step is a host-to-device copy, which a CUDA graph cannot capture. Those
happen in the same places on CPU, where they cost nothing and go unseen: ``HostSyncs``
records each of them, with the op, while a block runs.

    with HostSyncs() as syncs:
        decode_step(model, state, tokens)
    assert not syncs.events, syncs.report()
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["HostSyncs", "SyncEvent", "OpCounter", "OpTrace"]

_ROOT = str(Path(__file__).resolve().parents[1]).replace("\\", "/") + "/"  # callers shown relative to it

# ops whose output shape depends on tensor values: the host must learn the size first
_DATA_DEPENDENT = {
    "aten.nonzero.default", "aten.masked_select.default", "aten._unique2.default", "aten.unique_dim.default",
    "aten.unique_consecutive.default", "aten.repeat_interleave.Tensor", "aten.bincount.default",
}


@dataclass
class SyncEvent:
    """One host sync (or host-to-device copy): what it was and where our code asked for it."""

    kind: str  # "read" (a value read on the host), "shape" (a data-dependent shape), "upload" (host data)
    op: str
    where: str


@dataclass
class HostSyncs(TorchDispatchMode):
    """Records host syncs and host-data uploads made inside the ``with`` block (see the module
    docstring). ``.tolist()`` and ``.numpy()`` do not reach the dispatcher: they are recorded
    by wrapping the two methods for the duration of the block."""

    events: list[SyncEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> HostSyncs:
        for name in ("tolist", "numpy"):
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def wrapped(t: torch.Tensor, *a: Any, _name: str = name, _orig: Any = original, **k: Any) -> Any:
                self._record("read", f"Tensor.{_name}")
                return _orig(t, *a, **k)

            setattr(torch.Tensor, name, wrapped)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()

    def _record(self, kind: str, op: str) -> None:
        self.events.append(SyncEvent(kind, op, _caller()))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        if name == "aten._local_scalar_dense.default":
            self._record("read", name)
        elif name in _DATA_DEPENDENT:
            self._record("shape", name)
        elif name == "aten.index.Tensor" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self._record("shape", name + " (boolean mask)")
        elif name in ("aten.lift_fresh.default", "aten.lift_fresh_copy.default"):
            self._record("upload", name + " (torch.tensor of host data)")
        elif name == "aten._to_copy.default" and "device" in (kwargs or {}) and \
                torch.device(kwargs["device"]) != args[0].device:
            self._record("read" if torch.device(kwargs["device"]).type == "cpu" else "upload", name)
        return func(*args, **(kwargs or {}))

    def counts(self) -> Counter[str]:
        return Counter(e.kind for e in self.events)

    def report(self) -> str:
        """One line per distinct (kind, op, caller), most frequent first."""
        c = Counter((e.kind, e.op, e.where) for e in self.events)
        return "\n".join(f"{n}x {kind} {op} at {where}" for (kind, op, where), n in c.most_common())


# aten ops that only make a new view of a tensor or a host scalar: no device work
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "_reshape_alias", "reshape", "expand", "select", "slice", "unsqueeze",
    "squeeze", "as_strided", "t", "transpose", "permute", "detach", "alias", "split", "split_with_sizes",
    "unfold", "unbind", "chunk", "narrow", "scalar_tensor", "view_as_real", "view_as_complex",
})
# allocations without a fill: memory from the caching allocator (or a CUDA graph's pool), no kernel
ALLOC_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside the ``with`` block (views and metadata ops
    included): a device-independent proxy for kernel launches per step."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def launching(self) -> int:
        """The ops that run device work: all but views and metadata (``VIEW_OPS``) and bare
        allocations (``ALLOC_OPS``). On a GPU each is about one kernel launch, which is what a
        step replayed as a CUDA graph pays."""
        return sum(n for op, n in self.ops.items() if op.split(".")[1] not in VIEW_OPS | ALLOC_OPS)


class OpTrace(TorchDispatchMode):
    """Each op dispatched inside the ``with`` block, with its tensors' dtype, shape and strides
    and every other argument as given: what a CUDA graph records. Two runs of a step with equal
    traces are replayed right by one capture; a host number that differs between them would be
    frozen into it. ``values``: also the values of 0-dim tensors (a decode step has no 0-dim
    tensor whose value may change; a train step's loss is one)."""

    def __init__(self, values: bool = True) -> None:
        super().__init__()
        self.values = values
        self.ops: list[tuple[Any, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        flat, _ = tree_flatten((args, kwargs or {}))
        self.ops.append((str(func), *(self.signature(a, self.values) for a in flat)))
        return func(*args, **(kwargs or {}))

    @staticmethod
    def signature(a: object, values: bool = True) -> object:
        """What a captured op keeps of an argument (with ``values``, a 0-dim tensor's value is
        read: tests only)."""
        if isinstance(a, torch.Tensor):
            value = a.item() if values and a.dim() == 0 else None
            return ("tensor", a.dtype, tuple(a.shape), a.stride(), value)
        if isinstance(a, torch.Generator):
            return "generator"
        return a

    def first_difference(self, other: OpTrace) -> str | None:
        """Where ``other`` first differs from this trace (None: the same ops and arguments)."""
        for j, (a, b) in enumerate(zip(self.ops, other.ops)):
            if a != b:
                return f"op {j}: {a} vs {b}"
        if len(self.ops) != len(other.ops):
            return f"{len(self.ops)} ops vs {len(other.ops)}"
        return None


def _caller() -> str:
    """The innermost frame of nsa code (or the test) that led here: file:line function."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        f = frame.filename.replace("\\", "/")
        if "/torch/" in f or f.endswith("/nsa/syncs.py"):
            continue
        short = f[len(_ROOT):] if f.startswith(_ROOT) else "/".join(f.split("/")[-3:])
        return f"{short}:{frame.lineno} {frame.name}"
    return "?"
