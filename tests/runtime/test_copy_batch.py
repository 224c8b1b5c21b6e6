"""``fdac_d2h_batch`` (custom_ops/copy_batch.cc, issue 24): a step's copies and its event record in
one ctypes call. On CPU it runs compiled with g++ against ``custom_ops/fake_cudart.cc``, the
simulator's stand-in for libcudart (copies that land at a wait, a call log, planted failures), so the real
``CudaRuntime`` ctypes layer, the real C loop and ``RuntimeBackend``'s batched path are exercised
end to end; only the CUDA runtime itself is replaced."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.runtime import PinnedRing
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend, attach_batch
from fd_async_copy_plugin.runtime.cudart import CopySet, CudaError, CudaRuntime, D2HBatch

from test_cuda_layer import STREAM, GpuLikeGlue

HERE = Path(__file__).resolve().parent
CUSTOM_OPS = HERE.parents[1] / "custom_ops"
FIELDS = {"ids": "int64", "lp": "float32", "ranks": "int64"}
LABELS = {f: f"s.{f}" for f in FIELDS}


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """(the fake libcudart, the batch helper built alone) - compiled for this module."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not found")
    out = tmp_path_factory.mktemp("copybatch")
    fake, batch = out / "libfakecudart.so", out / "libcopybatch.so"
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(fake), str(CUSTOM_OPS / "fake_cudart.cc")], check=True)
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", str(batch), str(CUSTOM_OPS / "copy_batch.cc")], check=True)
    return str(fake), str(batch)


class Fake:
    """One fresh load of the fake runtime (its log and failure switches are per load)."""

    def __init__(self, path: str, tmp_path: Path) -> None:
        copy = tmp_path / "libfakecudart.so"  # a copy per test: dlopen of one path shares globals
        shutil.copy(path, copy)
        self.lib = ctypes.CDLL(str(copy))
        self.rt = CudaRuntime(lib=self.lib, origin="fake")

    def var(self, name: str) -> ctypes.c_int:
        return ctypes.c_int.in_dll(self.lib, name)

    def log(self) -> list[tuple]:
        size = self.var("fake_log_size").value
        entries = (ctypes.c_uint64 * 5 * 256).in_dll(self.lib, "fake_log")  # {int kind; 4 x uintptr_t}
        raw = np.frombuffer(entries, dtype=np.uint64)[: size * 5].reshape(size, 5)
        kinds = {1: "copy", 2: "record", 3: "batch"}
        return [(kinds[int(k) & 0xFFFFFFFF], int(a), int(b), int(c), int(s)) for k, a, b, c, s in raw]


@pytest.fixture
def fake(libs, tmp_path):
    return Fake(libs[0], tmp_path)


def issue(batch, dst, src, nbytes, stream, event, capacity=None):
    """The C call on one copy set of these addresses (a ``CopySet`` described for them)."""
    CopySet(batch, list(dst), list(capacity or nbytes)).issue(list(src), list(nbytes), stream, event)


def _sources(rows=2, cols=3, step=1):
    return {"ids": paddle.arange(rows * cols, dtype="int64").reshape([rows, cols]) * step,
            "lp": paddle.full([rows, cols], 0.25 * step, dtype="float32"),
            "ranks": paddle.arange(rows, dtype="int64") + step}


def _backend(fake, batch_path=None):
    if batch_path is not None:
        fake.rt.use_batch(ctypes.CDLL(batch_path))
    return RuntimeBackend(fake.rt, glue=GpuLikeGlue(), probe=False)


