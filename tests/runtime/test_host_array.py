"""``CopyBackend.host_array``: a pinned buffer's rows as an owned numpy array, after the event that
covers its last copy (``to_host`` without the framework tensor; issue 24)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.runtime import AsyncCopyError, HostBackend, SimulatedBackend


def test_host_array_waits_for_the_covering_event_then_reads_owned_rows():
    sim = SimulatedBackend()
    buf = sim.new_pinned([4], "int64", "buf")
    sim.copy_d2h(buf, paddle.to_tensor([5, 6, 7, 8], dtype="int64"), "copy")
    event = sim.record("event")
    rows = sim.host_array(buf, "reader", 1, 3)  # the simulator raises on a read before the copy landed
    assert isinstance(rows, np.ndarray) and rows.tolist() == [6, 7] and event.seq <= sim._completed
    rows[0] = -1  # owned: the buffer is not written through it
    assert sim.host_array(buf, "reader").tolist() == [5, 6, 7, 8]
    assert sim.to_host(buf, "reader").numpy().tolist() == [5, 6, 7, 8]  # to_host reads the same way


def test_host_array_of_a_copy_without_an_event_is_the_simulators_missing_record():
    sim = SimulatedBackend()
    buf = sim.new_pinned([1], "bool", "flag")
    sim.copy_d2h(buf, paddle.to_tensor([True]), "flag copy")
    with pytest.raises(AsyncCopyError, match="no event was recorded after the copy 'flag copy'"):
        sim.host_array(buf, "reader")


@pytest.mark.parametrize("backend", [HostBackend, SimulatedBackend])
def test_host_array_refuses_a_tensor_that_is_not_a_pinned_buffer(backend):
    with pytest.raises(ValueError, match="host_array\\(reader\\): not a pinned buffer"):
        backend().host_array(paddle.to_tensor([1, 2]), "reader")
