"""The framework-neutral CUDA layer and the cuda backend's logic, on CPU.

The ``cuda`` backend is ``RuntimeBackend`` on ``CudaRuntime``; here the same class runs on a
recording ``HostRuntime`` (host addresses, memmove copies, events that complete only when waited
on) with CPU Paddle tensors presented as GPU tensors by a glue subclass. That exercises every line
the H200 runs except the ctypes calls themselves (benchmarks/cuda_layer_check.py covers those).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.runtime import HostBackend, PinnedRing, SimulatedBackend
from fd_async_copy_plugin.runtime.backend import AsyncCopyError, host_view
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend
from fd_async_copy_plugin.runtime.cudart import CudaError, CudaRuntime, CudaUnavailable, HostRuntime
from fd_async_copy_plugin.runtime.glue import PaddleGlue

STREAM = 0x5EED


class RecordingRuntime(HostRuntime):
    """HostRuntime that logs every call; events complete only when synchronized (so a host read
    or a free that skipped its wait is visible in the log)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple] = []
        self.current = 0

    def get_device(self):
        return self.current

    def set_device(self, device):
        self.log.append(("set_device", device))
        self.current = device

    def host_alloc(self, nbytes):
        ptr = super().host_alloc(nbytes)
        self.log.append(("host_alloc", ptr, nbytes))
        return ptr

    def host_free(self, ptr):
        self.log.append(("host_free", ptr))
        super().host_free(ptr)

    def memcpy_d2h_async(self, dst, src, nbytes, stream):
        self.log.append(("memcpy", dst, src, nbytes, stream))
        super().memcpy_d2h_async(dst, src, nbytes, stream)

    def event_record(self, event, stream):
        self.log.append(("record", event, stream))

    def event_synchronize(self, event):
        self.log.append(("sync", event))

    def stream_synchronize(self, stream):
        self.log.append(("stream_sync", stream))

    def device_synchronize(self):
        self.log.append(("device_sync",))

    def kinds(self):
        return [entry[0] for entry in self.log]


class GpuLikeGlue(PaddleGlue):
    """CPU Paddle tensors presented as tensors of gpu:0 with a fixed stream (accessors only)."""

    def gpu_device(self, t):
        return 0

    def current_device(self):
        return 0

    def stream(self, device):
        return STREAM


def gpu_backend(probe=False):
    rt = RecordingRuntime()
    return RuntimeBackend(rt, glue=GpuLikeGlue(), probe=probe), rt


