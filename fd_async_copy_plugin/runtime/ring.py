"""PinnedRing: preallocated, reused pinned buffers with consumer-aware slot reuse.

A slot is a set of named pinned buffers (e.g. ``logprob_token_ids``, ``logprobs``,
``selected_token_ranks``). ``acquire`` returns a free slot; its buffers are then written with
``copy_d2h`` and handed to consumers inside an object that *holds* the slot. The slot becomes free
again only when every holder released it (explicitly, or when the holding object is garbage
collected). If no slot is free the ring grows by one slot - a counted pinned allocation, logged -
instead of overwriting data that someone may still read. Capacity grows (never shrinks) when a
step needs more elements than a slot has.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from math import prod

import paddle

from .backend import CopyBackend, CopyEvent

log = logging.getLogger("fd_async_copy")


@dataclass
class PinnedSlot:
    index: int
    buffers: dict[str, paddle.Tensor]
    capacity: dict[str, int]
    event: CopyEvent | None = None
    holders: dict[str, int] = field(default_factory=dict)
    generation: int = 0

    @property
    def free(self) -> bool:
        return not self.holders


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
        self.grow_events = 0  # slots added after construction (0 after warm-up in a healthy loop)
        self._next = 0
        for _ in range(slots):
            self._add_slot(capacity)

    def _add_slot(self, capacity: dict[str, int]) -> PinnedSlot:
        index = len(self.slots)
        buffers = {
            f: self.backend.new_pinned([max(1, int(capacity[f]))], dt, f"{self.name}[{index}].{f}")
            for f, dt in self.dtypes.items()
        }
        slot = PinnedSlot(index, buffers, {f: max(1, int(capacity[f])) for f in self.dtypes})
        self.slots.append(slot)
        return slot

    def _ensure_capacity(self, slot: PinnedSlot, need: dict[str, int]) -> None:
        for f, n in need.items():
            if n > slot.capacity[f]:
                # Grow once to what this step needs; never shrink inside the loop.
                old = slot.buffers[f]
                slot.buffers[f] = self.backend.new_pinned(
                    [n], self.dtypes[f], f"{self.name}[{slot.index}].{f}"
                )
                self.backend.free_pinned(old, f"{self.name}[{slot.index}].{f}")
                slot.capacity[f] = n
                log.info("fd_async_copy: pinned ring %s slot %d grew %s to %d elements",
                         self.name, slot.index, f, n)

    def acquire(self, writer: str, shapes: dict[str, list[int]]) -> PinnedSlot:
        """Return a free slot whose buffers can take tensors of ``shapes``."""
        need = {f: prod(shape) if shape else 1 for f, shape in shapes.items()}
        slot = None
        for offset in range(len(self.slots)):
            candidate = self.slots[(self._next + offset) % len(self.slots)]
            if candidate.free:
                slot = candidate
                break
        if slot is None:
            self.grow_events += 1
            log.warning(
                "fd_async_copy: every slot of pinned ring %s is still held by a consumer; "
                "adding slot %d (a pinned allocation; expected only during warm-up)",
                self.name, len(self.slots),
            )
            slot = self._add_slot(need)
        self._ensure_capacity(slot, need)
        self._next = (slot.index + 1) % len(self.slots)
        slot.generation += 1
        return slot

    def hold(self, slot: PinnedSlot, holder: str, owner: object | None = None) -> None:
        """Mark ``slot`` as held by ``holder``; with ``owner``, release when it is collected."""
        slot.holders[holder] = slot.holders.get(holder, 0) + 1
        for buf in slot.buffers.values():
            self.backend.hold(buf, holder)
        if owner is not None:
            weakref.finalize(owner, self.release, slot, holder, slot.generation)

    def release(self, slot: PinnedSlot, holder: str, generation: int | None = None) -> None:
        if generation is not None and generation != slot.generation:
            return  # a late finalizer for contents that were already released
        count = slot.holders.get(holder, 0)
        if count <= 0:
            return
        if count == 1:
            del slot.holders[holder]
        else:
            slot.holders[holder] = count - 1
        for buf in slot.buffers.values():
            self.backend.release(buf, holder)

    @property
    def size(self) -> int:
        return len(self.slots)
