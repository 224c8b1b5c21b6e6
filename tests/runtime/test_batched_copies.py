"""``CopyBackend.copy_d2h_many`` (issue 24): a step's copies and their covering event in one call.

It must keep every guarantee of ``copy_d2h`` + ``record``: the same checks per copy, one census
record per copy, the simulator still catching an early read and a reused referenced slot, and each
set reaching the stream whole, with its own event, when threads race. The
``cuda`` path (``RuntimeBackend``) asks the framework for the stream once per batch and reaches the
ctypes calls with plain ints.
"""

from __future__ import annotations

import threading

import paddle
import pytest

from fd_async_copy_plugin.runtime import HostBackend, PinnedRing, SimulatedBackend, collecting
from fd_async_copy_plugin.runtime.backend import AsyncCopyError, BufferInUseError, PendingCopyError
from fd_async_copy_plugin.runtime.cudart import CopySet, CudaRuntime

from test_cuda_layer import STREAM, gpu_backend

BACKENDS = pytest.mark.parametrize("make", [HostBackend, SimulatedBackend], ids=["host", "sim"])


def _sources():
    return (paddle.arange(6, dtype="int64").reshape([2, 3]), paddle.full([2, 3], 0.5, dtype="float32"),
            paddle.arange(2, dtype="int64"))


@BACKENDS
def test_one_call_issues_the_copies_in_order_and_records_the_event_covering_them(make):
    backend = make()
    bufs = [backend.new_pinned([8], d, f"b{i}") for i, d in enumerate(("int64", "float32", "int64"))]
    ids, lp, ranks = _sources()
    with collecting() as census:
        event = backend.copy_d2h_many(list(zip(bufs, (ids, lp, ranks), ("s.ids", "s.lp", "s.ranks"))), "s")
    assert event.label == "s" and len(event.native) == 1 and not event.done
    assert [e for e in census._current.events if e[0] == "async_d2h"] == [
        ("async_d2h", "s.ids"), ("async_d2h", "s.lp"), ("async_d2h", "s.ranks")]
    assert all(backend.event_of(b) is event for b in bufs)  # each destination keeps its set's event
    rows = backend.to_host(bufs[0], "reader", 1, 2).numpy()  # waits on the event (sim: lands then)
    assert rows.tolist() == [[3, 4, 5]]
    assert backend.read(bufs[1], "reader").tolist() == [[0.5] * 3] * 2
    assert backend.read(bufs[2], "reader").tolist() == [0, 1]
    assert event.done and backend.copy_d2h_many([], "empty").native == ()  # nothing issued: nothing to wait for


@BACKENDS
def test_each_copy_of_a_batch_is_checked_like_copy_d2h(make):
    backend = make()
    buf = backend.new_pinned([4], "int64", "b")
    with pytest.raises(ValueError, match="do not fit"):
        backend.copy_d2h_many([(buf, paddle.arange(5, dtype="int64"), "big")], "s")
    with pytest.raises(ValueError, match="dtype"):
        backend.copy_d2h_many([(buf, paddle.arange(4, dtype="int32"), "dtype")], "s")
    with pytest.raises(ValueError, match="not a pinned buffer"):
        backend.copy_d2h_many([(paddle.zeros([4], dtype="int64"), paddle.arange(4, dtype="int64"), "x")], "s")
    backend.free_pinned(buf, "b")
    with pytest.raises(ValueError, match="not a pinned buffer"):  # the cached facts went with the free
        backend.copy_d2h_many([(buf, paddle.arange(4, dtype="int64"), "freed")], "s")


def test_the_simulator_catches_an_early_read_through_the_batched_path():
    backend = SimulatedBackend()
    bufs = [backend.new_pinned([8], d, f"b{i}") for i, d in enumerate(("int64", "float32", "int64"))]
    event = backend.copy_d2h_many(list(zip(bufs, _sources(), ("s.ids", "s.lp", "s.ranks"))), "s")
    for buf, label in zip(bufs, ("s.ids", "s.lp", "s.ranks")):
        with pytest.raises(PendingCopyError, match=rf"before the copy '{label}'"):
            backend.read(buf, "early")
    backend.wait(event, "reader")
    assert backend.read(bufs[2], "reader").tolist() == [0, 1]


def test_the_simulator_catches_a_reused_referenced_slot_filled_by_batches():
    backend = SimulatedBackend()
    ring = PinnedRing(backend, "r", {"x": "int64", "y": "float32"}, {"x": 4, "y": 4}, slots=2)
    slot = ring.acquire("w", {"x": [4], "y": [4]})
    backend.copy_d2h_many([(slot.buffers["x"], paddle.arange(4, dtype="int64"), "w.x"),
                           (slot.buffers["y"], paddle.ones([4], dtype="float32"), "w.y")], "w")
    held = slot.buffers["y"]  # a consumer still holds the step's output
    ring._select = lambda: slot  # a reuse-policy bug: the referenced slot is chosen again
    with pytest.raises(BufferInUseError, match="still referenced"):
        ring.acquire("w", {"x": [4], "y": [4]})
    del held


