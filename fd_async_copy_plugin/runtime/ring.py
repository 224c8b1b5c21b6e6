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
elements than a slot has. Growth is bounded by ``max_bytes`` (the ring's total pinned bytes): a
step that would exceed it raises ``RingFull`` and the producer copies it another way (the logprobs
feature: FastDeploy 2.4's blocking copies). Slots added while a consumer lagged are released again
once they have been idle for ``IDLE_ACQUIRES`` acquires (or at once when the cap is reached) - only
slots nothing references and whose copies have completed, never below the initial slot count. A
slot chosen while still referenced is reported to the backend (``reused_while_referenced``): the
simulator raises ``BufferInUseError`` naming the referrers - how a too-early reuse is caught in tests.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from math import prod

import numpy as np

from .backend import CopyBackend, release_freed

log = logging.getLogger("fd_async_copy")

#: A slot added beyond the initial ones is released after this many acquires without being chosen.
IDLE_ACQUIRES = 32


class RingFull(RuntimeError):
    """Serving this step from the ring would take it past its ``max_bytes``; nothing was allocated."""


# Reference counts are always read in one form, ``getrefcount(buffers[name])`` with ``buffers`` a
# slot's dict: the temporary references the expression holds are then the same at every read.
getrefcount = sys.getrefcount


@dataclass
class PinnedSlot:
    index: int
    buffers: dict[str, object]  # name -> pinned buffer (a host tensor of the backend's glue)
    capacity: dict[str, int]
    baseline: dict[str, int] = field(default_factory=dict)
    generation: int = 0
    last_acquired: int = 0  # the ring's acquire count when this slot was last handed out
    idle_since: int | None = None  # the acquire count when it was first seen idle (None: in use)
    served: dict | None = None  # the shapes (tuples) it was last handed out for: they fit its capacity


class PinnedRing:
    """N slots of pinned buffers, each buffer a flat allocation of ``capacity`` elements."""

    def __init__(self, backend: CopyBackend, name: str, dtypes: dict[str, str], capacity: dict[str, int],
                 slots: int = 2, max_bytes: int | None = None) -> None:
        if slots < 1:
            raise ValueError("a PinnedRing needs at least one slot")
        self.backend, self.name, self.dtypes = backend, name, dict(dtypes)
        self.base_slots, self.max_bytes = slots, max_bytes
        self.itemsize = {f: np.dtype(d).itemsize for f, d in self.dtypes.items()}
        self.slots: list[PinnedSlot] = []
        # slots added after construction (stays 0 after warm-up when healthy); idle slots released
        # after a lagging consumer caught up; acquires refused with RingFull (the step was copied
        # another way); acquires
        self.grow_events = self.released_slots = self.refused = self._acquires = 0
        initial = slots * sum(max(1, int(capacity[f])) * self.itemsize[f] for f in self.dtypes)
        if max_bytes is not None and initial > max_bytes:
            raise RingFull(f"pinned ring {name!r} needs {initial} bytes for its first {slots} slot(s), "
                           f"over its cap of {max_bytes}")
        self._next = 0
        #: Held by ``acquire``; a producer handing buffers to other threads holds it from ``acquire``
        #: until its result references them (else another thread could pick the same free slot).
        self.lock = threading.RLock()
        for _ in range(slots):
            self._add_slot(capacity)

    # -- slots ---------------------------------------------------------------------------------
    def _new_buffer(self, slot: PinnedSlot, name: str, elements: int) -> None:
        buffers = slot.buffers
        buffers[name] = self.backend.new_pinned([elements], self.dtypes[name], f"{self.name}[{slot.index}].{name}")
        slot.capacity[name], slot.baseline[name] = elements, getrefcount(buffers[name])

    def _add_slot(self, capacity: dict[str, int]) -> PinnedSlot:
        slot = PinnedSlot(len(self.slots), {}, {})
        for name in self.dtypes:
            self._new_buffer(slot, name, max(1, int(capacity[name])))
        self.slots.append(slot)
        return slot

    def is_free(self, slot: PinnedSlot) -> bool:
        buffers = slot.buffers
        for name, base in slot.baseline.items():
            if getrefcount(buffers[name]) > base:
                return False
        return True

    def _select(self) -> PinnedSlot | None:
        """The reuse policy: the next free slot of the initial ones in ring order, else the first
        free added slot (so added slots go idle once the consumer caught up), or None."""
        base = min(self.base_slots, len(self.slots))
        order = [self.slots[(self._next + offset) % base] for offset in range(base)] + self.slots[base:]
        return next((slot for slot in order if self.is_free(slot)), None)

    def _choose(self, writer: str) -> PinnedSlot | None:
        """``_select``'s slot, verified (``_verify_unreferenced`` reports a referenced one: a policy
        bug; the slow path only, so the slot ``is_free`` found free is counted again)."""
        slot = self._select()
        return slot if slot is None or self._verify_unreferenced(slot, writer) else None

    def _verify_unreferenced(self, slot: PinnedSlot, writer: str) -> bool:
        buffers = slot.buffers  # references to the slot's buffers held outside the ring:
        refs = {name: extra for name, base in slot.baseline.items()
                if (extra := getrefcount(buffers[name]) - base) > 0}
        if not refs:
            return True
        self.backend.reused_while_referenced(  # the simulator raises here
            f"{writer!r} is about to overwrite slot {slot.index} of pinned ring {self.name!r} whose previous "
            f"contents are still referenced ({refs})", slot.buffers)
        log.error("fd_async_copy: ring %s chose a referenced slot; adding a slot instead", self.name)
        return False

    def acquire(self, writer: str, shapes: dict[str, list[int]], reserve=None) -> PinnedSlot:
        """A slot that nobody references, with buffers large enough for tensors of ``shapes``.

        When a buffer must grow, it grows to ``reserve[field]`` elements if that is larger (e.g. a
        wider logprob row sized for every sequence, not just this step's), so it grows once.
        ``reserve`` may be a callable returning that dict: it is asked only when something grows.
        """
        with self.lock:
            return self._acquire(writer, shapes, reserve)

    def fill(self, writer: str, sources: dict, labels: dict, label: str, reserve=None):
        """``acquire`` a slot for ``sources`` (field -> source tensor), copy each into its buffer
        (``labels``: field -> that copy's label) and record ``label``: (the slot, the event). A
        step's copies in one call, each source's facts read once (``RuntimeBackend.fill``). Hold
        ``lock`` until the result references the buffers if other threads acquire too."""
        with self.lock:
            return self.backend.fill(self, writer, sources, labels, label, reserve)

    @property
    def nbytes(self) -> int:
        """Pinned bytes the ring holds now."""
        return sum(n * self.itemsize[f] for slot in self.slots for f, n in slot.capacity.items())

    def _idle(self, slot: PinnedSlot) -> bool:
        """Nothing references the slot and no copy into it is still in flight."""
        return self.is_free(slot) and not any(self.backend.copy_in_flight(b) for b in slot.buffers.values())

    def release_idle(self, min_idle: int = IDLE_ACQUIRES) -> int:
        """Release slots beyond the initial ones that have been idle (unreferenced, copies landed)
        for ``min_idle`` or more acquires; returns how many were released.

        Idle time counts from when a slot was first *seen* idle, not from its last use: a consumer
        31+ steps behind frees each slot 31+ acquires after it was filled, and counting from the
        fill released that slot at once, only for the step to allocate a new one - 3 pinned
        allocations and 3 frees per step (issue 25). Such a slot is reused instead."""
        with self.lock:
            released = 0
            for slot in self.slots[self.base_slots:]:
                if not self._idle(slot):
                    slot.idle_since = None
                elif slot.idle_since is None:
                    slot.idle_since = self._acquires
            due = [s for s in self.slots if s.idle_since is not None and self._acquires - s.idle_since >= min_idle]
            for slot in sorted(due, key=lambda s: s.last_acquired):
                if len(self.slots) <= self.base_slots:
                    break
                self.slots.remove(slot)
                for name in list(slot.buffers):
                    buffer = slot.buffers.pop(name)
                    self.backend.free_pinned(buffer, f"{self.name}[{slot.index}].{name}")
                    del buffer
                released += 1
            if released:
                for index, slot in enumerate(self.slots):
                    slot.index = index
                self._next %= min(self.base_slots, len(self.slots))
                self.released_slots += released
                release_freed()  # the memory of the buffers just dropped
                log.info("fd_async_copy: pinned ring %s released %d idle slot(s); %d left (%d bytes)",
                         self.name, released, len(self.slots), self.nbytes)
            return released

    def _growth(self, slot: PinnedSlot | None, need: dict[str, int], reserve: dict[str, int]) -> int:
        """Bytes serving ``need`` from ``slot`` (None: a new slot) would add to the ring."""
        if slot is None:
            return sum(max(1, n) * self.itemsize[f] for f, n in need.items())
        return sum((max(n, int(reserve.get(f, 0))) - slot.capacity[f]) * self.itemsize[f]
                   for f, n in need.items() if n > slot.capacity[f])

    def _free_next(self) -> PinnedSlot | None:
        """The slot of the common step: the next one in ring order, when the ring holds its initial
        slots only and nothing outside it references that slot's buffers (``is_free``, inline); else
        None. Hands nothing out: ``_take`` does (``RuntimeBackend.fill``'s common step)."""
        slots = self.slots
        if len(slots) != self.base_slots:
            return None
        slot = slots[self._next]
        return slot if self.is_free(slot) else None

    def _take(self, slot: PinnedSlot) -> PinnedSlot:
        """Hand out ``_free_next``'s slot as it is (its buffers hold the shapes asked for already)."""
        self._acquires += 1
        return self._hand_out(slot)

    def _acquire(self, writer: str, shapes: dict[str, list[int]], reserve) -> PinnedSlot:
        self._acquires += 1
        if len(self.slots) > self.base_slots:
            self.release_idle()
        slot = self._choose(writer)
        if slot is not None and shapes == slot.served:  # what it held last time fits
            return self._hand_out(slot)
        fits = slot is not None
        for name, shape in shapes.items() if fits else ():  # (a loop: a generator costs ~0.5 us here)
            if prod(shape) > slot.capacity[name]:
                fits = False
                break
        if not fits:
            slot = self._grown(writer, slot, shapes, reserve)
        slot.served = {name: tuple(shape) for name, shape in shapes.items()}  # (a copy: callers may reuse theirs)
        return self._hand_out(slot)

    def _hand_out(self, slot: PinnedSlot) -> PinnedSlot:
        slots = len(self.slots)  # (a conditional: ``min``/``max`` cost ~0.1 us here, every step)
        self._next = (slot.index + 1) % (self.base_slots if slots >= self.base_slots else max(1, slots))
        slot.generation += 1
        slot.last_acquired, slot.idle_since = self._acquires, None
        return slot

    def _grown(self, writer: str, slot: PinnedSlot | None, shapes: dict[str, list[int]], reserve) -> PinnedSlot:
        """``slot`` (None: none was free) grown to hold ``shapes``, or a new slot; ``RingFull`` if
        that would take the ring past its cap."""
        need = {f: prod(shape) for f, shape in shapes.items()}
        reserve = (reserve() if callable(reserve) else reserve) or {}
        if self.max_bytes is not None:
            growth = self._growth(slot, need, reserve)
            if growth and self.nbytes + growth > self.max_bytes:
                self.release_idle(min_idle=0)  # under pressure: every idle extra slot goes first
                slot = self._choose(writer) if slot is None else slot
                growth = self._growth(slot, need, reserve)
                if growth and self.nbytes + growth > self.max_bytes:
                    self.refused += 1
                    raise RingFull(f"pinned ring {self.name!r} holds {self.nbytes} bytes; {writer!r} needs "
                                   f"{growth} more, over its cap of {self.max_bytes} "
                                   "(FD_ASYNC_COPY_RING_MAX_BYTES)")
        if slot is None:
            self.grow_events += 1
            log.warning("fd_async_copy: every slot of pinned ring %s is still in use; adding slot %d (a pinned "
                        "allocation; expected only during warm-up)", self.name, len(self.slots))
            slot = self._add_slot(need)
        for name, elements in need.items():
            if elements > slot.capacity[name]:
                # Grow once, to at least what this step needs; never shrink inside the loop.
                elements = max(elements, int(reserve.get(name, 0)))
                old = slot.buffers.pop(name)
                self._new_buffer(slot, name, elements)
                self.backend.free_pinned(old, f"{self.name}[{slot.index}].{name}")
                del old
                release_freed()
                log.info("fd_async_copy: pinned ring %s slot %d: %s grew to %d elements", self.name, slot.index, name, elements)
        return slot

    @property
    def size(self) -> int:
        return len(self.slots)
