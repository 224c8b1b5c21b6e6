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
    """Handler of one watched tensor: ``setitem(original, key, value)``, ``getitem(original, key)``
    and ``numpy(original)`` answer for Paddle's method (``setitem`` answers None once it made the
    write itself), or return ``NotImplemented`` to let Paddle's own method run."""

    def __init__(self, tensor) -> None:
        self.tensor = tensor

    def setitem(self, original, *args):
        return NotImplemented

    getitem = numpy = setitem


def _build(method: str):
    """The link of Paddle's tensor method: the calling thread's handler of that tensor first."""

    def build(original, ctx):
        @wraps(original)
        def link(self, *args, **kwargs):
            active = _scope.active
            handler = active.get(id(self)) if active and not kwargs else None
            if handler is not None and handler.tensor is self and not (args and method == "numpy"):
                result = getattr(handler, method)(original, *args)
                if result is not NotImplemented:
                    return result
            return original(self, *args, **kwargs)

        return link

    return build


#: the feature's patches of Paddle's tensor methods (their links pass through outside ``watching``)
PATCHES = tuple(Patch(Target("paddle", f"Tensor.{name}", absolute=True), _build(method))
                for name, method in (("__setitem__", "setitem"), ("__getitem__", "getitem"), ("numpy", "numpy")))


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


# --- FastDeploy 2.5's token-count event (feature ``step_syncs``) ---------------------------------


class _EventScope(threading.local):
    make = None  # while set on this thread: paddle.device.cuda.create_event() returns make(event)


_event_scope = _EventScope()


class DeferredEvent:
    """FastDeploy's ``token_num_event`` made inside the plugin's ``_prepare_inputs`` scope. While
    the plugin has it open (inside the ``_prepare_inputs`` and ``_postprocess`` calls it wraps),
    ``synchronize()`` only marks the wait as owed: the owed wait runs at the first read of a buffer
    it covers that the plugin does not answer itself (``settle()``, from that read's handler), and
    not at all when nothing reads. Closed, it is FastDeploy's event. (In this module so that a wait
    it runs is counted at FastDeploy's line, as the other links here.)"""

    def __init__(self, event) -> None:
        self.event = event
        self.active = True
        self.owed = False
        self.waited = False  # the host waited on it (FastDeploy's own wait ran)

    def record(self, *args, **kwargs):
        return self.event.record(*args, **kwargs)

    def synchronize(self):
        if not self.active:
            self.waited = True
            return self.event.synchronize()
        self.owed = True
        return None

    def settle(self) -> None:
        """Run the owed wait (a read the plugin does not answer needs the copies)."""
        if self.owed:
            self.owed = False
            self.waited = True
            self.event.synchronize()

    def answered(self) -> None:
        """The read the wait was owed for was answered exactly on the host: no wait is owed."""
        self.owed = False

    def open(self) -> None:
        self.active = True

    def close(self) -> bool:
        """FastDeploy's event again; True when a wait was owed and nothing needed it."""
        skipped, self.owed, self.active = self.owed, False, False
        return skipped

    def __getattr__(self, name):
        return getattr(self.event, name)


class ServedRead(Watched):
    """``numpy()`` of a pinned buffer that ``event``'s wait covers: ``answer()`` (an exact host
    value, or None), else the owed wait first and Paddle's own read."""

    def __init__(self, tensor, event: DeferredEvent, answer) -> None:
        super().__init__(tensor)
        self.event, self.answer = event, answer

    def numpy(self, original):
        value = self.answer()
        if value is not None:
            self.event.answered()
            return value
        self.event.settle()
        return NotImplemented


def _build_create_event(original, ctx):
    @wraps(original)
    def create_event(*args, **kwargs):
        event = original(*args, **kwargs)
        make = _event_scope.make
        return event if make is None else make(event)

    return create_event


@contextlib.contextmanager
def deferred_events(make):
    """Inside the block, on this thread, ``paddle.device.cuda.create_event()`` returns ``make(event)``."""
    previous = _event_scope.make
    _event_scope.make = make
    try:
        yield
    finally:
        _event_scope.make = previous


#: FastDeploy 2.5's ``paddle.device.cuda.create_event`` (passes through outside ``deferred_events``)
CREATE_EVENT = Patch(Target("paddle.device.cuda", "create_event", absolute=True), _build_create_event)
