"""Backend ``sim``: a race-detecting simulator of asynchronous D2H copies.

On the CPU build of Paddle every copy is synchronous, so an ordering bug (reading a pinned buffer
before its event completed, overwriting a buffer a consumer still holds) can never show. This
backend makes such bugs deterministic and loud:

- ``copy_d2h`` does not copy. It snapshots the source (stream order: the copy sees the source as
  it is when issued) and fills the destination with poison: NaN for floats, -7777 for integers,
  the inverse of the real value for bools. The data lands only when an event that covers the copy
  is waited on, or the stream/device is synchronized.
- ``read`` of a buffer with a copy in flight raises ``PendingCopyError`` naming the buffer, the
  writer and the reader. Code that bypasses ``read`` (e.g. FastDeploy's own ``.numpy()``) sees the
  poison, which makes outputs differ from the unpatched run.
- A pinned ring that picks a slot whose previous contents are still referenced raises
  ``BufferInUseError`` naming the ring, the slot, the referrers and the writer (``ring.py``).
- Events are sequence numbers on one modelled stream: waiting on an event releases exactly the
  copies issued before it was recorded; a device or stream synchronize releases everything.
"""

from __future__ import annotations

import ctypes
import gc

import numpy as np

from .backend import AsyncCopyError, BufferInUseError, CopyBackend, CopyEvent, PendingCopyError, host_view

POISON_INT = -7777


def poison_like(values: np.ndarray) -> np.ndarray:
    if values.dtype == np.bool_:
        return np.logical_not(values)
    if np.issubdtype(values.dtype, np.floating):
        return np.full(values.shape, np.nan, dtype=values.dtype)
    return np.full(values.shape, POISON_INT, dtype=values.dtype)


class SimulatedBackend(CopyBackend):
    name = "sim"

    def __init__(self, glue=None) -> None:
        super().__init__(glue=glue)  # buffers: host memory wrapped exactly like pinned memory
        self._labels: dict[int, str] = {}
        # id(dst) -> (dst, data, seq, writer, the bytes it lands in: ``dst``'s view when issued)
        self._pending: dict[int, tuple[object, np.ndarray, int, str, np.ndarray]] = {}

    def new_pinned(self, shape, dtype, label):
        t = super().new_pinned(shape, dtype, label)
        self._labels[id(t)] = label
        return t

    def label_of(self, buf) -> str:
        return self._labels.get(id(buf), f"<unlabelled buffer {id(buf):#x}>")

    def reused_while_referenced(self, message, buffers):
        referrers = sorted({type(r).__name__ for b in buffers.values() for r in gc.get_referrers(b)
                            if r is not buffers})
        raise BufferInUseError(f"{message}; referrers: {referrers}: the slot was reused too early")

    def internal_refs(self, buf) -> int:
        return 1 if id(buf) in self._pending else 0

    def copy_in_flight(self, buf) -> bool:
        return id(buf) in self._pending

    def pending_writers(self) -> list[str]:
        return sorted(entry[3] for entry in self._pending.values())

    def _alloc(self, shape, dtype):
        t = super()._alloc(shape, dtype)
        view = host_view(t, self.glue)
        view[...] = poison_like(view)
        return t

    def _copy(self, dst, src, seq, label):
        data = self.glue.snapshot(src)
        self._fit(dst, self.glue.shape(src), self.glue.dtype(src))
        view = host_view(dst, self.glue)
        view[...] = poison_like(data)
        # The copy lands in the bytes it was issued for, as on a GPU: a later fill may give ``dst``
        # a new shape (``_fit``, outside the lock) before this copy landed.
        self._pending[id(dst)] = (dst, data, seq, label, view)

    def _copy_h2d(self, dst_ptr, device, memory, offset, nbytes, seq, label):
        # Stream order: every later device op sees the data, so it lands at once (the replica's
        # device ops run when called). What the simulator checks is the source: the host must not
        # write it again before a wait covers this copy (``before_host_write``).
        ctypes.memmove(dst_ptr, memory.ptr + offset, int(nbytes))

    def _h2d_still_read(self, buf, writer, copy_label, event):
        raise BufferInUseError(
            f"host write of pinned buffer {self.label_of(buf)!r} by {writer!r} while the copy "
            f"{copy_label!r} may still read it: wait on an event recorded after that copy first"
        )

    def _land(self, upto: int) -> None:
        with self._wait_lock("landing copies up to #%d", upto):  # never called with the lock held
            self._land_locked(upto)

    def _land_locked(self, upto: int) -> None:
        for key, (_, data, seq, _, view) in list(self._pending.items()):
            if seq <= upto:
                view[...] = data
                del self._pending[key]

    def _wait_native(self, event: CopyEvent) -> None:
        self._land(event.seq)

    def _drain_native(self, device: bool = False) -> None:
        self._land(self._seq)

    def _check_readable(self, buf, reader):
        pending = self._pending.get(id(buf))
        if pending is not None:
            raise PendingCopyError(
                f"host read of pinned buffer {self.label_of(buf)!r} by {reader!r} before the copy "
                f"{pending[3]!r} into it completed: wait on an event recorded after that copy first"
            )

    def _missing_record(self, t, reader, writer):
        raise AsyncCopyError(
            f"{reader!r} needs pinned buffer {self.label_of(t)!r}, but no event was recorded after "
            f"the copy {writer!r} into it: the producer must record an event after its copies"
        )
