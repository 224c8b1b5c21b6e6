"""Prepared copies (``_CopyPlan``, issue 24): a ring slot filled into the same buffers as before, and
a step's ``copy_d2h_many`` into the same pinned buffers, replay a plan - the same checks and
bookkeeping as ``_issue`` and one ``fdac_d2h_batch_prepared`` call. A new shape (the decode batch
grew or shrank) is given to the buffers by ``_fit`` and the plan's sizes follow; a step that
differs otherwise (the labels, the order, another device, a buffer moved or no longer registered, a
dtype) gets ``_issue``'s answer instead, with nothing issued by the plan. Runs the real C loop and
the real ``CudaRuntime`` against ``fake_cudart.c`` (see test_copy_batch.py)."""

from __future__ import annotations

import ctypes

import paddle
import pytest

from fd_async_copy_plugin.runtime import PinnedRing
from fd_async_copy_plugin.runtime.backend import AsyncCopyError
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend, _CopyPlan
from fd_async_copy_plugin.runtime.cudart import CudaError, PreparedBatch

from test_copy_batch import FIELDS, LABELS, _sources, fake, libs  # noqa: F401 (fixtures)
from test_cuda_layer import STREAM, GpuLikeGlue

CAPACITY = {"ids": 6, "lp": 6, "ranks": 2}


class Spied:
    """Counts which path each fill took: ``_issue`` (the general one) or a plan's prepared call."""

    def __init__(self, monkeypatch) -> None:
        self.general = self.planned = 0
        issue, prepared = RuntimeBackend._issue, PreparedBatch.issue

        def general(backend, *args):
            self.general += 1
            return issue(backend, *args)

        def planned(batch, *args):
            self.planned += 1
            return prepared(batch, *args)

        monkeypatch.setattr(RuntimeBackend, "_issue", general)
        monkeypatch.setattr(PreparedBatch, "issue", planned)


def _ring(fake, libs, glue=None, slots=2):
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    backend = RuntimeBackend(fake.rt, glue=glue or GpuLikeGlue(), probe=False)
    return backend, PinnedRing(backend, "r", FIELDS, CAPACITY, slots=slots)


def _check_step(fake, backend, ring, src, start, event, slot):
    """The step's log: its three copies from ``src`` into the slot, then its event, on the stream."""
    log = fake.log()[start:]
    assert [e[0] for e in log] == ["copy"] * 3 + ["record"] and event.native == (log[-1][1],)
    assert [e[1] for e in log[:3]] == [slot.buffers[f].data_ptr() for f in FIELDS]
    assert [e[2] for e in log[:3]] == [t.data_ptr() for t in src.values()]
    assert [e[3] for e in log[:3]] == [t.numel() * t.element_size() for t in src.values()]
    assert all(e[-1] == STREAM for e in log) and event.seq == backend._seq
    for field in FIELDS:  # each buffer's last copy is this step's, and in flight until the wait
        assert backend.copy_in_flight(slot.buffers[field]) and backend.covering_event(slot.buffers[field]) is event
    backend.wait(event, "reader")
    for field, t in src.items():
        assert not backend.copy_in_flight(slot.buffers[field])
        assert backend.read(slot.buffers[field], "reader").tolist() == t.numpy().tolist()


def test_a_slot_filled_again_the_same_way_replays_its_plan(fake, libs, monkeypatch):
    backend, ring = _ring(fake, libs)
    spied = Spied(monkeypatch)
    for step in range(1, 7):
        src = _sources(step=step)  # new source tensors every step, as a decode step's outputs
        start = len(fake.log())
        slot, event = ring.fill("w", src, LABELS, "s")
        _check_step(fake, backend, ring, src, start, event, slot)
        assert isinstance(slot.plan, _CopyPlan)
        del slot
    assert (spied.general, spied.planned) == (2, 4)  # each slot's first fill prepared its plan
    fences = [backend.memory_of(buf).fence_seq for s in ring.slots for buf in s.buffers.values()]
    assert backend._seq == 18 and sorted(fences) == list(range(13, 19))  # the last two steps' copies


def test_the_census_counts_a_replayed_fill_as_three_copies(fake, libs):
    from fd_async_copy_plugin.runtime import census

    backend, ring = _ring(fake, libs, slots=1)
    ring.fill("w", _sources(), LABELS, "s")
    with census.collecting() as counted:
        slot, event = ring.fill("w", _sources(step=2), LABELS, "s")
    assert slot.plan is not None and counted.setup.events == [("async_d2h", LABELS[f]) for f in FIELDS]


