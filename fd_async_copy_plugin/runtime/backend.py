"""The copy backend: the one place where host<->device copies, events and waits happen.

One implementation (``RuntimeBackend``, runtime/cuda.py) on three runtimes (see
docs/architecture.md): ``cuda`` (the process's libcudart), ``host`` (``HostRuntime``: synchronous
host copies; CPU Paddle) and ``sim`` (the same code over a race-detecting fake libcudart,
``runtime/simulated.py``). The patches and the reference replica of FastDeploy are written
against this contract only, so the same code runs on all three.

A copy set (a ring slot's buffers, a decode step's outputs) is issued at once with its own event;
each destination keeps that event and a reader waits on it. There is no sequence number and no
search: an event links the not-yet-waited events before it on its streams, so a wait on a later
event makes the earlier ones free.

Thread safety: FastDeploy runs an output thread beside the model loop, so copies and records hold
the backend's (re-entrant) lock; host waits do not hold it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import logging
import threading
import weakref
from collections import deque
from math import prod
from typing import Iterable

import numpy as np

from . import census
from .glue import paddle_glue

log = logging.getLogger("fd_async_copy")


class AsyncCopyError(RuntimeError):
    """An ordering bug in asynchronous copies (raised by the simulator)."""


class PendingCopyError(AsyncCopyError):
    """A host read of a buffer whose copy has not landed yet."""


class BufferInUseError(AsyncCopyError):
    """A copy into a buffer whose previous contents a consumer still holds."""


class WaitTimeout(AsyncCopyError):
    """A host wait outlived ``CopyBackend.wait_timeout`` (bounded in test runs: a hang fails fast)."""


@contextlib.contextmanager
def _bounded(lock, timeout: float, what: str):
    """``lock`` taken by a wait, given up after ``timeout`` seconds with ``WaitTimeout``."""
    if not lock.acquire(timeout=timeout):
        raise WaitTimeout(f"{what}: the copy backend's lock was not free within {timeout:g} s (a hang)")
    try:
        yield
    finally:
        lock.release()


#: Keepers of pinned memory whose tensor is gone, appended by the free path (see ``PinnedMemory``).
_freed: deque = deque()
#: id(keeper weakref) -> (that weakref, its PinnedMemory), for every allocation not yet released.
_live: dict[int, tuple[weakref.ref, "PinnedMemory"]] = {}
_live_lock = threading.Lock()
_atexit_registered = False


def release_freed() -> int:
    """Release the memory of every pinned buffer whose tensor is gone; returns how many.

    Plugin code at safe points calls it (the next allocation or free of a pinned buffer, ring
    growth and release, ``CopyBackend.release_freed()`` from ``disable()``, interpreter exit) -
    never Paddle's free routine (see ``PinnedMemory``)."""
    released = 0
    while True:
        try:
            keeper = _freed.popleft()
        except IndexError:
            return released
        with _live_lock:
            entry = _live.pop(id(keeper), None)
        if entry is None:
            continue
        try:
            entry[1].release()
        except Exception as exc:  # never in a decode step's way; the memory stays allocated
            log.warning("fd_async_copy: releasing pinned memory %#x failed: %s", entry[1].ptr, exc)
        released += 1


def pending_release() -> int:
    """Pinned allocations whose tensor is gone and whose memory ``release_freed`` has not freed yet."""
    return len(_freed)


def _track(keeper, memory: "PinnedMemory") -> None:
    global _atexit_registered
    # The callback is a C method: when ``keeper`` dies, CPython calls ``deque.append`` directly -
    # no Python frame runs, so nothing there can drop the GIL.
    ref = weakref.ref(keeper, _freed.append)
    with _live_lock:
        _live[id(ref)] = (ref, memory)
        if not _atexit_registered:
            atexit.register(release_freed)
            _atexit_registered = True


