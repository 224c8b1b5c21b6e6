"""``PinnedRing.fill`` (issue 24, fifth cut): a step's slot, its copies and their event in one call,
each source's facts read once (``glue.facts``), with every guarantee of ``acquire`` +
``copy_d2h_many``: checks before anything is issued, the simulator still catching an early read
and a reused referenced slot, capacity checked whenever the shapes change."""

from __future__ import annotations

import collections

import paddle
import pytest

from fd_async_copy_plugin.runtime import HostBackend, PinnedRing, SimulatedBackend, collecting
from fd_async_copy_plugin.runtime.backend import BufferInUseError, PendingCopyError
from fd_async_copy_plugin.runtime.glue import FACTS, PaddleGlue, composed_facts

from test_accessor_probe import CpuAsGpuGlue, failed, run
from test_cuda_layer import STREAM, GpuLikeGlue, RecordingRuntime
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend

BACKENDS = pytest.mark.parametrize("make", [HostBackend, SimulatedBackend], ids=["host", "sim"])
FIELDS = {"ids": "int64", "lp": "float32", "ranks": "int64"}
LABELS = {f: f"s.{f}" for f in FIELDS}


def _sources(rows=2, cols=3, step=1):
    return {"ids": paddle.arange(rows * cols, dtype="int64").reshape([rows, cols]) * step,
            "lp": paddle.full([rows, cols], 0.5 * step, dtype="float32"),
            "ranks": paddle.arange(rows, dtype="int64") + step}


def _ring(backend, rows=2, cols=3, slots=2):
    return PinnedRing(backend, "r", FIELDS, {"ids": rows * cols, "lp": rows * cols, "ranks": rows}, slots=slots)


@BACKENDS
def test_fill_hands_out_a_free_slot_with_the_copies_and_the_event_covering_them(make):
    backend = make()
    ring, src = _ring(backend), _sources()
    with collecting() as census:
        slot, event = ring.fill("w", src, LABELS, "s")
    assert slot is ring.slots[0] and event.label == "s" and all(backend.event_of(b) is event for b in slot.buffers.values())
    assert [e for e in census._current.events if e[0] == "async_d2h"] == [("async_d2h", f"s.{f}") for f in FIELDS]
    if isinstance(backend, SimulatedBackend):
        for field in FIELDS:
            with pytest.raises(PendingCopyError, match=rf"before the copy 's.{field}'"):
                backend.read(slot.buffers[field], "early")
    backend.wait(event, "reader")
    for field, t in src.items():
        assert backend.read(slot.buffers[field], "reader").tolist() == t.numpy().tolist()
    held = slot.buffers["lp"]  # a consumer holds slot 0: the next step gets slot 1
    second, _ = ring.fill("w", _sources(step=2), LABELS, "s")
    assert second is ring.slots[1] and ring.grow_events == 0
    del held


def test_the_simulator_catches_a_reuse_policy_bug_through_fill():
    backend = SimulatedBackend()
    ring = _ring(backend)
    slot, event = ring.fill("w", _sources(), LABELS, "s")
    held = slot.buffers["ids"]
    ring._select = lambda: slot  # the bug: the referenced slot is chosen again
    ring._free_next = lambda: None  # (the common step declines: the policy chooses)
    with pytest.raises(BufferInUseError, match="still referenced"):
        ring.fill("w", _sources(step=2), LABELS, "s")
    del held


@BACKENDS
def test_a_bad_source_issues_nothing(make):
    backend = make()
    ring = _ring(backend)
    bad = {**_sources(), "ranks": paddle.arange(2, dtype="int32")}  # the last copy's dtype is wrong
    with pytest.raises(ValueError, match="dtype"):
        ring.fill("w", bad, LABELS, "s")
    assert all(backend.event_of(b) is None for s in ring.slots for b in s.buffers.values())


@BACKENDS
def test_capacity_is_checked_again_whenever_the_shapes_change(make):
    """A slot remembers the shapes it last served (they fit): the same shapes skip the check, a
    larger step grows the slot, and a smaller one after it is served from the grown buffers."""
    backend = make()
    ring = _ring(backend, slots=1)
    for step, (rows, cols) in enumerate(((2, 3), (2, 3), (4, 5), (1, 2), (4, 5)), start=1):
        src = _sources(rows, cols, step)
        slot, event = ring.fill("w", src, LABELS, "s")
        backend.wait(event, "reader")
        for field, t in src.items():
            assert backend.read(slot.buffers[field], "reader").tolist() == t.numpy().tolist()
        del slot
    assert ring.slots[0].capacity == {"ids": 20, "lp": 20, "ranks": 4}