def _variations():
    def dtype(src, backend, slot):
        src["ranks"] = src["ranks"].astype("int32")

    def forgotten(src, backend, slot):
        backend.free_pinned(slot.buffers["lp"], "gone")  # no longer a pinned buffer of the backend

    def other_labels(src, backend, slot):
        return "labels"

    return {"dtype": (dtype, ValueError), "buffer forgotten": (forgotten, ValueError), "other labels": (other_labels, None)}


@pytest.mark.parametrize("variation", list(_variations()))
def test_a_step_that_differs_gets_the_general_path_and_its_answer(fake, libs, monkeypatch, variation):
    change, raises = _variations()[variation]
    backend, ring = _ring(fake, libs, slots=1)
    slot, _ = ring.fill("w", _sources(), LABELS, "s")
    assert slot.plan is not None
    spied = Spied(monkeypatch)
    src = _sources(step=2)
    answer = change(src, backend, slot)
    labels = dict(LABELS) if answer == "labels" else LABELS
    del slot
    start, seq = len(fake.log()), backend._seq
    if raises is not None:
        with pytest.raises(raises):
            ring.fill("w", src, labels, "s")
        assert fake.log()[start:] == [] and backend._seq == seq and spied.planned == 0  # nothing issued
        return
    slot, event = ring.fill("w", src, labels, "s")
    assert (spied.general, spied.planned) == (1, 0)
    log = fake.log()[start:]
    assert [e[0] for e in log] == ["copy"] * 3 + ["record"]
    assert sorted(e[2] for e in log[:3]) == sorted(t.data_ptr() for t in src.values())
    backend.wait(event, "reader")
    for field, t in src.items():
        assert backend.read(slot.buffers[field], "reader").tolist() == t.numpy().tolist()


def test_a_decode_batch_that_grows_and_shrinks_replays_the_plan_with_its_sizes(fake, libs, monkeypatch):
    """Rows join and leave the batch every few steps: each new shape is given to the buffers (within
    their capacity) and the plan copies this step's bytes - never the last step's size."""
    backend, ring = _ring(fake, libs, slots=1)
    slot, event = ring.fill("w", _sources(rows=2, cols=3), LABELS, "s")
    backend.wait(event, "reader")
    del slot
    spied = Spied(monkeypatch)
    for step, rows in enumerate((1, 2, 2, 1, 1, 2), start=2):
        src = _sources(rows=rows, cols=3, step=step)
        start = len(fake.log())
        slot, event = ring.fill("w", src, LABELS, "s")
        _check_step(fake, backend, ring, src, start, event, slot)  # sizes: this step's bytes
        assert all(tuple(slot.buffers[f].shape) == tuple(t.shape) for f, t in src.items())
        del slot
    assert (spied.general, spied.planned) == (0, 6)


def test_a_buffer_reshaped_behind_the_backends_back_gets_the_sources_shape_again(fake, libs, monkeypatch):
    backend, ring = _ring(fake, libs, slots=1)
    slot, event = ring.fill("w", _sources(), LABELS, "s")
    backend.wait(event, "reader")
    backend.glue.set_shape(slot.buffers["lp"], (3, 2))  # a framework op on the buffer
    del slot
    spied, src, start = Spied(monkeypatch), _sources(step=2), len(fake.log())
    slot, event = ring.fill("w", src, LABELS, "s")
    assert spied.planned == 1 and tuple(slot.buffers["lp"].shape) == (2, 3)
    _check_step(fake, backend, ring, src, start, event, slot)


