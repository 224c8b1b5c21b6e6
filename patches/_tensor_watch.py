"""Scoped observation of host writes and reads of a few FastDeploy tensors (feature ``step_syncs``).

FastDeploy 2.4 writes its step state from the host at task insertion
(``share_inputs["seq_lens_encoder"][idx : idx + 1] = length`` ...) and reads some of it back on the
host (``if share_inputs["is_block_step"][idx]:``, ``bad_tokens_len.numpy()``). To keep a host copy
of that state without reproducing FastDeploy's insert logic, the plugin watches the tensors
themselves: inside ``watching(...)`` Paddle's ``Tensor.__setitem__``, ``__getitem__`` and ``numpy``
are wrapped, and a call on a watched tensor (by identity) goes to its ``Watched`` handler first.
Every other tensor - the output thread's included - goes straight to Paddle's own method.

The wrappers are installed for the duration of one FastDeploy call (an insert, ``_prepare_inputs``)
and the previous class attributes are put back afterwards, whatever was there (device tracking in
tests wraps the same methods around a whole run).
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import paddle

_lock = threading.Lock()
_active: dict[int, "Watched"] = {}
_depth = 0
_saved: dict[str, object] = {}
_METHODS = ("__setitem__", "__getitem__", "numpy")


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
    handler = _active.get(id(t))
    return handler if handler is not None and handler.tensor is t else None


def _wrap(name: str, original):
    if name == "__setitem__":
        def __setitem__(self, key, value):
            handler = _handler(self)
            if handler is not None and handler.setitem(original, key, value):
                return None
            return original(self, key, value)
        return __setitem__
    if name == "__getitem__":
        def __getitem__(self, key):
            handler = _handler(self)
            if handler is not None:
                result = handler.getitem(original, key)
                if result is not NotImplemented:
                    return result
            return original(self, key)
        return __getitem__

    def numpy(self, *args, **kwargs):
        handler = _handler(self)
        if handler is not None and not args and not kwargs:
            result = handler.numpy(original)
            if result is not NotImplemented:
                return result
        return original(self, *args, **kwargs)
    return numpy


@contextlib.contextmanager
def watching(handlers):
    """Watch ``handlers`` (``Watched`` objects) for the duration of the block."""
    global _depth
    handlers = [h for h in handlers if h is not None and h.tensor is not None]
    with _lock:
        if _depth == 0:
            for name in _METHODS:
                original = paddle.Tensor.__dict__.get(name, getattr(paddle.Tensor, name))
                _saved[name] = original
                setattr(paddle.Tensor, name, _wrap(name, original))
        _depth += 1
        for h in handlers:
            _active[id(h.tensor)] = h
    try:
        yield
    finally:
        with _lock:
            for h in handlers:
                if _active.get(id(h.tensor)) is h:
                    del _active[id(h.tensor)]
            _depth -= 1
            if _depth == 0:
                for name, original in _saved.items():
                    setattr(paddle.Tensor, name, original)
                _saved.clear()


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
