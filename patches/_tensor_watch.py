"""Scoped observation of host writes and reads of a few FastDeploy tensors (feature ``step_syncs``).

FastDeploy 2.4 writes its step state from the host at task insertion
(``share_inputs["seq_lens_encoder"][idx : idx + 1] = length`` ...) and reads some of it back on the
host (``if share_inputs["is_block_step"][idx]:``, ``bad_tokens_len.numpy()``). To keep a host copy
of that state without reproducing FastDeploy's insert logic, the plugin watches the tensors
themselves: Paddle's ``Tensor.__setitem__``, ``__getitem__`` and ``numpy`` are declared patches of
the feature (``PATCHES``: applied and reverted with it, listed by ``status()``'s feature and by the
one-wrapper-per-attribute test), and their links do nothing but call Paddle's own method unless the
calling thread is inside ``watching(...)`` and the tensor is one of its watched tensors (by
identity). Another thread - FastDeploy's output thread, a ZMQ thread - always gets Paddle's own
behaviour, even during an insert; nothing is replaced class-wide around a FastDeploy call.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import paddle

from fd_async_copy_plugin.registry.patch import Patch, Target, wraps


class _Scope(threading.local):
    active: dict | None = None  # id(tensor) -> Watched, while this thread is inside watching()


_scope = _Scope()


class Watched:
    """Handler of one watched tensor. ``setitem`` returns True when it performed the write itself
    (Paddle's own ``__setitem__`` is then not called); ``getitem``/``numpy`` return ``NotImplemented``
    to let Paddle answer."""

    def __init__(self, tensor) -> None:
        self.tensor = tensor

    def setitem(self, original, key, value) -> bool:
        return False

    def getitem(self, original, key):
        return NotImplemented

    def numpy(self, original):
        return NotImplemented


def _handler(t) -> "Watched | None":
    active = _scope.active
    if not active:
        return None
    handler = active.get(id(t))
    return handler if handler is not None and handler.tensor is t else None


def _build_setitem(original, ctx):
    @wraps(original)
    def __setitem__(self, key, value):
        handler = _handler(self)
        if handler is not None and handler.setitem(original, key, value):
            return None
        return original(self, key, value)

    return __setitem__


def _build_getitem(original, ctx):
    @wraps(original)
    def __getitem__(self, key):
        handler = _handler(self)
        if handler is not None:
            result = handler.getitem(original, key)
            if result is not NotImplemented:
                return result
        return original(self, key)

    return __getitem__


def _build_numpy(original, ctx):
    @wraps(original)
    def numpy(self, *args, **kwargs):
        handler = _handler(self)
        if handler is not None and not args and not kwargs:
            result = handler.numpy(original)
            if result is not NotImplemented:
                return result
        return original(self, *args, **kwargs)

    return numpy


#: the feature's patches of Paddle's tensor methods (their links pass through outside ``watching``)
PATCHES = (
    Patch(Target("paddle", "Tensor.__setitem__", absolute=True), _build_setitem),
    Patch(Target("paddle", "Tensor.__getitem__", absolute=True), _build_getitem),
    Patch(Target("paddle", "Tensor.numpy", absolute=True), _build_numpy),
)


@contextlib.contextmanager
def watching(handlers):
    """Watch ``handlers`` (``Watched`` objects) on this thread for the duration of the block."""
    previous = _scope.active
    active = dict(previous or {})
    for h in handlers:
        if h is not None and h.tensor is not None:
            active[id(h.tensor)] = h
    _scope.active = active
    try:
        yield
    finally:
        _scope.active = previous


_BASIC = (int, np.integer, slice, type(Ellipsis))


def basic_key(key) -> bool:
    """Integer/slice indexing (what numpy applies identically); masks and tensors are not."""
    keys = key if isinstance(key, tuple) else (key,)
    return all(isinstance(k, _BASIC) and not isinstance(k, (bool, np.bool_)) for k in keys)


_UNKNOWN = object()


def host_value(value, target):
    """``value`` of a host write as numpy, or ``_UNKNOWN`` when it is (or may be) device data."""
    if isinstance(value, (bool, int, float, np.generic, np.ndarray)):
        return value
    if isinstance(value, (list, tuple)):
        try:
            return np.asarray(value)
        except Exception:
            return _UNKNOWN
    if isinstance(value, paddle.Tensor):
        # A host tensor written into a device tensor is a host value; anything on the target's own
        # place may be device data, which the host does not know without a copy.
        if value.place.is_cpu_place() and not target.place.is_cpu_place():
            return value.numpy()
    return _UNKNOWN


def rows_of(key, nrows: int):
    """The rows (first dimension) a basic ``key`` touches."""
    first = key[0] if isinstance(key, tuple) and key else key
    if isinstance(first, (int, np.integer)):
        i = int(first)
        return range(i + nrows if i < 0 else i, (i + nrows if i < 0 else i) + 1)
    if isinstance(first, slice):
        return range(*first.indices(nrows))
    return range(nrows)