def test_an_empty_step_copies_nothing_and_fences_nothing(fake, libs, monkeypatch):
    """Zero rows (no sequence asked for logprobs this step): the C loop skips the empty copies and
    their memory gets no fence (as ``_issue``), the others are copied and the event recorded."""
    backend, ring = _ring(fake, libs, slots=1)
    slot, event = ring.fill("w", _sources(), LABELS, "s")
    backend.wait(event, "reader")
    fences = {f: backend.memory_of(slot.buffers[f]).fence_seq for f in FIELDS}
    del slot
    spied, src, start = Spied(monkeypatch), _sources(rows=0, cols=3, step=2), len(fake.log())
    slot, event = ring.fill("w", src, LABELS, "s")
    assert spied.planned == 1 and [e[0] for e in fake.log()[start:]] == ["record"]
    assert {f: backend.memory_of(slot.buffers[f]).fence_seq for f in FIELDS} == fences
    backend.wait(event, "reader")
    assert backend.read(slot.buffers["ids"], "reader").shape == (0, 3)
    del slot
    src, start = _sources(step=3), len(fake.log())
    slot, event = ring.fill("w", src, LABELS, "s")
    _check_step(fake, backend, ring, src, start, event, slot)


def test_sources_in_another_order_go_to_their_own_buffers(fake, libs, monkeypatch):
    """The same fields, shapes and dtypes in another order: the plan replays copies in its own order,
    so it must decline (each field's data in its own buffer)."""
    backend, ring = _ring(fake, libs, slots=1)

    def sources(step):  # ids and ranks alike in shape and dtype: only the names tell them apart
        return {"ids": paddle.arange(2, dtype="int64") + 10 * step, "lp": paddle.full([2], 0.5 * step),
                "ranks": paddle.arange(2, dtype="int64") - 10 * step}

    slot, event = ring.fill("w", sources(1), LABELS, "s")
    backend.wait(event, "reader")
    del slot
    spied, src = Spied(monkeypatch), sources(2)
    slot, event = ring.fill("w", dict(reversed(list(src.items()))), LABELS, "s")
    backend.wait(event, "reader")
    assert (spied.general, spied.planned) == (1, 0)
    for field, t in src.items():
        assert backend.read(slot.buffers[field], "reader").tolist() == t.numpy().tolist()


def test_a_step_filling_fewer_fields_is_not_replayed(fake, libs, monkeypatch):
    """The same labels, two of the three fields: the plan holds three copies and must decline."""
    backend, ring = _ring(fake, libs, slots=1)
    slot, event = ring.fill("w", _sources(), LABELS, "s")
    backend.wait(event, "reader")
    del slot
    spied, src, start = Spied(monkeypatch), _sources(step=2), len(fake.log())
    del src["ranks"]
    slot, event = ring.fill("w", src, LABELS, "s")
    assert (spied.general, spied.planned) == (1, 0) and [e[0] for e in fake.log()[start:]] == ["copy"] * 2 + ["record"]
    backend.wait(event, "reader")
    assert [backend.read(slot.buffers[f], "reader").tolist() for f in src] == [t.numpy().tolist() for t in src.values()]


def test_a_buffer_no_longer_at_its_memory_is_refused_with_nothing_issued(fake, libs, monkeypatch):
    """A framework op that reallocated a pinned buffer: the plan must not copy into the new memory
    (its address check fails) and the general path refuses the step."""
    moved: set[int] = set()

    class Moving(GpuLikeGlue):
        def address(self, t):
            return super().address(t) + (64 if id(t) in moved else 0)

    backend, ring = _ring(fake, libs, glue=Moving(), slots=1)
    slot, _ = ring.fill("w", _sources(), LABELS, "s")
    moved.add(id(slot.buffers["lp"]))
    del slot
    spied, start = Spied(monkeypatch), len(fake.log())
    with pytest.raises(AsyncCopyError, match="no longer points at its memory"):
        ring.fill("w", _sources(step=2), LABELS, "s")
    assert fake.log()[start:] == [] and spied.planned == 0


def test_a_source_on_another_device_is_not_replayed(fake, libs, monkeypatch):
    """The plan is for one device: a step whose sources moved gets the general path, which copies on
    that device's stream and records there."""
    where = {"device": 0}

    class Movable(GpuLikeGlue):
        def gpu_device(self, t):
            return where["device"]

        def stream(self, device):
            return (STREAM, 0xB0B)[device]

    backend, ring = _ring(fake, libs, glue=Movable(), slots=1)
    ring.fill("w", _sources(), LABELS, "s")
    where["device"] = 1
    spied, start = Spied(monkeypatch), len(fake.log())
    slot, event = ring.fill("w", _sources(step=2), LABELS, "s")
    log = fake.log()[start:]
    assert spied.planned == 0 and [e[-1] for e in log[:3]] == [0xB0B] * 3
    assert {e[-1] for e in log[3:]} == {STREAM, 0xB0B}  # the event covers both streams copied on
    assert slot.plan.device == 1  # prepared again, for gpu:1
    del slot
    start = len(fake.log())
    slot, event = ring.fill("w", _sources(step=3), LABELS, "s")
    log = fake.log()[start:]
    assert spied.planned == 1 and [e[-1] for e in log[:3]] == [0xB0B] * 3
    assert {e[-1] for e in log[3:]} == {STREAM, 0xB0B} and len(event.native) == 2  # two streams known: no fused event


