"""Scoped observation of host writes and reads of a few FastDeploy tensors (feature ``step_syncs``).

FastDeploy 2.4 writes its step state from the host at task insertion
(``share_inputs["seq_lens_encoder"][idx : idx + 1] = length`` ...) and reads some of it back on the
host (``if share_inputs["is_block_step"][idx]:``, ``bad_tokens_len.numpy()``). The plugin watches
those tensors where FastDeploy reaches them: for one FastDeploy call (an insert, ``_prepare_inputs``)
``watching(handlers, runner=...)`` makes ``runner.share_inputs`` a ``ScopedInputs`` view (and
``runner.seq_lens_this_time_buffer`` a stand-in) whose item access hands back a ``StandIn`` for a
watched tensor, on the calling thread only, while the call runs: its ``__setitem__``,
``__getitem__`` and ``numpy`` go to the tensor's handler first, everything else is the tensor's.
Paddle's tensor class is never touched. A write the watch did not see (an earlier reference, a
view, another thread) moves the tensor's in-place version counter: checked before each answer and
at the end, it loses the handler's shadow (reloaded, counted) rather than leaving it stale.
"""

from __future__ import annotations

import threading

import numpy as np
import paddle

from fd_async_copy_plugin.registry.patch import Patch, Target, wraps

from .step import current

_ident = threading.get_ident

#: runner attributes that alias a share_inputs tensor FastDeploy writes inside the watched calls
RUNNER_ALIASES = ("seq_lens_this_time_buffer",)
#: objects FastDeploy builds in a watched call that keep its share_inputs (re-pointed at the end)
HOLDERS = ("sampling_metadata", "forward_meta")


class Watched:
    """Handler of one watched tensor: ``setitem(key, value)``, ``getitem(key)`` and ``numpy()``
    answer for Paddle's method (``setitem``: None once it wrote), or return ``NotImplemented`` for
    Paddle's own. ``unseen()``: the tensor was written past the watch. ``once``: a read-only
    handler read once per call; when all of a scope's are and have been read, the runner gets its
    ``share_inputs`` back for the rest of the call."""

    once = False
    #: True: the call gets no view until the handler's owner installs it (``watching.install``) at
    #: a point of the call before the read (the version check still starts with the call)
    later = False
    scope: "watching | None" = None  # the watch the handler is in (the last one made with it)

    def __init__(self, tensor) -> None:
        self.tensor = tensor
        self.version = 0  # the tensor's in-place version the watch last saw

    def setitem(self, *args):
        return NotImplemented

    getitem = numpy = setitem

    def unseen(self) -> None:
        """The tensor was written where the watch did not see it."""

    def hand_out(self, scope: "watching"):
        """What the watched call gets for the tensor (asked once per key and scope): a ``StandIn``;
        None for the tensor itself."""
        return StandIn(self.tensor, self, scope)


def _real(value):
    return value.tensor if type(value) is StandIn else value


class StandIn:
    """A watched tensor as FastDeploy's watched call gets it from ``share_inputs``: its handler
    answers ``__setitem__``, ``__getitem__`` and ``numpy()``; everything else is the tensor's. It is
    not a ``paddle.Tensor``: it is handed out only for the tensors whose watched calls use nothing
    else on them (``share_inputs[k] = stand_in`` stores the tensor)."""

    __slots__ = ("tensor", "handler", "scope")

    def __init__(self, tensor, handler: Watched, scope: "watching") -> None:
        self.tensor, self.handler, self.scope = tensor, handler, scope

    def __setitem__(self, key, value):
        if type(value) is StandIn:
            value = value.tensor
        t, h, scope = self.tensor, self.handler, self.scope
        if not scope.open or _ident() != scope.owner:
            t[key] = value
            return
        if t._inplace_version() != h.version:
            h.unseen()
        if h.setitem(key, value) is NotImplemented:
            t[key] = value
        h.version = t._inplace_version()

    def _reader(self):
        """The handler when the watched call makes this read (its thread, while it runs), after the
        version check (a write past the watch is told once), else None."""
        scope, h, t = self.scope, self.handler, self.tensor
        if not scope.open or _ident() != scope.owner:
            return None
        if t._inplace_version() != h.version:
            h.unseen()
            h.version = t._inplace_version()
        if scope.pending is not None:
            scope.read(t)  # (it answers below; the runner's objects are given back meanwhile)
        return h

    def __getitem__(self, key):
        if type(key) is StandIn:
            key = key.tensor
        h = self._reader()
        result = NotImplemented if h is None else h.getitem(key)
        return self.tensor[key] if result is NotImplemented else result

    def numpy(self, *args, **kwargs):
        h = None if args or kwargs else self._reader()
        result = NotImplemented if h is None else h.numpy()
        return self.tensor.numpy(*args, **kwargs) if result is NotImplemented else result

    def __getattr__(self, name):
        return getattr(self.tensor, name)


