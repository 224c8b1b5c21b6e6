"""A copy set described once (``CopySetState``): what a steady issue may skip, and when it may not.

A steady issue passes the C descriptor only the sources; its sizes are rewritten only after a
destination was reshaped, and a set that still wrote every destination last, on the same stream,
skips the ordering scan. Each test below is a case where skipping would be wrong: on the fake CUDA
runtime (``sim``) the stale size shows as poison or a short copy, the skipped ordering as two
unordered copies into one buffer."""

from __future__ import annotations

import paddle
import pytest

from fd_async_copy_plugin.runtime import SimulatedBackend
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend


def _set(backend, a, b, n_a: int, n_b: int, base: int):
    srcs = (paddle.arange(n_a, dtype="int64") + base, paddle.arange(n_b, dtype="int64") + 100 + base)
    return backend.copy_d2h_many([(a, srcs[0], "s1.a"), (b, srcs[1], "s1.b")], "s1"), srcs


def test_a_set_rewrites_its_sizes_after_another_set_reshaped_a_shared_destination():
    backend = SimulatedBackend()
    a, b = backend.new_pinned([8], "int64", "a"), backend.new_pinned([8], "int64", "b")
    _set(backend, a, b, 4, 4, 0)
    described = backend._facts(a).copyset
    # another copy set (b alone) gives b a new shape: 8 elements
    backend.copy_d2h(b, paddle.arange(8, dtype="int64") + 50, "s2.b")
    # the first set again, b's source now 8 elements: no destination is refitted in this call, so
    # only the reshape count tells the set that its C sizes (4 elements for b) are stale
    _, srcs = _set(backend, a, b, 4, 8, 1000)
    assert backend._facts(a).copyset is described  # the same set, issued from its descriptor
    assert backend.host_array(a, "reader").tolist() == srcs[0].numpy().tolist()
    assert backend.host_array(b, "reader").tolist() == srcs[1].numpy().tolist()


@pytest.fixture
def ordered_waits(monkeypatch) -> list:
    """The labels of the events ``RuntimeBackend._order_after`` waited for, in order (it still waits)."""
    ordered = []
    order_after = RuntimeBackend._order_after
    monkeypatch.setattr(RuntimeBackend, "_order_after",
                        lambda self, earlier, name: (ordered.append(earlier.label), order_after(self, earlier, name)))
    return ordered


def test_a_set_whose_destination_another_set_wrote_on_another_stream_is_ordered_after_it(ordered_waits):
    """S1 on stream X, S2 (one of S1's buffers) on stream Y, S1 again on X: S1 no longer wrote that
    buffer last, so its ordering scan runs and waits for S2's copy (else two unordered copies)."""
    backend, ordered = SimulatedBackend(), ordered_waits
    a, b = backend.new_pinned([4], "int64", "a"), backend.new_pinned([4], "int64", "b")
    backend.switch_streams(True)
    try:
        first, _ = _set(backend, a, b, 4, 4, 0)
        second = backend.copy_d2h(b, paddle.arange(4, dtype="int64") + 7, "s2")
        third, srcs = _set(backend, a, b, 4, 4, 20)
    finally:
        backend.switch_streams(False)
    assert first.native != second.native and third.native != second.native  # (two streams, alternating)
    # S2 waited for S1's copy into b (the other stream), then S1's second issue waited for S2's
    assert ordered == ["s1", "s2"]
    assert backend.host_array(b, "reader").tolist() == srcs[1].numpy().tolist()
    assert backend.host_array(a, "reader").tolist() == srcs[0].numpy().tolist()


def test_a_set_whose_destination_an_h2d_copy_read_on_another_stream_is_ordered_after_it(ordered_waits):
    """An H2D copy reads one of S1's buffers on another stream between two issues of S1: the second
    issue is ordered after that read (it would otherwise overwrite bytes the read may not have taken)."""
    backend, ordered = SimulatedBackend(), ordered_waits
    a, b = backend.new_pinned([4], "int64", "a"), backend.new_pinned([4], "int64", "b")
    target = paddle.zeros([4], dtype="int64")
    backend.switch_streams(True)
    try:
        first, _ = _set(backend, a, b, 4, 4, 0)
        backend.wait(first, "before the host stages a")
        backend.copy_h2d(target.data_ptr(), None, a, 0, 32, "h2d.a")
        _set(backend, a, b, 4, 4, 30)
    finally:
        backend.switch_streams(False)
    assert ordered == ["h2d.a"]