def test_a_grown_slot_drops_its_plan_and_prepares_the_new_buffers(fake, libs, monkeypatch):
    backend, ring = _ring(fake, libs, slots=1)
    slot, _ = ring.fill("w", _sources(), LABELS, "s")
    old = slot.plan
    del slot
    slot, event = ring.fill("w", _sources(rows=4, cols=3, step=3), LABELS, "s")  # larger: the slot grows
    assert slot.plan is not old and slot.plan is not None
    backend.wait(event, "reader")
    del slot
    spied, start = Spied(monkeypatch), len(fake.log())
    src = _sources(rows=4, cols=3, step=4)
    slot, event = ring.fill("w", src, LABELS, "s")
    assert spied.planned == 1
    _check_step(fake, backend, ring, src, start, event, slot)


def test_a_failing_replayed_copy_raises_naming_the_call_and_never_reuses_a_sequence_number(fake, libs):
    backend, ring = _ring(fake, libs, slots=1)
    slot, event = ring.fill("w", _sources(), LABELS, "s")
    backend.wait(event, "reader")
    del slot
    seq = backend._seq
    fake.var("fake_fail_copy").value = fake.var("fake_copies").value + 2  # the next step's third copy fails
    with pytest.raises(CudaError, match="cudaMemcpyAsync failed"):
        ring.fill("w", _sources(step=2), LABELS, "s")
    assert backend._seq == seq + 3  # (later events cover what was issued)
    fake.var("fake_fail_copy").value = -1
    fake.var("fake_fail_record").value = 1
    with pytest.raises(CudaError, match="cudaEventRecord failed"):
        ring.fill("w", _sources(step=3), LABELS, "s")
    fake.var("fake_fail_record").value = 0


# -- a step's copies (``copy_d2h_many``): one plan per set of destinations -------------------------
def _step_buffers(backend, tag=""):
    return [backend.new_pinned([2, 3], "int64", f"ids{tag}"), backend.new_pinned([2, 3], "float32", f"lp{tag}"),
            backend.new_pinned([2], "int64", f"ranks{tag}")]


def _step(backend, bufs, step, names=None, label="post_process"):
    src = list(_sources(step=step).values())
    event = backend.copy_d2h_many(list(zip(bufs, src, names or [LABELS[f] for f in FIELDS])), label)
    return src, event


def _check_many(fake, backend, bufs, src, start, event):
    log = fake.log()[start:]
    assert [e[0] for e in log] == ["copy"] * 3 + ["record"] and event.native == (log[-1][1],)
    assert [e[1] for e in log[:3]] == [b.data_ptr() for b in bufs] and [e[2] for e in log[:3]] == [t.data_ptr() for t in src]
    backend.wait(event, "reader")
    assert [backend.read(b, "reader").tolist() for b in bufs] == [t.numpy().tolist() for t in src]


def test_a_steps_copies_into_the_same_buffers_replay_their_plan(fake, libs, monkeypatch):
    from fd_async_copy_plugin.runtime import census

    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    backend = RuntimeBackend(fake.rt, glue=GpuLikeGlue(), probe=False)
    bufs, spied = _step_buffers(backend), Spied(monkeypatch)
    for step in range(1, 5):
        start = len(fake.log())
        with census.collecting() as counted:
            src, event = _step(backend, bufs, step)
        _check_many(fake, backend, bufs, src, start, event)
        assert counted.setup.events == [("async_d2h", LABELS[f]) for f in FIELDS]
    assert (spied.general, spied.planned) == (1, 3)


