"""The production copy path on the fake CUDA runtime (backend ``sim``) and the mutations it catches.

Each ``check_*`` below passes on the real code and is a CPU test on its own; the table in
``docs/verification.md`` names the check that catches each mutation of ``copy_path_mutations``,
and ``test_each_mutation_is_caught`` applies each mutation and asserts its check then fails - so a
check that could not fail, or a mutation nothing catches, fails CI."""

from __future__ import annotations

import gc

import paddle
import pytest

from copy_path_mutations import MUTATIONS
from fd_async_copy_plugin.runtime import AsyncCopyError, PinnedRing, SimulatedBackend

FIELDS = {"ids": "int64", "lp": "float32", "flag": "bool"}
LABELS = {f: f"step.{f}" for f in FIELDS}


def _step(n: int) -> dict:
    return {"ids": paddle.arange(6, dtype="int64").reshape([2, 3]) + 10 * n,
            "lp": paddle.full([2, 3], 0.5 * n, dtype="float32"),
            "flag": paddle.to_tensor([n % 2 == 0, n % 3 == 0])}


def _values(result: dict, backend) -> list:
    return [backend.host_array(buf, "consumer").tolist() for buf in result.values()]


def check_a_lagging_consumer_reads_its_own_steps_values():
    """A consumer keeps steps N and N+1's buffers while step N+2 fills (FD 2.5's overlap, the ZMQ
    thread) and reads step N's afterwards: step N's values, never a later step's, never poison, no
    early read. Two slots do not serve that lag: the ring grows once, never reuses a held slot."""
    backend = SimulatedBackend()
    ring = PinnedRing(backend, "lag", FIELDS, {"ids": 6, "lp": 6, "flag": 2}, slots=2)
    held = []
    for n in range(8):
        with ring.lock:
            slot, _ = ring.fill("producer", _step(n), LABELS, "step")
            held.append((n, dict(slot.buffers)))
        del slot
        if len(held) == 3:
            old, result = held.pop(0)
            assert _values(result, backend) == [t.numpy().tolist() for t in _step(old).values()]
            del result
    assert [_values(r, backend) for _, r in held] == [[t.numpy().tolist() for t in _step(n).values()] for n in (6, 7)]
    assert ring.grow_events == 1 and len(ring.slots) == 3


def check_a_buffer_dropped_with_its_copy_in_flight_is_freed_after_the_copy():
    backend = SimulatedBackend()
    rt = backend.rt
    gc.collect()
    backend.release_freed()  # earlier tests' dropped buffers first: only this one's free is counted
    errors, frees = rt.errors(), rt.frees
    buf = backend.new_pinned([1024], "float32", "dropped")
    backend.copy_d2h(buf, paddle.ones([1024], dtype="float32"), "in flight")
    del buf  # the result was dropped unread: its copy is still pending
    gc.collect()
    assert backend.release_freed() >= 1
    assert rt.frees == frees + 1 and rt.errors() == errors, rt.last_error()


def check_copies_into_one_buffer_on_two_streams_are_ordered():
    """The framework's current stream changed between two steps (FD 2.5's stream guard) and the
    first step's copy was never waited on: the second copy is ordered after it."""
    backend = SimulatedBackend()
    backend.switch_streams(True)
    try:
        buf = backend.new_pinned([4], "int64", "shared")
        first = backend.copy_d2h(buf, paddle.arange(4, dtype="int64"), "first")
        second = backend.copy_d2h(buf, paddle.arange(4, dtype="int64") + 7, "second")
        assert first.native != second.native
        assert backend.host_array(buf, "reader").tolist() == [7, 8, 9, 10]
    finally:
        backend.switch_streams(False)


CHECKS = {
    "record the event before the copies": check_a_lagging_consumer_reads_its_own_steps_values,
    "skip the reference check": check_a_lagging_consumer_reads_its_own_steps_values,
    "reuse a referenced slot": check_a_lagging_consumer_reads_its_own_steps_values,
    "read before the wait": check_a_lagging_consumer_reads_its_own_steps_values,
    "free with a copy in flight": check_a_buffer_dropped_with_its_copy_in_flight_is_freed_after_the_copy,
    "drop the cross-stream ordering": check_copies_into_one_buffer_on_two_streams_are_ordered,
}


@pytest.mark.parametrize("check", sorted(set(CHECKS.values()), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__)
def test_the_real_copy_path_passes(check):
    check()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_device_that_runs_ahead_changes_nothing(seed):
    """Copies landing at random later calls (``run_ahead``) instead of at the waits: same values."""
    backend = SimulatedBackend()
    backend.run_ahead(seed)
    try:
        check_a_lagging_consumer_reads_its_own_steps_values()
        check_copies_into_one_buffer_on_two_streams_are_ordered()
    finally:
        backend.run_ahead(None)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_mutation_is_caught(mutation, monkeypatch):
    MUTATIONS[mutation](monkeypatch)
    with pytest.raises((AssertionError, AsyncCopyError)):
        CHECKS[mutation]()