@BACKENDS
def test_a_fill_whose_sources_fit_the_next_free_slot_is_issued_there_without_a_slot_choice(make, monkeypatch):
    """The common step: the ring's next slot is free and its buffers hold the sources (also at a
    smaller batch): no slot choice (``_acquire``). A step too large for them goes to the choice,
    which grows the slot; nothing was issued into the small buffers first."""
    backend = make()
    ring, chosen, acquire = _ring(backend), [], PinnedRing._acquire
    monkeypatch.setattr(PinnedRing, "_acquire", lambda self, writer, shapes, reserve: chosen.append(shapes)
                        or acquire(self, writer, shapes, reserve))
    for step, (rows, cols) in enumerate(((2, 3), (2, 3), (1, 3), (2, 2), (3, 4)), start=1):
        src = _sources(rows, cols, step)
        slot, event = ring.fill("w", src, LABELS, "s")
        assert slot is ring.slots[(step - 1) % 2]  # (the next slot in ring order, every step)
        backend.wait(event, "reader")
        for field, t in src.items():
            assert backend.read(slot.buffers[field], "reader").tolist() == t.numpy().tolist()
        del slot
    assert chosen == [{"ids": (3, 4), "lp": (3, 4), "ranks": (3,)}] and ring.grow_events == 0
    assert ring.slots[0].capacity == {"ids": 12, "lp": 12, "ranks": 3}


class CountingGlue(GpuLikeGlue):
    """Counts every accessor call per tensor; ``facts`` composes them (so it counts them too)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def facts(self, t):
        self.calls[id(t), "facts"] += 1
        return composed_facts(self, t)


for _name in FACTS:
    def _counted(self, t, _name=_name):
        self.calls[id(t), _name] += 1
        return getattr(GpuLikeGlue, _name)(self, t)
    setattr(CountingGlue, _name, _counted)


def test_fill_reads_each_sources_facts_once_and_issues_one_copy_per_source():
    glue = CountingGlue()
    backend = RuntimeBackend(RecordingRuntime(), glue=glue, probe=False)
    ring = _ring(backend)
    for step in range(3):
        src = _sources(step=step + 1)
        glue.calls.clear()
        slot, event = ring.fill("w", src, LABELS, "s")
        for t in src.values():
            assert {name: glue.calls[id(t), name] for name in ("facts", *FACTS)} == dict.fromkeys(("facts", *FACTS), 1)
        copies = [e for e in backend.rt.log if e[0] == "memcpy"][-3:]
        assert [c[2] for c in copies] == [glue.address(t) for t in src.values()] and {c[4] for c in copies} == {STREAM}
        assert backend.rt.log[-1] == ("record", event.native[0], STREAM)
        del slot


def test_a_glue_overriding_an_accessor_gets_facts_composed_from_its_accessors():
    class Shifted(PaddleGlue):
        def address(self, t):
            return super().address(t) + 8

    t = paddle.arange(4, dtype="int64")
    assert PaddleGlue().facts(t) == composed_facts(PaddleGlue(), t)  # the one-call version agrees
    assert Shifted().facts(t)[1] == PaddleGlue().address(t) + 8 and Shifted.facts is composed_facts
    assert CpuAsGpuGlue().facts(t)[0] == 0  # the probe tests' glue: its gpu_device, not Paddle's place


def test_the_probe_fails_a_facts_that_disagrees_with_the_accessors():
    class WrongFacts(CpuAsGpuGlue):
        def facts(self, t):
            device, address, shape, dtype, contiguous = composed_facts(self, t)
            return device, address + 8, shape, dtype, contiguous

    result = run(WrongFacts())
    assert not result["ok"] and "data_ptr" in failed(result) and "facts() answers" in result["reason"]


@BACKENDS
def test_a_caller_reusing_its_shapes_dict_still_grows_the_slot(make):
    """``served`` is the ring's own copy: a caller that mutates the dict (or its lists) it passed
    last time is not mistaken for the same shapes."""
    backend = make()
    ring = PinnedRing(backend, "r", {"x": "int64"}, {"x": 4}, slots=1)
    shapes = {"x": [4]}
    ring.acquire("w", shapes)
    shapes["x"][0] = 9  # the same dict and list, now larger
    slot = ring.acquire("w", shapes)
    assert slot.capacity["x"] >= 9
    backend.copy_d2h(slot.buffers["x"], paddle.arange(9, dtype="int64"), "w")  # fits: no "do not fit"
