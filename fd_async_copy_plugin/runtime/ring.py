"""PinnedRing: preallocated, reused pinned buffers that are never overwritten while referenced.

A slot is a set of named pinned buffers (e.g. ``logprob_token_ids``, ``logprobs``,
``selected_token_ranks``). A producer ``acquire``s a slot, issues ``copy_d2h`` into its buffers and
hands the buffers to consumers (inside a ``LogprobsTensors``). Consumers are FastDeploy code we do
not control - the save path, the ZMQ output thread's payload builder, a deferred save one step
later in overlap mode - so "is anyone still using this slot?" is answered by the only thing all of
them share: Python references. A slot is free when no object outside the ring references any of
its buffers (CPython reference counts are exact and immediate).

If no slot is free the ring grows by one slot - a counted pinned allocation, logged - instead of
overwriting data that someone may still read. Capacity grows (never shrinks) when a step needs more
elements than a slot has. On the simulator backend a slot chosen while still referenced raises
``BufferInUseError`` naming the referrers: that is how a too-early reuse is caught in tests.
"""

from __future__ import annotations

import gc
import logging
import sys
from dataclasses import dataclass, field
from math import prod

from .backend import BufferInUseError, CopyBackend

log = logging.getLogger("fd_async_copy")


def _refcount(buf) -> int:
    # Always measured through this one function so the frame-local references are constant.
    return sys.getrefcount(buf)


@dataclass
class PinnedSlot:
    index: int
    buffers: dict[str, object]  # name -> pinned buffer (a host tensor of the backend's glue)
    capacity: dict[str, int]
    baseline: dict[str, int] = field(default_factory=dict)
    generation: int = 0


class PinnedRing:
    """N slots of pinned buffers, each buffer a flat allocation of ``capacity`` elements."""

    def __init__(
        self,
        backend: CopyBackend,
        name: str,
        dtypes: dict[str, str],
        capacity: dict[str, int],
        slots: int = 2,
    ) -> None:
        if slots < 1:
            raise ValueError("a PinnedRing needs at least one slot")
        self.backend = backend
        self.name = name
        self.dtypes = dict(dtypes)
        self.slots: list[PinnedSlot] = []
        self.grow_events = 0  # slots added after construction (stays 0 after warm-up when healthy)
        self._next = 0
        for _ in range(slots):
            self._add_slot(capacity)

    # -- slots ---------------------------------------------------------------------------------
    def _new_buffer(self, slot: PinnedSlot, name: str, elements: int) -> None:
        slot.buffers[name] = self.backend.new_pinned([elements], self.dtypes[name], f"{self.name}[{slot.index}].{name}")
        slot.capacity[name] = elements
        slot.baseline[name] = _refcount(slot.buffers[name])

    def _add_slot(self, capacity: dict[str, int]) -> PinnedSlot:
        slot = PinnedSlot(len(self.slots), {}, {})
        for name in self.dtypes:
            self._new_buffer(slot, name, max(1, int(capacity[name])))
        self.slots.append(slot)
        return slot

    def external_refs(self, slot: PinnedSlot) -> dict[str, int]:
        """References to the slot's buffers held outside the ring (and outside the backend)."""
        refs = {}
        for name in slot.buffers:
            extra = _refcount(slot.buffers[name]) - slot.baseline[name] - self.backend.internal_refs(slot.buffers[name])
            if extra > 0:
                refs[name] = extra
        return refs

    def is_free(self, slot: PinnedSlot) -> bool:
        return not self.external_refs(slot)

    def _select(self) -> PinnedSlot | None:
        """The reuse policy: the next free slot in ring order, or None."""
        for offset in range(len(self.slots)):
            candidate = self.slots[(self._next + offset) % len(self.slots)]
            if self.is_free(candidate):
                return candidate
        return None

    def _verify_unreferenced(self, slot: PinnedSlot, writer: str) -> bool:
        refs = self.external_refs(slot)
        if not refs:
            return True
        if self.backend.name == "sim":
            referrers = sorted(
                {
                    type(r).__name__
                    for name in refs
                    for r in gc.get_referrers(slot.buffers[name])
                    if r is not slot.buffers
                }
            )
            raise BufferInUseError(
                f"{writer!r} is about to overwrite slot {slot.index} of pinned ring {self.name!r} whose "
                f"previous contents are still referenced ({refs}; referrers: {referrers}): the slot was "
                "reused too early"
            )
        log.error("fd_async_copy: ring %s chose a referenced slot; adding a slot instead", self.name)
        return False

    def acquire(self, writer: str, shapes: dict[str, list[int]], reserve: dict[str, int] | None = None) -> PinnedSlot:
        """A slot that nobody references, with buffers large enough for tensors of ``shapes``.

        When a buffer must grow, it grows to ``reserve[field]`` elements if that is larger (e.g. a
        wider logprob row sized for every sequence, not just this step's), so it grows once.
        """
        need = {f: (prod(shape) if shape else 1) for f, shape in shapes.items()}
        reserve = reserve or {}
        slot = self._select()
        if slot is not None and not self._verify_unreferenced(slot, writer):
            slot = None
        if slot is None:
            self.grow_events += 1
            log.warning(
                "fd_async_copy: every slot of pinned ring %s is still in use; adding slot %d (a pinned "
                "allocation; expected only during warm-up)",
                self.name,
                len(self.slots),
            )
            slot = self._add_slot(need)
        for name, elements in need.items():
            if elements > slot.capacity[name]:
                # Grow once, to at least what this step needs; never shrink inside the loop.
                elements = max(elements, int(reserve.get(name, 0)))
                old = slot.buffers.pop(name)
                self._new_buffer(slot, name, elements)
                self.backend.free_pinned(old, f"{self.name}[{slot.index}].{name}")
                del old
                log.info("fd_async_copy: pinned ring %s slot %d: %s grew to %d elements", self.name, slot.index, name, elements)
        self._next = (slot.index + 1) % len(self.slots)
        slot.generation += 1
        return slot

    @property
    def size(self) -> int:
        return len(self.slots)
