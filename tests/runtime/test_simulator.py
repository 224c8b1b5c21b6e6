"""The race-detecting simulator: each kind of wait releases exactly what it would on a GPU."""

from __future__ import annotations

import gc

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.runtime import (
    BufferInUseError,
    HostBackend,
    PendingCopyError,
    SimulatedBackend,
    collecting,
)
from fd_async_copy_plugin.runtime.backend import host_view
from fd_async_copy_plugin.runtime.simulated import POISON_INT


def issue(backend, dtype, values, label="copy"):
    buf = backend.new_pinned([16], dtype, f"buf-{label}")
    backend.copy_d2h(buf, paddle.to_tensor(values, dtype=dtype), label)
    return buf


@pytest.mark.parametrize(
    "dtype, values, poisoned",
    [
        ("float32", [1.5, -2.0], lambda a: np.isnan(a).all()),
        ("int64", [3, 4], lambda a: (a == POISON_INT).all()),
        ("int32", [3, 4], lambda a: (a == POISON_INT).all()),
        ("bool", [True, False], lambda a: a.tolist() == [False, True]),
    ],
)
def test_pending_copy_is_poison_until_its_event_is_waited(dtype, values, poisoned):
    sim = SimulatedBackend()
    buf = issue(sim, dtype, values)
    assert poisoned(buf.numpy())  # what unguarded code (FD's own .numpy()) would see
    with pytest.raises(PendingCopyError, match="buf-copy"):
        sim.read(buf, "reader")
    sim.wait(sim.record("event"), "consumer")
    assert sim.read(buf, "reader").tolist() == values


def test_an_event_covers_only_copies_issued_before_it_was_recorded():
    sim = SimulatedBackend()
    first = issue(sim, "int64", [1], "first")
    early = sim.record("early")
    second = issue(sim, "int64", [2], "second")
    sim.wait(early, "consumer")
    assert sim.read(first, "r").tolist() == [1]
    with pytest.raises(PendingCopyError, match="second"):  # waited on the wrong (earlier) event
        sim.read(second, "r")


@pytest.mark.parametrize("sync", ["device_synchronize", "stream_synchronize"])
def test_stream_and_device_synchronize_land_everything(sync):
    sim = SimulatedBackend()
    bufs = [issue(sim, "float32", [float(i)], f"c{i}") for i in range(3)]
    getattr(sim, sync)("test")
    assert [sim.read(b, "r").tolist() for b in bufs] == [[0.0], [1.0], [2.0]]


def test_a_stream_wait_orders_two_streams_copies_into_one_buffer_on_the_device():
    """FastDeploy's own copies (Paddle's copy_, no host wait between them) into one pinned buffer
    from two streams: unordered, the second is reported when issued; after the second stream waits
    on the first copy's event (cudaStreamWaitEvent) it is accepted, nothing lands at the stream
    wait, and a wait on the second copy alone lands the first, then the second."""
    sim = SimulatedBackend()
    buf = sim.new_pinned([2], "int64", "count")
    try:
        sim.framework_copy_d2h(buf, paddle.to_tensor([1, 1], dtype="int64"), "step 1")
        first = sim.event_of(buf)
        sim.use_stream(1)
        with pytest.raises(BufferInUseError, match="'step 2' into pinned buffer 'count'.*another stream"):
            sim.framework_copy_d2h(buf, paddle.to_tensor([2, 2], dtype="int64"), "step 2")
        waits = sim.rt.stream_waits
        sim.stream_wait_event(first)
        assert sim.rt.stream_waits == waits + 1
        errors = sim.rt.errors()
        sim.framework_copy_d2h(buf, paddle.to_tensor([2, 2], dtype="int64"), "step 2")
        second = sim.event_of(buf)
        assert sim.rt.errors() == errors and second is not first
        assert not sim.query(first)  # the stream wait landed nothing
        sim.wait(second, "reader")
        assert sim.query(first) and sim.read(buf, "reader").tolist() == [2, 2]
    finally:
        sim.use_stream(0)
    del buf
    gc.collect()
    sim.release_freed()  # (freed now: the free-path tests count the frees they cause)


def test_copy_sees_the_source_as_it_was_when_issued():
    sim = SimulatedBackend()
    src = paddle.to_tensor([1, 2], dtype="int64")
    buf = sim.new_pinned([2], "int64", "b")
    sim.copy_d2h(buf, src, "c")
    src.set_value(paddle.to_tensor([9, 9], dtype="int64"))  # later device work (stream order)
    sim.wait(sim.record("e"), "r")
    assert sim.read(buf, "r").tolist() == [1, 2]


def test_every_copy_set_has_its_own_event_and_to_host_waits_on_it():
    sim = SimulatedBackend()
    buf = sim.new_pinned([1], "int64", "b")
    event = sim.copy_d2h(buf, paddle.to_tensor([1], dtype="int64"), "orphan")  # no record() asked for
    assert sim.event_of(buf) is event and sim.to_host(buf, "consumer").numpy().tolist() == [1] and event.done