class ScopedInputs:
    """FastDeploy's ``share_inputs`` (a dict on 2.4, an ``InputBatch`` on 2.5) during a watched
    call: item access hands back what a watched tensor's handler hands out (on the call's thread,
    while it runs); writes store real tensors; attributes and everything else are the real object's.
    Once the call returned (or on another thread) it is the real object in all but identity."""

    __slots__ = ("_real_", "_scope_", "_seen_")

    def __init__(self, real, scope: "watching") -> None:
        object.__setattr__(self, "_real_", real)
        object.__setattr__(self, "_scope_", scope)
        #: key -> (the value last found there, what the call gets for it or None): a key read again
        #: while it holds the same object is decided without a call (a key written through the view
        #: is dropped at once, so the view holds no value FastDeploy replaced through it)
        object.__setattr__(self, "_seen_", {})

    def __getitem__(self, key):
        value, seen, scope = self._real_[key], self._seen_, self._scope_
        last, out = seen.get(key, (None, None))  # (a constant: nothing is built per call)
        if last is not value:  # (first read of the key in this scope, or it holds another object)
            h = scope.handlers.get(id(value))
            out = h.hand_out(scope) if h is not None and h.tensor is value else None
            seen[key] = (value, out)
        return out if out is not None and scope.open and _ident() == scope.owner else value

    def __setitem__(self, key, value):
        self._seen_.pop(key, None)
        self._real_[key] = _real(value)

    def __contains__(self, key):
        return key in self._real_

    def __iter__(self):
        return iter(self._real_)

    def __len__(self):
        return len(self._real_)

    def __getattr__(self, name):
        return getattr(self._real_, name)

    def __setattr__(self, name, value):
        self._seen_.pop(name, None)  # (``InputBatch``: item access is attribute access)
        setattr(self._real_, name, _real(value))


class watching:
    """``with watching(handlers, runner=runner):`` watch ``handlers`` (``Watched`` objects) on this
    thread while the block runs: ``runner.share_inputs`` (and the runner attributes in
    ``RUNNER_ALIASES`` that hold a watched tensor) hand out what the handlers give meanwhile."""

    __slots__ = ("runner", "owner", "open", "handlers", "swapped", "pending", "later")

    def __init__(self, handlers, *, runner) -> None:
        self.runner, self.owner, self.open = runner, _ident(), False
        self.handlers, once, self.later = {}, True, False  # id(tensor) -> its handler
        for h in handlers:
            if h is not None and h.tensor is not None:
                h.version, h.scope = h.tensor._inplace_version(), self
                self.handlers[id(h.tensor)] = h
                once, self.later = once and h.once, self.later or h.later
        # the reads still to come when every handler reads once (None: the view stays to the end)
        self.pending = set(self.handlers) if self.handlers and once else None

    def __enter__(self):
        self.swapped, self.open = [], True
        if self.handlers and not self.later:  # (nothing to watch: the runner keeps its own objects)
            self.install()
        return self

    def install(self) -> None:
        """The view and the stand-ins on the runner (at the start of the call, or where a ``later``
        handler's owner says, once, while the call runs on its thread)."""
        if not self.open or self.swapped or _ident() != self.owner:
            return
        runner, attrs = self.runner, self.runner.__dict__
        real = runner.share_inputs
        self.swapped = [("share_inputs", real, ScopedInputs(real, self))]
        for name in RUNNER_ALIASES:
            h = self.handlers.get(id(attrs.get(name)))
            out = h.hand_out(self) if h is not None and h.tensor is attrs[name] else None
            if out is not None:
                self.swapped.append((name, h.tensor, out))
        for name, _, stand_in in self.swapped:
            setattr(runner, name, stand_in)

    def read(self, tensor) -> None:
        """A ``once`` handler's read was made: the last one gives the runner its objects back."""
        self.pending.discard(id(tensor))
        if not self.pending:
            self._restore()

    def _restore(self) -> None:
        runner, attrs = self.runner, self.runner.__dict__
        for name, value, stand_in in self.swapped:
            if attrs.get(name) is stand_in:  # else FastDeploy re-created it during the call: FD's stays
                setattr(runner, name, value)
        if self.swapped:
            _, real, view = self.swapped[0]
            for name in HOLDERS:  # what FastDeploy built in the call keeps the real object
                if getattr(attrs.get(name), "share_inputs", None) is view:
                    attrs[name].share_inputs = real
        self.swapped = []

    def __exit__(self, *exc) -> None:
        self.open = False
        self._restore()
        for h in self.handlers.values():  # a write the watch did not see, after the last it saw
            if h.tensor._inplace_version() != h.version:
                h.unseen()
                h.version = h.tensor._inplace_version()