def test_alternating_destinations_keep_a_plan_each(fake, libs, monkeypatch):
    """overlap's two step flags taken in turn: each set of destinations replays its own plan."""
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    backend = RuntimeBackend(fake.rt, glue=GpuLikeGlue(), probe=False)
    sets, spied = (_step_buffers(backend, "a"), _step_buffers(backend, "b")), Spied(monkeypatch)
    for step in range(1, 7):
        bufs, start = sets[step % 2], len(fake.log())
        src, event = _step(backend, bufs, step)
        _check_many(fake, backend, bufs, src, start, event)
    assert (spied.general, spied.planned) == (2, 4)


def test_other_labels_or_a_freed_buffer_get_the_general_answer(fake, libs, monkeypatch):
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    backend = RuntimeBackend(fake.rt, glue=GpuLikeGlue(), probe=False)
    bufs = _step_buffers(backend)
    _step(backend, bufs, 1)
    spied, start = Spied(monkeypatch), len(fake.log())
    src, event = _step(backend, bufs, 2, names=["x.ids", "x.lp", "x.ranks"])  # the census must see these names
    assert (spied.general, spied.planned) == (1, 0)
    _check_many(fake, backend, bufs, src, start, event)
    backend.free_pinned(bufs[1], "gone")
    start, seq = len(fake.log()), backend._seq
    with pytest.raises(ValueError, match="not a pinned buffer"):
        _step(backend, bufs, 3, names=["x.ids", "x.lp", "x.ranks"])
    assert fake.log()[start:] == [] and backend._seq == seq and spied.planned == 0


def test_the_backend_keeps_a_bounded_number_of_plans(fake, libs):
    from fd_async_copy_plugin.runtime import cuda

    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    backend = RuntimeBackend(fake.rt, glue=GpuLikeGlue(), probe=False)
    for step in range(cuda._PLANS + 5):  # new buffers every step (never in production: they are kept)
        bufs = _step_buffers(backend, str(step))
        _, event = _step(backend, bufs, 1)
        backend.wait(event, "reader")
        assert 0 < len(backend._plans) <= cuda._PLANS


def test_a_buffer_reshaped_by_another_call_is_copied_at_its_new_size(fake, libs, monkeypatch):
    """Buffer ``a`` in two sets of destinations: a call of the other set gives it a new shape, so
    the first set's plan must copy ``a``'s new size although the source's shape matches the buffer's."""
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    backend = RuntimeBackend(fake.rt, glue=GpuLikeGlue(), probe=False)
    a, b = backend.new_pinned([8], "int64", "a"), backend.new_pinned([2], "int64", "b")
    two = paddle.arange(2, dtype="int64")
    for n in (3, 3):  # prepares the plan of {a, b}, then replays it
        backend.wait(backend.copy_d2h_many([(a, paddle.arange(n, dtype="int64"), "a"), (b, two, "b")], "s"), "r")
    backend.wait(backend.copy_d2h_many([(a, paddle.arange(7, dtype="int64"), "a")], "s"), "r")  # a: 7 elements
    spied, src, start = Spied(monkeypatch), paddle.arange(7, dtype="int64") * 5, len(fake.log())
    backend.wait(backend.copy_d2h_many([(a, src, "a"), (b, two, "b")], "s"), "r")
    assert spied.planned == 1 and [e[3] for e in fake.log()[start:] if e[0] == "copy"] == [7 * 8, 2 * 8]
    assert backend.read(a, "r").tolist() == src.numpy().tolist()


def test_a_referenced_next_slot_is_never_replayed_into(fake, libs, monkeypatch):
    """The common step takes the ring's next slot only when nothing references its buffers: a
    consumer still holding one (a lagging save) sends the fill to the ring's choice, which serves it
    from the other slot, replaying that slot's plan - the held data stays as it was."""
    backend, ring = _ring(fake, libs, slots=2)
    for step in (1, 2):  # both slots filled once: each has its plan, slot 0 is next
        slot, event = ring.fill("w", _sources(step=step), LABELS, "s")
        backend.wait(event, "reader")
        del slot
    held = ring.slots[0].buffers["ids"]
    before = backend.read(held, "reader").tolist()
    spied, start = Spied(monkeypatch), len(fake.log())
    slot, event = ring.fill("w", _sources(step=3), LABELS, "s")
    assert slot is ring.slots[1] and held.data_ptr() not in [e[1] for e in fake.log()[start:]]
    backend.wait(event, "reader")
    assert backend.read(held, "reader").tolist() == before and (spied.general, spied.planned) == (0, 1)