def test_copy_events_wait_as_fastdeploys_own_events_do_never_as_blocking_sync():
    """The copy events take the context's wait (spin or yield), as FD's ``create_event()`` and
    Paddle's syncs do: a ``cudaEventBlockingSync`` wait sleeps, and its wake-up delays the next
    step's launches (H100 step model: one wait per step 1.041x of FD 2.4's step with it, 0.987x
    without; docs/verification.md, "Event waits")."""
    sim = SimulatedBackend()
    created, blocking = (sim.rt._var(name) for name in ("fake_events", "fake_blocking_events"))
    before = created.value, blocking.value
    buf = issue(sim, "int64", [3, 4])
    assert sim.to_host(buf, "consumer").numpy()[:2].tolist() == [3, 4]
    assert created.value > before[0] and blocking.value == before[1], (created.value, blocking.value, before)


def test_to_host_waits_once_and_reads_only_the_rows_asked_for():
    sim = SimulatedBackend()
    buf = sim.new_pinned([64], "float32", "rows")
    sim.copy_d2h(buf, paddle.arange(12, dtype="float32").reshape([4, 3]), "c")
    sim.record("e")
    with collecting() as census:
        census.begin_step()
        row = sim.to_host(buf, "slice", 2, 3)
        again = sim.to_host(buf, "slice", 3, 4)
    assert row.numpy().tolist() == [[6.0, 7.0, 8.0]] and again.numpy().tolist() == [[9.0, 10.0, 11.0]]
    assert row.place.is_cpu_place()
    assert census.steps[0].count("event_wait") == 1  # the second read finds the event complete


def test_host_backend_copies_synchronously_and_counts_the_same_interactions():
    host = HostBackend()
    with collecting() as census:
        census.begin_step()
        buf = issue(host, "int64", [5, 6])
        assert buf.numpy()[:2].tolist() == [5, 6]
        host.to_host(buf, "r")
    counts = census.steps[0].counts()
    assert counts["async_d2h"] == 1 and counts["pinned_alloc"] == 1 and counts["host_read"] == 1


def test_a_recycled_id_never_makes_an_unrelated_tensor_look_pinned():
    """Buffers are tracked by id(); once one is gone its id can be reused by any new tensor. Whether
    CPython hands the freed id to the next tensor is luck, so the reuse is made here: the dead
    buffer's entry is filed under the new tensor's id, the state such a reuse leaves."""
    sim = SimulatedBackend()
    buf = sim.new_pinned([4], "int64", "short-lived")
    sim.copy_d2h(buf, paddle.to_tensor([1, 2, 3, 4], dtype="int64"), "copy")
    sim.device_synchronize("land")
    old_id = id(buf)
    del buf
    gc.collect()
    fresh = paddle.zeros([4], dtype="int64")
    sim._pinned[id(fresh)] = sim._pinned.pop(old_id)  # (CPython reusing ``old_id`` for ``fresh``)
    assert not sim.is_pinned(fresh)
    assert sim.to_host(fresh, "reader") is fresh  # not treated as a pinned buffer
    assert sim.event_of(fresh) is None and sim.read(fresh, "reader").tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="not a pinned buffer"):
        sim.host_array(fresh, "reader")
    with pytest.raises(ValueError, match="not a pinned buffer"):
        sim.copy_d2h(fresh, paddle.to_tensor([5, 6, 7, 8], dtype="int64"), "copy")
    assert not sim.is_pinned(None)


def test_a_pending_copy_lands_in_the_bytes_it_was_issued_for_after_the_buffer_is_refit():
    # A ring slot whose consumer dropped its result before waiting is free with a copy still in
    # flight; the next fill gives its buffers the new step's shape (``_fit``, outside the backend
    # lock) before issuing its own copies, while another thread's wait may land the old copy. On a
    # GPU the old copy writes the bytes it was issued for; the simulator must do the same (it wrote
    # through the buffer's current shape: a broadcast error, or for equal counts a reshaped write).
    sim = SimulatedBackend()
    buf = sim.new_pinned([16], "int64", "slot")
    sim.copy_d2h(buf, paddle.to_tensor([[1, 2, 3], [4, 5, 6]], dtype="int64"), "old step")
    old = sim.record("old step")
    sim._fit(buf, (5,), "int64")  # the next fill's first half
    sim.wait(old, "another thread's consumer")
    assert sim.pending_writers() == []
    assert np.array_equal(host_view(buf)[:5], [1, 2, 3, 4, 5])
    sim.copy_d2h(buf, paddle.to_tensor([9, 8, 7, 6, 5], dtype="int64"), "new step")
    sim.wait(sim.record("new step"), "consumer")
    assert sim.read(buf, "r").tolist() == [9, 8, 7, 6, 5]