def test_the_layer_and_the_backends_import_without_paddle():
    code = (
        "import sys\n"
        "import fd_async_copy_plugin.runtime as r, fd_async_copy_plugin.runtime.cudart, "
        "fd_async_copy_plugin.runtime.cuda, fd_async_copy_plugin.runtime.probe, fd_async_copy_plugin.runtime.glue, "
        "fd_async_copy_plugin.ops.stop_flag_library\n"
        "assert 'paddle' not in sys.modules, 'paddle was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cuda_runtime_reports_errors_with_their_message():
    try:
        rt = CudaRuntime()
    except CudaUnavailable as exc:
        pytest.skip(f"no libcudart here: {exc}")
    try:
        count = rt.device_count()
    except CudaError as exc:  # no driver / no GPU on this machine
        assert exc.call == "cudaGetDeviceCount" and exc.code != 0 and "cudaError" in str(exc)
    else:
        assert count >= 0


def test_pinned_buffer_is_a_zero_copy_host_tensor_that_owns_its_memory():
    backend, rt = gpu_backend()
    buf = backend.new_pinned([8], "int64", "b")
    memory = backend.memory_of(buf)
    assert backend.glue.address(buf) == memory.ptr and buf.place.is_cpu_place()
    host_view(buf)[:] = np.arange(8)
    assert buf.numpy().tolist() == list(range(8))  # Paddle reads the same memory
    del memory
    gc.collect()
    backend.release_freed()  # released by plugin code, never in Paddle's free path
    assert "host_free" not in rt.kinds()  # the tensor keeps its memory alive
    del buf
    gc.collect()
    backend.release_freed()  # released by plugin code, never in Paddle's free path
    assert rt.kinds().count("host_free") == 1


def test_copy_goes_by_address_on_the_framework_stream_and_fits_the_shape():
    backend, rt = gpu_backend()
    buf = backend.new_pinned([16], "int64", "b")
    src = paddle.arange(6, dtype="int64").reshape([3, 2])
    event = backend.copy_d2h(buf, src, "copy")  # a copy set of one, with its own event
    memcpy = [e for e in rt.log if e[0] == "memcpy"]
    assert memcpy == [("memcpy", backend.memory_of(buf).ptr, src.data_ptr(), 48, STREAM)]
    assert list(buf.shape) == [3, 2] and backend.glue.address(buf) == backend.memory_of(buf).ptr
    assert rt.log[-1] == ("record", event.native[0], STREAM) and backend.event_of(buf) is event
    out = backend.to_host(buf, "reader")
    assert ("sync", event.native[0]) in rt.log
    assert out.numpy().tolist() == [[0, 1], [2, 3], [4, 5]]


def test_copy_refuses_what_does_not_fit_or_differs_in_dtype():
    backend, _ = gpu_backend()
    buf = backend.new_pinned([4], "int64", "b")
    with pytest.raises(ValueError, match="do not fit"):
        backend.copy_d2h(buf, paddle.arange(5, dtype="int64"), "big")
    with pytest.raises(ValueError, match="dtype"):
        backend.copy_d2h(buf, paddle.arange(4, dtype="int32"), "dtype")
    with pytest.raises(ValueError, match="contiguous"):
        backend.copy_d2h(buf, paddle.arange(8, dtype="int64").reshape([2, 4])[:, 1:3], "strided")


def test_release_of_a_buffer_with_a_copy_in_flight_waits_for_it_first():
    backend, rt = gpu_backend()
    buf = backend.new_pinned([4], "int64", "b")
    backend.copy_d2h(buf, paddle.arange(4, dtype="int64"), "copy")
    ptr = backend.memory_of(buf).ptr
    backend.free_pinned(buf, "b")
    del buf
    gc.collect()
    backend.release_freed()  # released by plugin code, never in Paddle's free path
    tail = rt.log[rt.kinds().index("memcpy"):]
    kinds = [e[0] for e in tail]
    # the copy set's own event (recorded on the copy's stream) waited on, then the free
    assert kinds == ["memcpy", "record", "sync", "host_free"]
    assert tail[1][2] == STREAM and tail[2] == ("sync", tail[1][1]) and tail[-1] == ("host_free", ptr)


def test_release_on_a_thread_whose_device_differs_waits_on_the_copy_event_without_switching():
    backend, rt = gpu_backend()
    buf = backend.new_pinned([4], "int64", "b")
    backend.copy_d2h(buf, paddle.arange(4, dtype="int64"), "copy")
    rt.current = 1  # the last reference goes on a thread whose current device is gpu:1
    del buf
    gc.collect()
    backend.release_freed()  # released by plugin code, never in Paddle's free path
    tail = [e for e in rt.log[rt.kinds().index("memcpy") + 1:]]
    assert [e[0] for e in tail] == ["record", "sync", "host_free"]  # an event needs no current device
    assert tail[1] == ("sync", tail[0][1])


def test_a_buffer_reallocated_by_a_framework_op_is_refused():
    backend, _ = gpu_backend()
    buf = backend.new_pinned([2], "int64", "b")
    ptr = backend.memory_of(buf).ptr
    buf.copy_(paddle.arange(64, dtype="int64"), True)  # Paddle reallocates: the wrap left its memory
    assert buf.data_ptr() != ptr
    with pytest.raises(AsyncCopyError, match="no longer points at its memory"):
        backend.copy_d2h(buf, paddle.arange(2, dtype="int64"), "w")


def test_release_after_the_copy_was_waited_on_frees_at_once():
    backend, rt = gpu_backend()
    buf = backend.new_pinned([4], "int64", "b")
    backend.copy_d2h(buf, paddle.arange(4, dtype="int64"), "copy")
    backend.wait(backend.record("r"), "reader")
    before = len(rt.log)
    del buf
    gc.collect()
    backend.release_freed()  # released by plugin code, never in Paddle's free path
    assert [e[0] for e in rt.log[before:]] == ["host_free"]


def test_ring_growth_frees_the_old_buffer_only_after_its_copy():
    backend, rt = gpu_backend()
    ring = PinnedRing(backend, "r", {"x": "float32"}, {"x": 4}, slots=1)
    slot = ring.acquire("w", {"x": [4]})
    backend.copy_d2h(slot.buffers["x"], paddle.ones([4], dtype="float32"), "w")
    old_ptr = backend.memory_of(slot.buffers["x"]).ptr
    slot = ring.acquire("w", {"x": [8]})  # grows: the old buffer goes, its copy still in flight
    gc.collect()
    backend.release_freed()  # released by plugin code, never in Paddle's free path
    free = rt.log.index(("host_free", old_ptr))
    copy_event = next(e for e in rt.log if e[0] == "record")  # the copy set's own event
    assert rt.log[free - 1] == ("sync", copy_event[1])


def test_held_slot_is_not_reused_with_wrapped_buffers():
    backend, _ = gpu_backend()
    ring = PinnedRing(backend, "r", {"x": "int64"}, {"x": 4}, slots=2)
    held = []
    for step in range(5):
        slot = ring.acquire("w", {"x": [4]})
        backend.copy_d2h(slot.buffers["x"], paddle.full([4], step, dtype="int64"), "w")
        backend.record("w")
        held.append(slot.buffers["x"])  # a consumer lagging by 10 steps keeps everything
    assert ring.size == 5 and ring.grow_events == 3
    assert [int(backend.to_host(b, "lagging").numpy()[0]) for b in held] == [0, 1, 2, 3, 4]


def test_waits_are_ctypes_calls_that_release_the_gil():
    """The layer binds the runtime with ``ctypes.CDLL`` (no ``PYTHONAPI`` flag: the GIL is released
    around each call). A libc sleep through the same mechanism shows another thread running."""
    import ctypes

    try:
        rt = CudaRuntime()
    except CudaUnavailable:
        rt = None
    if rt is not None:
        for name in ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaFreeHost", "cudaMemcpyAsync"):
            assert not rt._f[name]._flags_ & ctypes._FUNCFLAG_PYTHONAPI, name
    libc = ctypes.CDLL(None)
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)

    thread = threading.Thread(target=spin)
    thread.start()
    libc.usleep(200_000)
    during = len(ticks)
    stop.set()
    thread.join()
    assert during > 1000


