"""``CopyBackend.host_array``: a pinned buffer's rows as an owned numpy array, after the event that
covers its last copy (``to_host`` without the framework tensor; issue 24)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.runtime import AsyncCopyError, HostBackend, SimulatedBackend


def test_host_array_waits_for_its_copy_sets_event_then_reads_owned_rows():
    sim = SimulatedBackend()
    buf = sim.new_pinned([4], "int64", "buf")
    event = sim.copy_d2h(buf, paddle.to_tensor([5, 6, 7, 8], dtype="int64"), "copy")
    rows = sim.host_array(buf, "reader", 1, 3)  # the simulator raises on a read before the copy landed
    assert isinstance(rows, np.ndarray) and rows.tolist() == [6, 7] and event.done
    rows[0] = -1  # owned: the buffer is not written through it
    assert sim.host_array(buf, "reader").tolist() == [5, 6, 7, 8]
    assert sim.to_host(buf, "reader").numpy().tolist() == [5, 6, 7, 8]  # to_host reads the same way


def test_host_array_waits_on_the_event_the_buffer_keeps_not_a_later_one():
    """The reader's event is the copy set's own: a later set into another buffer is not waited on
    (its copy stays pending), and a wait on a later event makes the earlier one free."""
    sim = SimulatedBackend()
    first, second = sim.new_pinned([1], "bool", "first"), sim.new_pinned([1], "bool", "second")
    early = sim.copy_d2h(first, paddle.to_tensor([True]), "first copy")
    late = sim.copy_d2h(second, paddle.to_tensor([False]), "second copy")
    assert sim.host_array(first, "reader").tolist() == [True] and early.done and not late.done
    assert sim.pending_writers() == ["second copy"]
    sim.wait(sim.record("later"), "r")
    assert late.done and sim.pending_writers() == []


@pytest.mark.parametrize("backend", [HostBackend, SimulatedBackend])
def test_host_array_refuses_a_tensor_that_is_not_a_pinned_buffer(backend):
    with pytest.raises(ValueError, match="host_array\\(reader\\): not a pinned buffer"):
        backend().host_array(paddle.to_tensor([1, 2]), "reader")