_BASIC = (int, np.integer, slice, type(Ellipsis))
#: the exact types of a basic index part (``bool`` is not ``int`` here: ``type(True) is bool``)
_PLAIN = frozenset((int, slice, type(Ellipsis)))


def basic_key(key) -> bool:
    """Integer/slice indexing (what numpy applies identically); masks and tensors are not. (The
    common parts are told by exact type, without a builtin call.)"""
    for k in key if type(key) is tuple else (key,):
        if type(k) not in _PLAIN and (not isinstance(k, _BASIC) or isinstance(k, (bool, np.bool_))):
            return False
    return True


_UNKNOWN = object()
#: values ``host_value`` hands back as they are, by exact type (a caller may test ``type(v) in``)
HOST_TYPES = frozenset((bool, int, float, np.ndarray, np.bool_, np.int32, np.int64, np.float32))


def host_value(value, target):
    """``value`` of a host write as numpy, or ``_UNKNOWN`` when it is (or may be) device data."""
    if type(value) in HOST_TYPES or isinstance(value, (bool, int, float, np.generic, np.ndarray)):
        return value
    if isinstance(value, (list, tuple)):
        try:
            return np.asarray(value)
        except Exception:
            return _UNKNOWN
    # A host tensor written into a device tensor is a host value; anything on the target's own
    # place may be device data, which the host does not know without a copy.
    if isinstance(value, paddle.Tensor) and value.place.is_cpu_place() and not target.place.is_cpu_place():
        return value.numpy()
    return _UNKNOWN


# --- FastDeploy 2.5's token-count event (feature ``step_syncs``) ---------------------------------


class DeferredEvent:
    """FastDeploy's ``token_num_event`` made inside the plugin's ``_prepare_inputs`` scope. While
    the plugin has it open (inside the ``_prepare_inputs`` and ``_postprocess`` calls it wraps),
    ``synchronize()`` only marks the wait as owed: the owed wait runs at the first read of a buffer
    it covers that the plugin does not answer itself (``settle()``, from that read's handler), and
    not at all when nothing reads. Closed, it is FastDeploy's event. (In this module so that a wait
    it runs is counted at FastDeploy's line, as the other links here.)"""

    def __init__(self, event) -> None:
        # open; no wait owed; whether the host waited on it (FastDeploy's own wait ran)
        self.event, self.active, self.owed, self.waited = event, True, False, False

    def synchronize(self):
        if not self.active:
            self.waited = True
            return self.event.synchronize()
        self.owed = True
        return None

    def settle(self) -> None:
        """Run the owed wait (a read the plugin does not answer needs the copies)."""
        if self.owed:
            self.owed, self.waited = False, True
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
    """``numpy()`` of a pinned buffer that the waits of ``events`` (``DeferredEvent``) cover:
    ``answer()`` (an exact host value, or None), else the owed waits first and Paddle's own read."""

    once = True

    def __init__(self, tensor, events: list, answer) -> None:
        super().__init__(tensor)
        self.events, self.answer = events, answer

    def numpy(self):
        value = self.answer()
        for event in self.events:
            if value is None:
                event.settle()
            else:
                event.answered()
        return NotImplemented if value is None else value


def _build_create_event(original, ctx):
    @wraps(original)
    def create_event(*args, **kwargs):
        event = original(*args, **kwargs)
        step = current()  # inside the plugin's FD 2.5 ``_prepare_inputs``: its ``make_event``
        make = step.make_event if step is not None else None
        return event if make is None else make(event)

    return create_event


#: FastDeploy 2.5's ``paddle.device.cuda.create_event`` (passes through outside a step with ``make_event``)
CREATE_EVENT = Patch(Target("paddle.device.cuda", "create_event", absolute=True), _build_create_event)