@pytest.mark.parametrize("make", [HostBackend, SimulatedBackend])
def test_host_and_sim_buffers_are_wrapped_host_memory_of_the_same_contract(make):
    backend = make()
    buf = backend.new_pinned([6], "float32", "b")
    memory = backend.memory_of(buf)
    assert buf.data_ptr() == memory.ptr and memory.nbytes == 24 and buf.place.is_cpu_place()
    backend.copy_d2h(buf, paddle.arange(4, dtype="float32"), "w")
    assert buf.data_ptr() == memory.ptr and list(buf.shape) == [4]
    backend.wait(backend.record("w"), "r")
    assert backend.read(buf, "r").tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="do not fit"):
        backend.copy_d2h(buf, paddle.arange(7, dtype="float32"), "big")


def test_host_backend_copies_by_address():
    backend = HostBackend()
    buf = backend.new_pinned([4], "int64", "b")
    src = paddle.arange(4, dtype="int64")
    backend.copy_d2h(buf, src, "w")
    assert backend.rt.allocations == 1
    assert backend.read(buf, "r").tolist() == [0, 1, 2, 3]
    strided = paddle.arange(8, dtype="int64").reshape([4, 2])[:, 1]
    backend.copy_d2h(buf, strided, "strided")  # not copyable by address: through the framework
    assert backend.read(buf, "r").tolist() == [1, 3, 5, 7]


# Issue 25 item 9: FD_ASYNC_COPY_CUDART names the library, or the reason it cannot be used.
def _not_cuda_library() -> str:
    import ctypes.util

    name = ctypes.util.find_library("m")
    assert name, "libm not found"
    return name


@pytest.mark.parametrize(
    "value, cause",
    [(None, "is not a CUDA runtime library: it lacks cudaHostAlloc"), ("/no/such/dir/libcudart.so.12", "cannot be loaded")],
)
def test_cudart_variable_names_itself_and_the_cause(monkeypatch, value, cause):
    from fd_async_copy_plugin.runtime import cudart

    value = value or _not_cuda_library()
    monkeypatch.setenv(cudart.CUDART_ENV, value)
    with pytest.raises(CudaUnavailable) as info:
        CudaRuntime()
    message = str(info.value)
    assert f"FD_ASYNC_COPY_CUDART={value!r}" in message and cause in message, message


def test_a_bad_cudart_variable_leaves_fastdeploy_unpatched_with_the_reason(monkeypatch):
    """On a (pretended) GPU build, the cuda backend stands down with the variable's cause; nothing raises."""
    import fd_async_copy_plugin
    from fd_async_copy_plugin.runtime import cudart
    from fd_async_copy_plugin.runtime.cuda import cuda_available

    monkeypatch.setenv(cudart.CUDART_ENV, _not_cuda_library())
    monkeypatch.setattr(cudart, "_runtime", None)
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(paddle.device.cuda, "device_count", lambda: 1)
    ok, why = cuda_available()
    assert not ok and "FD_ASYNC_COPY_CUDART=" in why and "not a CUDA runtime library" in why, why
    try:
        status = fd_async_copy_plugin.enable(features="logprobs", backend="cuda",
                                             root="fd_async_copy_plugin.testing.reference.fd24")
        entry = status["features"]["logprobs"]
        assert entry["state"] == "skipped" and "FD_ASYNC_COPY_CUDART=" in entry["reason"], entry
        assert status["backend"] == "none"
    finally:
        fd_async_copy_plugin.disable()


def test_paddle_glue_asks_the_core_stream_call_only_on_a_cuda_build():
    """``PaddleGlue.stream`` calls ``core._get_current_stream`` directly on a GPU build (the probe's
    ``stream_order`` check tests its answer); on the CPU build that call is never made: Paddle's CPU
    build has the function, and CUDA stream calls there crash the process."""
    from fd_async_copy_plugin.runtime.glue import PaddleGlue

    assert hasattr(paddle.base.core, "_get_current_stream") and not paddle.is_compiled_with_cuda()
    assert PaddleGlue()._current_stream is None