def test_the_batch_issues_each_copy_in_order_then_the_record_through_the_given_runtime(fake, libs):
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    src = [np.arange(n, dtype=np.int64) for n in (4, 0, 3)]
    dst = [np.zeros(max(1, n), dtype=np.int64) for n in (4, 0, 3)]
    copies = [(d.ctypes.data, s.ctypes.data, s.nbytes) for d, s in zip(dst, src)]
    issue(fake.rt.batch, *zip(*copies), STREAM, 42)
    assert fake.log() == [("copy", *copies[0], STREAM), ("copy", *copies[2], STREAM), ("record", 42, 0, 0, STREAM)]
    fake.rt.event_synchronize(42)  # (the fake's copies land at a wait)
    assert dst[0].tolist() == [0, 1, 2, 3] and dst[2].tolist() == [0, 1, 2]  # (the zero-byte copy skipped)
    issue(fake.rt.batch, *zip(*copies[:1]), STREAM, None)  # no event: no record
    assert [e[0] for e in fake.log()[3:]] == ["copy"]


def test_the_call_checks_every_capacity_before_it_issues_anything(fake, libs):
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    a, b = np.arange(4, dtype=np.int64), np.zeros(4, dtype=np.int64)
    with pytest.raises(ValueError, match="copy 1 of 32 bytes does not fit its destination's 16"):
        issue(fake.rt.batch, [b.ctypes.data] * 2, [a.ctypes.data] * 2, [32, 32], STREAM, 7, [32, 16])
    assert fake.log() == []  # nothing issued, no record


def test_a_failing_copy_stops_the_batch_and_raises_naming_the_call(fake, libs):
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    a, b = np.arange(4, dtype=np.int64), np.zeros(4, dtype=np.int64)
    fake.var("fake_fail_copy").value = 1  # the second copy fails
    with pytest.raises(CudaError, match="cudaMemcpyAsync failed: fake error") as failure:
        issue(fake.rt.batch, [b.ctypes.data] * 3, [a.ctypes.data] * 3, [32] * 3, STREAM, 7)
    assert failure.value.code == 700 and [e[0] for e in fake.log()] == ["copy"]  # nothing after it
    fake.var("fake_fail_copy").value = -1
    fake.var("fake_fail_record").value = 1
    with pytest.raises(CudaError, match="cudaEventRecord failed"):
        issue(fake.rt.batch, [b.ctypes.data], [a.ctypes.data], [32], STREAM, 7)


@pytest.mark.parametrize("batched", [False, True], ids=["per-copy", "batch"])
def test_fill_through_the_real_ctypes_layer_lands_the_data_with_one_event(fake, libs, batched, monkeypatch):
    backend = _backend(fake, libs[1] if batched else None)
    ring = PinnedRing(backend, "r", FIELDS, {"ids": 6, "lp": 6, "ranks": 2}, slots=2)
    if batched:  # the step's per-call bindings must not run: the C loop made the calls
        for name in ("memcpy_d2h_async", "event_record"):
            monkeypatch.setattr(fake.rt, name, lambda *args: pytest.fail("a per-copy ctypes call"))
    for step in range(1, 4):
        src = _sources(step=step)
        start = len(fake.log())
        slot, event = ring.fill("w", src, LABELS, "s")
        log = fake.log()[start:]
        assert [e[0] for e in log] == ["copy"] * 3 + ["record"] and event.native == (log[-1][1],)
        assert all(e[-1] == STREAM for e in log) and all(backend.event_of(b) is event for b in slot.buffers.values())
        assert [e[2] for e in log[:3]] == [t.data_ptr() for t in src.values()]
        backend.wait(event, "reader")
        for field, t in src.items():
            assert backend.read(slot.buffers[field], "reader").tolist() == t.numpy().tolist()
        del slot


def test_a_sets_event_is_recorded_on_its_own_stream_only_also_with_another_stream_known(fake, libs):
    """The event a copy set records covers that set: with a second stream known (another set
    copied there), a fill still is one C call - its copies and one record on its stream."""
    backend = _backend(fake, libs[1])
    other = backend.new_pinned([1], "int64", "other")
    backend.glue.stream = lambda device: 0xB0B
    backend.copy_d2h_many([(other, paddle.arange(1, dtype="int64"), "other")], None)
    backend.glue.stream = lambda device: STREAM
    ring = PinnedRing(backend, "r", FIELDS, {"ids": 6, "lp": 6, "ranks": 2}, slots=1)
    start = len(fake.log())
    slot, event = ring.fill("w", _sources(), LABELS, "s")
    log = fake.log()[start:]
    assert [e[0] for e in log] == ["copy"] * 3 + ["record"]
    assert {e[-1] for e in log} == {STREAM} and len(event.native) == 1
    assert len(backend.record("both").native) == 2  # ``record`` covers every stream


