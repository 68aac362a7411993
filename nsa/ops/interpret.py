"""Triton's CPU interpreter (``TRITON_INTERPRET=1``) without its per-call re-patching.

The interpreter maps ``triton.language`` onto numpy by patching the language modules when a
kernel launch starts, and undoes it when the launch ends. It also patches them again at
every call of a nested ``@triton.jit`` helper, scanning every member of ``tl``,
``tl.tensor`` and ``tl.math`` each time. Inside a launch that changes nothing (the modules
already are patched), but it cost about a third of the time of the kernels with many
helper calls (the bitonic sort's compare-and-swap runs thousands of times per program):
one fwd+bwd at nsa-125m's head layout and T = 300 took 71 s, 45 s without it.
``install()`` skips such a nested patch when the launch has already patched the same
modules; a launch still patches and restores exactly as before.

Only the interpreter is touched, and only where its private ``_patch_lang`` exists (with
any other Triton this does nothing): compiled kernels on a GPU never see it. ``nsa.ops``
installs it on import when ``TRITON_INTERPRET=1`` (importing Triton then, about 0.1 s, even
in a process that never runs a kernel: a test setting only). It lives outside ``nsa/ops/triton/``
because it changes no kernel (the compile records hash that directory).
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable
from typing import Any

_state = threading.local()  # the language modules a running launch has patched, per thread
_seen: dict[Any, frozenset[int]] = {}  # per jit function: the language modules it sees


class _Unchanged:
    """The scope of a nested patch that patched nothing: nothing to restore."""

    def restore(self) -> None:
        pass


class _LaunchScope:
    """A launch's patch scope: restoring it also ends the launch's claim on the modules."""

    def __init__(self, scope: Any) -> None:
        self._scope = scope

    def restore(self) -> None:
        try:
            self._scope.restore()
        finally:
            _state.patched = None


def _langs_of(fn: Any, tl: Any) -> frozenset[int]:
    """Which of the language modules ``fn`` sees (what Triton's ``_patch_lang`` patches)."""
    langs = _seen.get(fn)
    if langs is None:
        langs = _seen[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                      if inspect.ismodule(v) and (v is tl or v is tl.core))
    return langs


def _wrap(original: Callable[[Any], Any], tl: Any) -> Callable[[Any], Any]:
    """``original`` (Triton's ``_patch_lang``), called only where it would change something."""

    def patch_lang(fn: Any) -> Any:
        langs = _langs_of(fn, tl)
        patched: frozenset[int] | None = getattr(_state, "patched", None)
        if patched is None:  # a launch starts: patch, and restore when it ends
            scope = original(fn)
            _state.patched = langs
            return _LaunchScope(scope)
        if langs <= patched:
            return _Unchanged()  # a nested helper inside a launch: already patched
        # A helper that sees a module the launch did not (Triton's own tl.max, tl.zeros see
        # tl.core): patch it the first time, as Triton does (and, as Triton does, keep it).
        scope = original(fn)
        _state.patched = patched | langs
        return scope

    patch_lang.__wrapped__ = original  # type: ignore[attr-defined]
    return patch_lang


def install() -> bool:
    """Wrap the interpreter's ``_patch_lang`` once; True when the interpreter is in use and
    is wrapped (now or before)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    if not callable(original):
        return False
    if not hasattr(original, "__wrapped__"):
        interpreter._patch_lang = _wrap(original, tl)
    return True
