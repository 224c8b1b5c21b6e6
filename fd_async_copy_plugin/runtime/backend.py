"""The copy backend: the one place where host<->device copies, events and waits happen.

Three implementations share this contract (see docs/architecture.md):
``cuda`` (real pinned memory and CUDA events), ``host`` (synchronous host copies; CPU Paddle,
tests, selftest) and ``sim`` (a race-detecting simulator of asynchronous copies). The patches
and the reference replica of FastDeploy are written against this contract only, so the same
code runs on all three.

Thread safety: FastDeploy runs an output thread beside the model loop, so copies, records and the
event lookup hold the backend's lock (a copy is issued under it, so sequence order is stream order);
host waits do not hold it.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections import deque
from typing import Iterable

import numpy as np
import paddle

from . import census


class AsyncCopyError(RuntimeError):
    """An ordering bug in asynchronous copies (raised by the simulator)."""


class PendingCopyError(AsyncCopyError):
    """A host read of a buffer whose copy has not landed yet."""


class BufferInUseError(AsyncCopyError):
    """A copy into a buffer whose previous contents a consumer still holds."""


class CopyEvent:
    """A point in the copy stream. ``seq`` orders events of one backend."""

    __slots__ = ("seq", "label", "native")

    def __init__(self, seq: int, label: str, native=None) -> None:
        self.seq = seq
        self.label = label
        self.native = native

    def __repr__(self) -> str:
        return f"CopyEvent(seq={self.seq}, label={self.label!r})"


class CopyBackend:
    """Base class: bookkeeping shared by every backend.

    Subclasses implement ``_alloc``, ``_copy``, ``_record_native`` and ``_wait_native``.
    """

    name = "abstract"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0  # sequence number of the last copy issued
        self._completed = 0  # every copy with seq <= _completed has landed, from the host's view
        # Keyed by id() but checked by identity through weak references: an id can be reused by an
        # unrelated tensor once a buffer is gone, and must never make that tensor look pinned.
        # (Paddle tensors cannot be dict keys themselves: their == is elementwise.)
        self._pinned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._copy_seq: dict[int, tuple[int, str, weakref.ref]] = {}  # id(dst) -> last copy
        self._recent_events: deque[CopyEvent] = deque(maxlen=64)

    # -- allocation ---------------------------------------------------------------------------
    def new_pinned(self, shape: Iterable[int], dtype: str, label: str) -> paddle.Tensor:
        census.record("pinned_alloc", label)
        t = self._alloc([int(s) for s in shape], dtype)
        self._pinned[id(t)] = t
        return t

    def free_pinned(self, t: paddle.Tensor, label: str) -> None:
        census.record("pinned_free", label)
        self._pinned.pop(id(t), None)
        self._copy_seq.pop(id(t), None)

    def is_pinned(self, t) -> bool:
        return t is not None and self._pinned.get(id(t)) is t

    def internal_refs(self, buf) -> int:
        """References to ``buf`` the backend itself holds (so the ring can tell consumers' apart)."""
        return 0

    # -- copies and events --------------------------------------------------------------------
    def copy_d2h(self, dst: paddle.Tensor, src: paddle.Tensor, label: str) -> None:
        """Issue a non-blocking D2H copy of ``src`` into the pinned buffer ``dst``."""
        census.record("async_d2h", label)
        with self._lock:  # issued under the lock: sequence order is stream order, for every thread
            self._seq += 1
            seq = self._seq
            self._copy_seq[id(dst)] = (seq, label, weakref.ref(dst))
            self._copy(dst, src, seq, label)

    def blocking_d2h(self, src: paddle.Tensor, label: str) -> paddle.Tensor:
        """FastDeploy 2.4's ``.cpu()``: a copy the host waits for."""
        census.record("blocking_d2h", label)
        return src.cpu()

    def record(self, label: str) -> CopyEvent:
        with self._lock:  # recorded and listed atomically: covering_event sees events in seq order
            seq = self._seq
            event = CopyEvent(seq, label, self._record_native(seq, label))
            self._recent_events.append(event)
        return event

    def _last_copy(self, buf) -> tuple[int, str, weakref.ref] | None:
        entry = self._copy_seq.get(id(buf))
        return entry if entry is not None and entry[2]() is buf else None

    def copy_in_flight(self, buf) -> bool:
        """A copy into ``buf`` may still be landing (no wait covering it has returned)."""
        last = self._last_copy(buf)
        return last is not None and last[0] > self._completed

    def covering_event(self, buf: paddle.Tensor) -> CopyEvent | None:
        """The earliest recorded event that covers the last copy into ``buf`` (None: no copy
        pending or nothing recorded after it)."""
        last = self._last_copy(buf)
        if last is None or last[0] <= self._completed:
            return None
        with self._lock:  # another thread may be recording (FastDeploy's output thread)
            events = list(self._recent_events)
        for event in events:
            if event.seq >= last[0]:
                return event
        return None

    def wait(self, event: CopyEvent, reason: str) -> None:
        """Host waits for ``event`` only. Free when a later event was already waited on."""
        if event.seq <= self._completed:
            return
        census.record("event_wait", f"{reason}<-{event.label}")
        self._wait_native(event)
        with self._lock:
            self._completed = max(self._completed, event.seq)

    def device_synchronize(self, reason: str) -> None:
        census.record("device_sync", reason)
        self._drain()

    def stream_synchronize(self, reason: str) -> None:
        census.record("stream_sync", reason)
        self._drain()

    def _drain(self) -> None:
        self._drain_native()
        with self._lock:
            self._completed = self._seq

    # -- host reads ----------------------------------------------------------------------------
    def read(self, buf: paddle.Tensor, reader: str, start: int | None = None, end: int | None = None) -> np.ndarray:
        """Host read of rows ``[start:end]`` of a pinned buffer, as an owned numpy array.

        Reads host memory through the buffer's pointer: no Paddle op touches the pinned tensor
        (Paddle would move it to the GPU), and only the rows asked for are copied.
        """
        census.record("host_read", reader)
        self._check_readable(buf, reader)
        return np.array(host_view(buf)[start:end], copy=True)

    def to_host(self, t, reader: str, start: int | None = None, end: int | None = None):
        """``t`` as a tensor the host may read now, without running a Paddle op on pinned memory.

        For a pinned buffer of this backend: wait for the event covering its last copy (recording
        one if none was - a missing record is a bug the simulator reports) and return an owned
        pageable CPU tensor of rows ``[start:end]``. Anything else is returned unchanged (sliced if
        rows are asked for).
        """
        if not self.is_pinned(t):
            return t if start is None and end is None else t[start:end]
        last = self._last_copy(t)
        if last is not None and last[0] > self._completed:
            event = self.covering_event(t)
            if event is None and self.copy_in_flight(t):
                event = self._missing_record(t, reader, last[1])
            if event is not None:  # None: another thread's wait covered the copy meanwhile
                self.wait(event, reader)
        return paddle.to_tensor(self.read(t, reader, start, end), place=paddle.CPUPlace())

    def _missing_record(self, t, reader: str, writer: str) -> CopyEvent:
        return self.record(f"implicit-for-{reader}")

    # -- subclass hooks ------------------------------------------------------------------------
    def _alloc(self, shape: list[int], dtype: str) -> paddle.Tensor:
        raise NotImplementedError

    def _copy(self, dst: paddle.Tensor, src: paddle.Tensor, seq: int, label: str) -> None:
        raise NotImplementedError

    def _record_native(self, seq: int, label: str):
        return None

    def _wait_native(self, event: CopyEvent) -> None:
        return None

    def _drain_native(self) -> None:
        return None

    def _check_readable(self, buf: paddle.Tensor, reader: str) -> None:
        return None


_NP_DTYPES = {
    "bool": np.bool_,
    "int8": np.int8,
    "uint8": np.uint8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}


def host_view(t: paddle.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a host (CPU or pinned) tensor's memory, through its pointer."""
    dtype = np.dtype(_NP_DTYPES[str(t.dtype).replace("paddle.", "")])
    shape = [int(s) for s in t.shape]
    count = int(np.prod(shape)) if shape else 1
    if count == 0:
        return np.empty(shape, dtype=dtype)
    raw = (ctypes.c_byte * (count * dtype.itemsize)).from_address(t.data_ptr())
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