@BACKENDS
def test_two_threads_sets_reach_the_stream_whole_and_each_event_is_its_own(make, monkeypatch):
    """Two threads issue copy sets at once: each set reaches the runtime whole (nothing of the other
    thread between its copies: one C call on ``sim``, consecutive calls on ``host``), and the event a
    set returns is the one its destinations keep."""
    backend = make()
    issued = []  # destination addresses in the order the copies reach the runtime
    if backend.rt.batch is not None:  # (the C call of a copy set described once)
        real_issue = CopySet.issue

        def logged(self, src, nbytes, stream, event):
            issued.extend((threading.current_thread().name, d) for d in self._dst)
            real_issue(self, src, nbytes, stream, event)

        monkeypatch.setattr(CopySet, "issue", logged)
    else:
        real_memcpy = backend.rt.memcpy_d2h_async
        monkeypatch.setattr(backend.rt, "memcpy_d2h_async", lambda dst, src, nbytes, stream: issued.append(
            (threading.current_thread().name, dst)) or real_memcpy(dst, src, nbytes, stream))
    owner, steps, wrong = {}, 200, []

    kept = []  # every buffer lives to the end: a finished thread's memory is not reused by the other's

    def producer(name):
        bufs = [backend.new_pinned([4], "int64", f"{name}{i}") for i in range(3)]
        kept.extend(bufs)
        owner.update((backend.glue.address(b), (name, i)) for i, b in enumerate(bufs))
        src = paddle.arange(4, dtype="int64")
        for step in range(steps):
            event = backend.copy_d2h_many([(b, src, f"{name}.{step}.{i}") for i, b in enumerate(bufs)], f"{name}.{step}")
            if any(backend.event_of(b) is not event for b in bufs) and step == steps - 1:
                wrong.append(name)
            backend.wait(event, name)
            assert backend.read(bufs[2], name).tolist() == [0, 1, 2, 3]

    threads = [threading.Thread(target=producer, args=(n,), name=n) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(issued) == 2 * 3 * steps and wrong == []
    for k in range(0, len(issued), 3):  # each set whole, in its order, from the thread that issued it
        names = [(thread, owner.get(a)) for thread, a in issued[k:k + 3]]
        thread = names[0][0]
        assert names == [(thread, (thread, 0)), (thread, (thread, 1)), (thread, (thread, 2))], (k, names)


def test_the_cuda_path_asks_for_the_stream_once_per_batch_and_records_after_the_copies():
    backend, rt = gpu_backend()
    asked = []
    real_stream = backend.glue.stream
    backend.glue.stream = lambda device: asked.append(device) or real_stream(device)
    bufs = [backend.new_pinned([8], d, f"b{i}") for i, d in enumerate(("int64", "float32", "int64"))]
    rt.log.clear()
    event = backend.copy_d2h_many(list(zip(bufs, _sources(), ("s.ids", "s.lp", "s.ranks"))), "s")
    assert asked == [0]
    assert rt.kinds() == ["memcpy"] * 3 + ["record"] and all(e[4] == STREAM for e in rt.log[:3])
    assert rt.log[3] == ("record", event.native[0], STREAM)
    backend.copy_d2h(bufs[0], _sources()[0], "again")  # a later call asks again (the thread's stream now)
    assert asked == [0, 0]
    before = backend.event_of(bufs[0])
    backend.glue.stream = lambda device: 1 / 0  # a failing accessor: nothing issued, no event
    with pytest.raises(ZeroDivisionError):
        backend.copy_d2h_many([(bufs[0], _sources()[0], "x")], "s")
    assert backend.event_of(bufs[0]) is before  # the buffer keeps the event of its last issued set


def test_cuda_runtime_passes_plain_ints_to_the_prebuilt_functions():
    class Fn:
        def __init__(self, log, name):
            self.log, self.name = log, name

        def __call__(self, *args):
            self.log.append((self.name, args))
            return 0

    class Lib:
        _name = "fake"

        def __init__(self):
            self.log = []

        def __getattr__(self, name):
            fn = Fn(self.log, name)
            setattr(self, name, fn)
            return fn

    lib = Lib()
    rt = CudaRuntime(lib=lib, origin="fake")
    rt.memcpy_d2h_async(0x1000, 0x2000, 64, 0x5EED)
    rt.event_record(7, 0x5EED)
    rt.event_synchronize(7)
    assert lib.log == [("cudaMemcpyAsync", (0x1000, 0x2000, 64, 2, 0x5EED)), ("cudaEventRecord", (7, 0x5EED)),
                       ("cudaEventSynchronize", (7,))]
    assert lib.cudaMemcpyAsync.argtypes is not None  # set once, at construction


def test_a_read_of_a_reallocated_buffer_goes_through_its_own_pointer_not_the_cached_view():
    backend = HostBackend()
    buf = backend.new_pinned([4], "int64", "b")
    backend.copy_d2h(buf, paddle.arange(4, dtype="int64"), "w")
    buf.set_(paddle.full([4], 9, dtype="int64"), [4])  # a framework op re-pointed it
    assert backend.read(buf, "reader").tolist() == [9, 9, 9, 9]
    with pytest.raises(AsyncCopyError, match="no longer points at its memory"):
        backend.copy_d2h_many([(buf, paddle.arange(4, dtype="int64"), "w")], "s")


@BACKENDS
def test_a_private_buffer_is_copied_and_read_without_asking_the_framework_its_address_or_shape(make):
    """``new_pinned(..., private=True)`` (a buffer never handed to FastDeploy: the shadow's
    snapshot): its copies and reads skip the two accessor calls a shared buffer costs, and still
    follow the source's shape; a shared buffer keeps asking (a framework op may have moved it)."""
    backend = make()
    private, shared = backend.new_pinned([6], "int64", "p", True), backend.new_pinned([6], "int64", "s")
    asked = []
    glue = backend.glue
    for name in ("address", "shape"):
        real = getattr(glue, name)
        setattr(glue, name, lambda t, real=real, name=name: (asked.append((name, id(t))), real(t))[1])
    try:
        for step, shape in enumerate(([6], [6], [2, 3], [2, 3])):
            src = (paddle.arange(6, dtype="int64") * (step + 1)).reshape(shape)
            for buf in (private, shared):
                asked.clear()
                backend.wait(backend.copy_d2h_many([(buf, src, "w")], "s"), "r")
                assert backend.read(buf, "r").tolist() == src.numpy().tolist() and list(buf.shape) == shape
                assert backend.host_array(buf, "r").tolist() == src.numpy().tolist()
                mine = [n for n, i in asked if i == id(buf)]
                assert (mine == []) if buf is private else (mine.count("address") >= 3 and "shape" in mine), mine
    finally:
        for name in ("address", "shape"):
            vars(glue).pop(name, None)


@BACKENDS
def test_every_copy_gives_the_buffer_its_shape_and_a_read_follows_the_tensors_shape(make):
    """A changed shape is applied; a shape someone else gave the tensor in place (no copy) is not
    trusted away: the next copy sets the source's again, and a read reads the tensor's shape."""
    backend = make()
    buf = backend.new_pinned([6], "int64", "b")
    for step, shape in enumerate(([2, 3], [2, 3], [3, 2], [3, 2], [6], [1, 2])):
        src = paddle.arange(6, dtype="int64").reshape(shape) * (step + 1) if shape != [1, 2] else \
            paddle.to_tensor([[7, 8]], dtype="int64")
        backend.wait(backend.copy_d2h_many([(buf, src, "w")], "s"), "r")
        assert list(buf.shape) == shape and backend.read(buf, "r").tolist() == src.numpy().tolist()
    backend.glue.set_shape(buf, (2, 1))  # a foreign in-place reshape, bytes unchanged
    assert backend.read(buf, "r").tolist() == [[7], [8]]
    src = paddle.to_tensor([[5, 6]], dtype="int64")
    backend.wait(backend.copy_d2h_many([(buf, src, "w")], "s"), "r")  # the same shape as the last copy
    assert list(buf.shape) == [1, 2] and backend.read(buf, "r").tolist() == [[5, 6]]


@BACKENDS
def test_a_buffer_given_no_rows_keeps_its_memory_for_the_next_step(make):
    """A step with zero rows (an empty logprobs batch) and the next with rows: on CPU Paddle 3.3
    ``t.set_(t, [0, 3])`` then ``t.set_(t, [2, 3])`` leaves the tensor without its storage, so the
    glue sets the dims instead; the tensor still points at its pinned memory and reads its data."""
    backend = make()
    buf = backend.new_pinned([6], "int64", "b")
    address = buf.data_ptr()
    for rows in (0, 2, 0, 1):
        src = paddle.arange(rows * 3, dtype="int64").reshape([rows, 3]) + rows
        backend.wait(backend.copy_d2h_many([(buf, src, "w")], "s"), "r")
        assert list(buf.shape) == [rows, 3] and buf.data_ptr() == address
        assert buf.numpy().tolist() == src.numpy().tolist() == backend.read(buf, "r").tolist()


@BACKENDS
def test_a_batch_with_a_bad_copy_issues_none_of_its_copies(make):
    backend = make()  # (the simulator used to issue the copies before the bad one)
    good, bad = backend.new_pinned([4], "int64", "good"), backend.new_pinned([4], "float32", "bad")
    with pytest.raises(ValueError, match="dtype"):
        backend.copy_d2h_many([(good, paddle.arange(4, dtype="int64"), "w.good"),
                               (bad, paddle.arange(4, dtype="int64"), "w.bad")], "w")
    assert not backend.copy_in_flight(good) and backend.event_of(good) is None