def test_copies_on_two_streams_in_one_set_are_one_call_and_one_record_per_stream(fake, libs):
    srcs = [paddle.arange(4, dtype="int64") for _ in range(2)]
    devices = {id(t): device for device, t in enumerate(srcs)}  # the sources on gpu:0 and gpu:1

    class TwoDevices(GpuLikeGlue):
        def gpu_device(self, t):
            return devices.get(id(t))

        def stream(self, device):
            return (STREAM, 0xB0B)[device]

    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    backend = RuntimeBackend(fake.rt, glue=TwoDevices(), probe=False)
    bufs = [backend.new_pinned([4], "int64", f"b{i}") for i in range(2)]
    event = backend.copy_d2h_many([(b, t, f"c{i}") for i, (b, t) in enumerate(zip(bufs, srcs))], "s")
    assert [(e[0], e[-1]) for e in fake.log()] == [("copy", STREAM), ("record", STREAM), ("copy", 0xB0B),
                                                   ("record", 0xB0B)]
    assert len(event.native) == 2


def test_the_process_runtime_takes_the_batch_from_the_built_custom_ops(fake, monkeypatch, tmp_path):
    """``attach_batch`` (what ``CudaBackend`` does with the process's runtime): from the built
    custom-ops module when it is current, else one ctypes call per copy, with the reason."""
    monkeypatch.setenv("FD_ASYNC_COPY_OPS_DIR", str(tmp_path / "empty"))
    why = attach_batch(fake.rt)
    assert fake.rt.batch is None and why.startswith("one ctypes call per copy") and "not built" in why
    monkeypatch.delenv("FD_ASYNC_COPY_OPS_DIR")
    from fd_async_copy_plugin.ops import cache

    if cache.staleness(cache.ops_dir() / cache.PYBIND_FILE, cache.pybind_fingerprint()) is not None:
        pytest.skip("the custom ops are not built (`fd-async-copy build-ops`)")
    assert attach_batch(fake.rt).startswith("fdac_d2h_batch from ") and isinstance(fake.rt.batch, D2HBatch)
    backend = RuntimeBackend(fake.rt, glue=GpuLikeGlue(), probe=False)
    ring = PinnedRing(backend, "r", FIELDS, {"ids": 6, "lp": 6, "ranks": 2}, slots=1)
    slot, event = ring.fill("w", _sources(), LABELS, "s")
    backend.wait(event, "reader")
    assert backend.read(slot.buffers["lp"], "reader").tolist() == [[0.25] * 3] * 2
    assert [e[0] for e in fake.log()] == ["copy"] * 3 + ["record"]


def test_a_lone_copy_is_one_c_call_with_its_event(fake, libs, monkeypatch):
    """A copy set of one is issued like any other: one C call, its copy and its own event."""
    backend = _backend(fake, libs[1])
    buf = backend.new_pinned([4], "int64", "b")
    batched = []
    issue = CopySet.issue
    monkeypatch.setattr(CopySet, "issue", lambda self, *args: batched.append(self.count) or issue(self, *args))
    lone = backend.copy_d2h(buf, paddle.arange(4, dtype="int64"), "lone")
    backend.copy_d2h_many([(buf, paddle.arange(4, dtype="int64"), "with-event")], "s")
    assert batched == [1, 1] and [e[0] for e in fake.log()] == ["copy", "record", "copy", "record"]
    assert lone.label == "lone" and backend.event_of(buf) is not lone
