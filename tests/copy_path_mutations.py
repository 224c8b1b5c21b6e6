"""Mutations of the production copy path (issue 36), each undoing one guarantee; applied with a
pytest ``monkeypatch``. ``tests/runtime/test_copy_path_mutations.py`` applies each and asserts that
the CPU test named for it in ``docs/verification.md`` then fails on the fake runtime (``sim``)."""

from __future__ import annotations

from fd_async_copy_plugin.runtime import PinnedRing
from fd_async_copy_plugin.runtime.backend import CopyBackend, PinnedMemory
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend
from fd_async_copy_plugin.runtime.cudart import CopySet


def record_event_before_copies(monkeypatch) -> None:
    """The C call records the set's event first, then issues the copies: the event covers none."""
    set_issue = CopySet.issue

    def set_early(self, src, nbytes, stream, event):
        if event is not None:
            set_issue(CopySet(self._batch, [], []), [], [], stream, event)
        set_issue(self, src, nbytes, stream, None)

    monkeypatch.setattr(CopySet, "issue", set_early)


def skip_reference_check(monkeypatch) -> None:
    """The ring takes the next slot without looking at who references its buffers."""
    monkeypatch.setattr(PinnedRing, "is_free", lambda self, slot: True)
    monkeypatch.setattr(PinnedRing, "_free_next", lambda self: self.slots[self._next])


def reuse_referenced_slot(monkeypatch) -> None:
    """The reuse policy picks the next slot in ring order even while it is referenced (its
    choice is still verified: ``_verify_unreferenced``)."""
    monkeypatch.setattr(PinnedRing, "_select", lambda self: self.slots[self._next])
    monkeypatch.setattr(PinnedRing, "_free_next", lambda self: None)


def read_before_wait(monkeypatch) -> None:
    """The consumer reads the pinned buffer without waiting on its copy set's event."""
    monkeypatch.setattr(CopyBackend, "_host_array", lambda self, t, reader, start, end, facts: self.read(
        t, reader, start, end))


def free_with_copy_in_flight(monkeypatch) -> None:
    """A pinned allocation is freed without waiting for the copy still writing it."""

    def release(self):
        if not self.released:
            self.released = True
            self.rt.host_free(self.ptr)

    monkeypatch.setattr(PinnedMemory, "release", release)


def drop_cross_stream_ordering(monkeypatch) -> None:
    """A copy into memory a copy on another stream may still write is issued without a wait."""
    monkeypatch.setattr(RuntimeBackend, "_order_after", lambda self, earlier, name: None)


MUTATIONS = {
    "record the event before the copies": record_event_before_copies,
    "skip the reference check": skip_reference_check,
    "reuse a referenced slot": reuse_referenced_slot,
    "read before the wait": read_before_wait,
    "free with a copy in flight": free_with_copy_in_flight,
    "drop the cross-stream ordering": drop_cross_stream_ordering,
}
