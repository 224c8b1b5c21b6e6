"""PinnedRing reuse rules and the census."""

from __future__ import annotations

import paddle
import pytest

from fd_async_copy_plugin.runtime import BufferInUseError, HostBackend, PinnedRing, SimulatedBackend, SyncCensus, collecting, census
from fd_async_copy_plugin.testing.harness import first_read_after_wait


def fill(backend, slot, value):
    backend.copy_d2h(slot.buffers["x"], paddle.full([2, 3], value, dtype="int64"), f"fill{value}")
    backend.record(f"e{value}")


def test_slot_is_reused_once_nothing_references_its_buffers():
    sim = SimulatedBackend()
    ring = PinnedRing(sim, "r", {"x": "int64"}, {"x": 6}, slots=1)
    for step in range(5):
        slot = ring.acquire("producer", {"x": [2, 3]})
        fill(sim, slot, step)
        consumer_view = slot.buffers["x"]  # a consumer reads, then drops its reference
        assert sim.to_host(consumer_view, "consumer").numpy()[0, 0] == step
        del consumer_view
    assert ring.size == 1 and ring.grow_events == 0


def test_a_referenced_slot_is_never_overwritten_the_ring_grows_instead():
    sim = SimulatedBackend()
    ring = PinnedRing(sim, "r", {"x": "int64"}, {"x": 6}, slots=1)
    slot = ring.acquire("step1", {"x": [2, 3]})
    fill(sim, slot, 1)
    deferred_save = slot.buffers["x"]  # e.g. overlap mode: saved one step later
    second = ring.acquire("step2", {"x": [2, 3]})
    assert second is not slot and ring.grow_events == 1
    assert sim.to_host(deferred_save, "deferred save").numpy()[0, 0] == 1


@pytest.mark.parametrize("make", [HostBackend, SimulatedBackend], ids=["host", "sim"])
def test_the_next_slot_is_checked_for_references_on_every_backend(make):
    """The common step checks only the next slot in ring order: a reference held to any of its
    buffers (no backend holds references of its own) sends the acquire to the full walk, which picks the other free slot or grows."""
    backend = make()
    ring = PinnedRing(backend, "r", {"x": "int64", "y": "int64"}, {"x": 6, "y": 6}, slots=2)
    first = ring.acquire("s0", {"x": [6], "y": [6]})
    held = first.buffers["y"]  # one buffer of slot 0 still referenced
    second = ring.acquire("s1", {"x": [6], "y": [6]})
    assert second.index == 1 and ring._next == 0
    third = ring.acquire("s2", {"x": [6], "y": [6]})  # slot 0 is next but held: slot 1 again
    assert third is second and ring.grow_events == 0
    del first, second, third
    fourth = ring.acquire("s3", {"x": [6], "y": [6]})  # slot 0 is next, still held
    assert fourth.index == 1
    del held, fourth
    assert ring.acquire("s4", {"x": [6], "y": [6]}).index == 0 and ring.grow_events == 0


def test_a_callable_reserve_is_asked_only_when_a_buffer_grows():
    ring = PinnedRing(HostBackend(), "r", {"x": "int64"}, {"x": 4}, slots=1)
    asked = []

    def reserve():
        asked.append(1)
        return {"x": 32}

    ring.acquire("small", {"x": [2, 2]}, reserve=reserve)
    assert asked == [] and ring.slots[0].capacity["x"] == 4
    ring.acquire("wider", {"x": [2, 5]}, reserve=reserve)
    assert asked == [1] and ring.slots[0].capacity["x"] == 32  # grown once, to the reserve


def test_planted_bug_reusing_a_slot_one_step_too_early_is_caught():
    class EagerRing(PinnedRing):
        def _select(self):  # the bug: round robin without checking consumers
            slot = self.slots[self._next % len(self.slots)]
            return slot

    sim = SimulatedBackend()
    ring = EagerRing(sim, "eager", {"x": "int64"}, {"x": 6}, slots=2)
    step1 = ring.acquire("step1", {"x": [2, 3]}).buffers["x"]  # still held (deferred save)
    ring.acquire("step2", {"x": [2, 3]})
    with pytest.raises(BufferInUseError, match=r"'step3'.*slot 0.*reused too early"):
        ring.acquire("step3", {"x": [2, 3]})
    del step1
    # the correct policy, same history: grows instead of overwriting
    ring = PinnedRing(sim, "ok", {"x": "int64"}, {"x": 6}, slots=2)
    step1 = ring.acquire("step1", {"x": [2, 3]}).buffers["x"]
    ring.acquire("step2", {"x": [2, 3]})
    assert ring.acquire("step3", {"x": [2, 3]}).index == 1


def test_a_policy_returning_another_slot_than_the_one_it_found_free_is_still_reported():
    class SwappingRing(PinnedRing):
        def _select(self):  # the bug: checks the next slot, returns the one before it
            candidate = self.slots[self._next % len(self.slots)]
            return self.slots[(self._next - 1) % len(self.slots)] if self.is_free(candidate) else None

    backend = SimulatedBackend()
    ring = SwappingRing(backend, "swap", {"x": "int64"}, {"x": 4}, slots=2)
    held = ring.acquire("w0", {"x": [4]}).buffers["x"]  # slot 1 (the one before slot 0), still held
    with pytest.raises(BufferInUseError, match=r"'w1'.*slot 1 of pinned ring 'swap'.*reused too early"):
        ring.acquire("w1", {"x": [4]})
    del held


def test_capacity_grows_once_and_never_shrinks():
    sim = SimulatedBackend()
    with collecting() as c:
        ring = PinnedRing(sim, "r", {"x": "int64"}, {"x": 4}, slots=1)
        c.begin_step()
        ring.acquire("big", {"x": [10, 10]})
        c.begin_step()
        ring.acquire("small", {"x": [1, 1]})
        ring.acquire("big-again", {"x": [10, 10]})
    assert [s.counts()["pinned_alloc"] for s in c.steps] == [1, 0]
    assert [s.counts()["pinned_free"] for s in c.steps] == [1, 0]
    assert ring.slots[0].capacity["x"] == 100


def test_census_orders_reads_and_waits():
    c = SyncCensus()
    with collecting(c):
        census.begin_step()
        census.record("host_read", "too early")
        census.record("event_wait", "e")
        census.begin_step()
        census.record("event_wait", "e")
        census.record("host_read", "ok")
        census.begin_step()
    assert [first_read_after_wait(s) for s in c.steps] == [False, True, None]
    assert c.per_step()["event_wait"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        c.record("bogus", "x")