class PinnedMemory:
    """One host allocation behind a pinned buffer (``cudaHostAlloc``, or host memory on ``host``),
    referenced by the buffer's tensor through tensor -> DLPack -> numpy array -> a ctypes view of the
    memory (the *keeper*). Released only after every copy into or out of it: the buffer's facts
    (``facts``: the copy set that last wrote it, the last H2D copy reading it) name those copies'
    events and, unless a wait covered them, they are waited on before the memory is freed (CUDA may
    otherwise hand it out while the DMA still runs).

    Not released where the tensor dies: that is inside Paddle's free routine, under a Paddle lock,
    and Python code there (a ``__del__``, a ``weakref.finalize``) may drop the GIL - a ctypes
    ``cudaFreeHost`` always does - letting another thread take the GIL and wait on that lock: a
    process-wide deadlock (issue 25). The keeper's death only appends it to a queue (a C call, see
    ``_track``); ``release_freed`` does the rest from plugin code.
    """

    def __init__(self, rt, ptr: int, nbytes: int) -> None:
        self.rt, self.ptr, self.nbytes = rt, ptr, nbytes
        self.facts: _Pinned | None = None  # (set by the allocation)
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        facts = self.facts  # the events of the last copies into and out of this memory
        for event in () if facts is None else (facts.set and facts.set.event, facts.h2d_event):
            if event is not None and not event.done:
                for handle in event.native:  # (an event needs no current device to be waited on)
                    self.rt.event_synchronize(handle)  # GIL released: other threads keep running
        self.rt.host_free(self.ptr)


class _Pinned:
    """What a pinned buffer's allocation fixed: the tensor and its PinnedMemory (weakly; checked by
    identity), the address, the dtype name, a flat view of the whole allocation that does not keep
    it alive (used only while the tensor lives, so while the memory does); the shape the backend
    last gave the tensor (checked against the capacity once, when it changed), its bytes, and
    ``view``, the allocation's view in that shape once a read made it (``shaped``; used by ``read``
    only while the tensor has it). And the buffer's copies: ``set``, the copy set that last wrote it
    (``CopySetState``: readers wait on its event), ``index`` its place there, ``h2d_event`` and
    ``h2d_stream``, the last H2D copy reading it (the host waits on it before writing the buffer),
    and ``copyset``, the copy set it comes first in, described once. ``private``: no framework op gets
    the tensor (only the backend moves or reshapes it): copies and reads do not ask for its address."""

    __slots__ = ("buf", "memory", "ptr", "dtype", "flat", "shape", "nbytes", "view", "set", "index", "h2d_event",
                 "h2d_stream", "copyset", "private")

    def __init__(self, buf, memory, ptr: int, dtype: str, flat: np.ndarray, shape: tuple, private: bool) -> None:
        self.buf, self.memory, self.ptr, self.dtype, self.flat, self.private = buf, memory, ptr, dtype, flat, private
        self.set = self.index = self.h2d_event = self.h2d_stream = self.copyset = None
        self.reshape(shape)

    def reshape(self, shape: tuple) -> None:
        self.shape, self.nbytes, self.view = shape, prod(shape) * self.flat.itemsize, None  # (view: a read's)

    def shaped(self) -> np.ndarray:
        """The allocation's view in the last shape given (made once per shape, when first read)."""
        view = self.view
        if view is None:
            view = self.view = self.flat[:self.nbytes // self.flat.itemsize].reshape(self.shape)
        return view


class CopySetState:
    """A copy set - a ring slot's buffers, a decode step's outputs - described once: its
    destinations' facts (``facts``), the C call's descriptor of them (``c``: ``cudart.CopySet``, None
    where copies go one runtime call each), ``sizes_at``, the backend's reshape count when ``c``'s
    sizes were written; and its last issue: its own ``event``, the copies' ``names``, its
    ``stream``. Each destination it wrote names it (``_Pinned.set``): a reader finds its event there.
    ``whole``: every destination still names it and no H2D copy read one since (cleared by the copy
    that changed that): its next issue on the same stream needs no ordering check."""

    __slots__ = ("facts", "c", "sizes_at", "event", "names", "stream", "whole")

    def __init__(self, facts: list, c=None) -> None:
        self.facts, self.c, self.sizes_at, self.whole = facts, c, -1, False
        self.event = self.names = self.stream = None


_reshape_count = itertools.count(1)

#: An event links at most this many not-yet-waited events recorded before it on its streams (a wait
#: marks them done too); beyond that the link is dropped - a later wait on one of those is then a
#: runtime call that returns at once, never a missed wait - so nothing grows while nobody waits.
_CHAIN = 64


class CopyEvent:
    """A copy set's own event (or ``record``'s): the runtime's event handles (``native``, one per
    stream it covers), ``done`` once a host wait (or a query, or a synchronize) saw it complete, and
    ``prev``, the events recorded before it on its streams that were not done then: in stream
    order they complete first, so when this one is seen complete they are marked done too."""

    __slots__ = ("label", "native", "done", "prev", "depth")

    def __init__(self, label: str, native=(), prev=()) -> None:
        self.label, self.native, self.done = label, native, False
        kept, depth = (), 1
        for e in prev:
            if e is not None and not e.done:
                kept += (e,)
                if e.depth >= depth:
                    depth = e.depth + 1
        self.prev, self.depth = (kept, depth) if depth <= _CHAIN else ((), 1)

    def __repr__(self) -> str:
        return f"CopyEvent({self.label!r}, done={self.done})"


def _mark_done(event: CopyEvent) -> None:
    """``event`` and every event linked before it completed (backend lock held)."""
    stack = [event]
    while stack:
        e = stack.pop()
        if not e.done:
            e.done = True
            stack.extend(e.prev)
            e.prev = ()


class CopyBackend:
    """The bookkeeping of the copy backend: pinned buffers, their events, waits and host reads.
    ``RuntimeBackend`` (runtime/cuda.py), its one implementation, issues the copies
    (``copy_d2h_many``, ``fill``, ``_copy_h2d``) and records the events (``_record_native``) on a
    runtime."""

    name = "abstract"
    #: Seconds one host wait (on an event, or for the backend lock a wait or drain takes) may last
    #: before it raises ``WaitTimeout``; None: unbounded (in production a wait lasts as long as the
    #: GPU work it covers). Test runs bound it (``fd_async_copy_plugin.testing.watchdog``).
    wait_timeout: float | None = None

    def __init__(self, glue, rt) -> None:
        self.glue = glue or paddle_glue()  # tensor accessors (runtime/glue.py): the framework-specific part
        self.rt = rt  # the CUDA layer (runtime/cudart.py), or its host-memory stand-in
        self._lock = threading.RLock()
        # Keyed by id() but checked by identity through weak references: an id can be reused by an
        # unrelated tensor once a buffer is gone, and must never make that tensor look pinned.
        # (Paddle tensors cannot be dict keys themselves: their == is elementwise.)
        self._pinned: dict[int, _Pinned] = {}  # id(buf) -> its allocation's facts, until free_pinned
        self._last: dict[int, CopyEvent] = {}  # stream -> the newest event covering it
        # The runtime's check of a host read (the simulator's fake runtime has one)
        self._check_read = getattr(rt, "check_read", None)
        self._reshapes = 0  # a count of ``_fit``'s reshapes: a copy set rewrites its sizes when it moved

    # -- allocation ---------------------------------------------------------------------------
    def new_pinned(self, shape: Iterable[int], dtype: str, label: str, private: bool = False):
        """A host buffer of ``shape``, allocated once through the runtime (``cudaHostAlloc`` on
        ``cuda``) and wrapped zero-copy as a host tensor of the glue's framework (``private``: ``_Pinned``)."""
        census.record("pinned_alloc", label)
        release_freed()
        return self._alloc([int(s) for s in shape], dtype, private)

    def free_pinned(self, t, label: str) -> None:
        """Forget ``t``. Its memory is released when the last reference to the tensor goes, after
        every copy into it (``PinnedMemory.release``), never while a consumer can still read it."""
        census.record("pinned_free", label)
        self._pinned.pop(id(t), None)
        release_freed()  # what went earlier (``t`` itself is still referenced here)

    def release_freed(self) -> int:
        """Release the memory of pinned buffers whose tensors are gone (``disable()``, tests); the
        backend stays usable. Returns how many allocations were released."""
        return release_freed()

    def _alloc(self, shape: list[int], dtype: str, private: bool = False):
        np_dtype, count = np_dtype_of(dtype), prod(shape)
        nbytes = count * np_dtype.itemsize
        memory = PinnedMemory(self.rt, self.rt.host_alloc(nbytes), nbytes)
        if (kind := getattr(self.rt, "set_kind", None)) is not None:  # (the simulator: what its poison looks like)
            kind(memory.ptr, np_dtype.itemsize, np_dtype.kind)
        raw = (ctypes.c_byte * max(1, nbytes)).from_address(memory.ptr)
        _track(raw, memory)  # the numpy array below keeps ``raw`` alive as long as the tensor lives
        array = np.frombuffer(raw, dtype=np_dtype, count=count).reshape(shape)
        t = self.glue.wrap(array)
        del raw, array
        if self.glue.address(t) != memory.ptr:
            raise AsyncCopyError(f"wrapping pinned memory {memory.ptr:#x} gave a tensor at "
                                 f"{self.glue.address(t):#x}: the host wrap is not zero-copy")
        flat = np.frombuffer((ctypes.c_byte * max(1, nbytes)).from_address(memory.ptr), dtype=np_dtype, count=count)
        facts = memory.facts = _Pinned(weakref.ref(t), weakref.ref(memory), memory.ptr, self.glue.dtype(t), flat,
                                       tuple(shape), private)
        self._pinned[id(t)] = facts
        return t

    def _facts(self, buf) -> _Pinned | None:
        facts = self._pinned.get(id(buf))
        return facts if facts is not None and facts.buf() is buf else None

    def memory_of(self, buf) -> PinnedMemory | None:
        facts = self._facts(buf)
        return facts.memory() if facts is not None else None

    def _fit(self, dst, shape: tuple, dtype: str, grow: bool = True) -> _Pinned | None:
        """Give ``dst`` the source's ``shape`` (Paddle ``copy_`` semantics) inside its allocation,
        after checking the ``dtype`` and - when the shape is not the one last given - the capacity;
        returns the buffer's facts (``memory``: its allocation, ``nbytes``: the bytes to copy).
        ``grow=False``: None, nothing changed, where ``dst`` is not a pinned buffer of this backend
        or too small (the ring then chooses and grows a slot)."""
        facts = self._pinned.get(id(dst))
        if facts is None or facts.buf() is not dst:
            if not grow:
                return None
            raise ValueError("copy_d2h: the destination is not a pinned buffer of this backend (new_pinned)")
        glue = self.glue
        if facts.memory() is None or not facts.private and glue.address(dst) != facts.ptr:
            raise AsyncCopyError("copy_d2h: the pinned buffer no longer points at its memory (a framework op "
                                 "such as a copy_ of a larger tensor reallocated it); write pinned buffers only "
                                 "through the backend")
        if dtype != facts.dtype:
            raise ValueError(f"copy_d2h: source dtype {dtype} differs from the pinned buffer's {facts.dtype}")
        if shape != facts.shape:
            nbytes = prod(shape) * facts.flat.itemsize
            if nbytes > facts.memory().nbytes:
                if not grow:
                    return None
                raise ValueError(f"copy_d2h: {nbytes} bytes ({list(shape)} {dtype}) do not fit the pinned "
                                 f"buffer's {facts.memory().nbytes}; allocate it larger (a pinned buffer never "
                                 "grows in place)")
            facts.reshape(shape)
            self._reshapes = next(_reshape_count)  # (after the reshape: the copy sets' sizes are stale)
        glue.set_shape(dst, shape)  # (a no-op when the tensor has it: also after a foreign reshape)
        return facts

    def is_pinned(self, t) -> bool:
        return self._facts(t) is not None

    def reused_while_referenced(self, message: str, buffers: dict) -> None:
        """A ring chose a slot whose ``buffers`` are still referenced (a reuse-policy bug; the ring
        adds a slot instead). The simulator raises ``BufferInUseError`` here."""

    # -- copies and events --------------------------------------------------------------------
    def copy_d2h(self, dst, src, label: str) -> CopyEvent:
        """Issue a non-blocking D2H copy of ``src`` into the pinned buffer ``dst``: a copy set of one."""
        return self.copy_d2h_many(((dst, src, label),), label)

    def copy_h2d(self, dst_ptr: int, device: int | None, src, offset: int, nbytes: int, label: str) -> CopyEvent:
        """Issue a non-blocking H2D copy of ``nbytes`` at byte ``offset`` of the pinned buffer ``src``
        to the device address ``dst_ptr`` (on ``device``'s current stream; ``None``: host memory, the
        ``host``/``sim`` "device"), with its own event. The host must not write those bytes of ``src``
        again before that event completed: ``before_host_write`` enforces it."""
        facts = self._facts(src)
        memory = None if facts is None else facts.memory()
        if memory is None:
            raise ValueError("copy_h2d: the source is not a pinned buffer of this backend (new_pinned)")
        if offset < 0 or nbytes < 0 or offset + nbytes > memory.nbytes:
            raise ValueError(f"copy_h2d: bytes [{offset}, {offset + nbytes}) outside the buffer's {memory.nbytes}")
        census.record("async_h2d", label)
        with self._lock:
            if facts.set is not None:
                facts.set.whole = False  # (its next issue checks this buffer's order)
            facts.h2d_event = self._copy_h2d(dst_ptr, device, facts, memory, offset, nbytes, label)
            return facts.h2d_event

    def before_host_write(self, buf, writer: str) -> None:
        """The host is about to write the pinned buffer ``buf``: every H2D copy reading it must have
        completed. Waits for that copy's event (free when already waited on); the simulator raises
        ``BufferInUseError`` instead when none was waited on."""
        facts = self._facts(buf)
        if (event := None if facts is None else facts.h2d_event) is not None and not event.done:
            self._h2d_still_read(buf, writer, event)

    def h2d_in_flight(self, buf) -> bool:
        """An H2D copy reading the pinned ``buf`` may still run (no wait covering it returned)."""
        facts = self._facts(buf)
        return facts is not None and facts.h2d_event is not None and not facts.h2d_event.done

    def _h2d_still_read(self, buf, writer: str, event: CopyEvent) -> None:
        self.wait(event, writer)

    def blocking_d2h(self, src, label: str):
        """FastDeploy 2.4's ``.cpu()``: a copy the host waits for."""
        census.record("blocking_d2h", label)
        return self.glue.blocking_d2h(src)

    def record(self, label: str) -> CopyEvent:
        """An event covering every copy issued so far, on every stream copied on."""
        with self._lock:
            return self._record_native(label)

    def event_of(self, buf) -> CopyEvent | None:
        """The event of the copy set that last wrote ``buf`` (None: never written by a copy)."""
        facts = self._facts(buf)
        return None if facts is None or facts.set is None else facts.set.event

    def copy_in_flight(self, buf) -> bool:
        """A copy into ``buf`` may still be landing (no wait covering it has returned)."""
        return not self.copy_waited(buf)

    def copy_waited(self, buf) -> bool:
        """Every copy into ``buf`` is covered by an event the host already waited on (backend-neutral:
        on ``host`` copies land at once, but the wait that would make them visible on a GPU counts)."""
        event = self.event_of(buf)
        return event is None or event.done

    def query(self, event: CopyEvent) -> bool:
        """Whether ``event``'s copies have landed, without waiting (a wait on it or a later event
        returned, or the runtime says so)."""
        if event.done:
            return True
        if all(map(self.rt.event_query, event.native)):
            with self._lock:
                _mark_done(event)
            return True
        return False

    def wait(self, event: CopyEvent, reason: str) -> None:
        """Host waits for ``event`` only. Free when it, or a later event, was already waited on."""
        if event.done:
            return
        if census._ACTIVE is not None:  # (the site's name built only when counted)
            census.record("event_wait", f"{reason}<-{event.label}")
        for handle in event.native:
            self.rt.event_synchronize(handle)  # GIL released: other threads keep launching
        with self._lock if self.wait_timeout is None else self._wait_lock("wait(%s<-%s)", reason, event.label):
            _mark_done(event)

    def _wait_lock(self, what: str, *args):
        """The backend lock, for a wait: bounded by ``wait_timeout`` when it is set (``what % args``
        names the wait in the timeout's message; with ``args``, built only then)."""
        timeout = self.wait_timeout
        return self._lock if timeout is None else _bounded(self._lock, timeout, what % args if args else what)

    def device_synchronize(self, reason: str) -> None:
        census.record("device_sync", reason)
        self._drain(device=True)

    def stream_synchronize(self, reason: str) -> None:
        census.record("stream_sync", reason)
        self._drain()

    def _drain(self, device: bool = False) -> None:
        with self._wait_lock("synchronize"):
            last = dict(self._last)
        if device:
            self.rt.device_synchronize()
        else:
            for stream in last:
                self.rt.stream_synchronize(stream)
        with self._wait_lock("synchronize"):
            for event in last.values():
                _mark_done(event)

    # -- host reads ----------------------------------------------------------------------------
    def read(self, buf, reader: str, start: int | None = None, end: int | None = None) -> np.ndarray:
        """Host read of rows ``[start:end]`` of a pinned buffer, as an owned numpy array: the one
        accessor through which Python reads pinned memory (the simulator's runtime checks it).

        Reads host memory through the buffer's pointer: no Paddle op touches the pinned tensor
        (Paddle would move it to the GPU), and only the rows asked for are copied.
        """
        if census._ACTIVE is not None:
            census.record("host_read", reader)
        facts, glue = self._pinned.get(id(buf)), self.glue  # (``_facts``, inline)
        if facts is not None and facts.buf() is buf and (facts.private or glue.address(buf) == facts.ptr
                                                         and glue.shape(buf) == facts.shape):
            view = facts.view if facts.view is not None else facts.shaped()  # the allocation's, in its shape
        else:
            view = host_view(buf, glue)
        rows = view if start is None and end is None else view[start:end]
        if self._check_read is not None:
            self._read_checked(buf, reader, rows)
        return rows.copy()

    def _read_checked(self, buf, reader: str, rows: np.ndarray) -> None:
        self._check_read(rows.ctypes.data, rows.nbytes)

    def to_host(self, t, reader: str, start: int | None = None, end: int | None = None):
        """``t`` as a tensor the host may read now, without running a Paddle op on pinned memory.

        For a pinned buffer of this backend: ``host_array``'s rows as an owned pageable CPU tensor.
        Anything else is returned unchanged (sliced if rows are asked for).
        """
        if (facts := self._facts(t)) is None:
            return t if start is None and end is None else t[start:end]
        return self.glue.from_numpy(self._host_array(t, reader, start, end, facts))

    def host_array(self, t, reader: str, start: int | None = None, end: int | None = None) -> np.ndarray:
        """Rows ``[start:end]`` of the pinned buffer ``t`` as an owned numpy array, after its copy.

        Waits for the event of the copy set that last wrote ``t``, then ``read``s. For a consumer that
        wants numbers rather than a tensor (a flag, a shadow's arrays): no framework tensor is made
        (on Paddle that costs more than the read itself, and ``.numpy()`` of it copies again)."""
        if (facts := self._facts(t)) is None:
            raise ValueError(f"host_array({reader}): not a pinned buffer of this backend (new_pinned)")
        return self._host_array(t, reader, start, end, facts)

    def _host_array(self, t, reader: str, start: int | None, end: int | None, facts: _Pinned) -> np.ndarray:
        written = facts.set
        if (event := None if written is None else written.event) is not None and not event.done:
            self.wait(event, reader)
        return self.read(t, reader, start, end)


_NP_DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64")


def np_dtype_of(name: str) -> np.dtype:
    if name not in _NP_DTYPES:
        raise ValueError(f"dtype {name!r} is not supported for pinned buffers; expected one of "
                         f"{sorted(_NP_DTYPES)}")
    return np.dtype(name)


def host_view(t, glue=None) -> np.ndarray:
    """A zero-copy numpy view of a host (CPU or pinned) tensor's memory, through its pointer."""
    glue = glue or paddle_glue()
    dtype, shape = np_dtype_of(glue.dtype(t)), list(glue.shape(t))
    count = prod(shape)
    if count == 0:
        return np.empty(shape, dtype=dtype)
    raw = (ctypes.c_byte * (count * dtype.itemsize)).from_address(glue.address(t))
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
