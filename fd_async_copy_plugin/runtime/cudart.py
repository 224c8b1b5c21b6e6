"""The framework-neutral CUDA layer: pinned memory, D2H copies, events - on integers only.

Every call takes integer addresses, byte counts, a ``cudaStream_t`` as an int and device ids; no
tensor type and no framework is imported here (standard library only), so the same code runs under
Paddle (the plugin), PyTorch or CuPy (``benchmarks/cuda_layer_check.py`` on the H200) and the CPU
tests. The stop-flag kernel launches live next door in ``ops/stop_flag_library.py`` (same rules).

Which CUDA runtime: the one the process has already loaded (Paddle, PyTorch and CuPy all load a
shared ``libcudart``), found in ``/proc/self/maps``, else opened by soname
(``libcudart.so.13``/``.12``/``libcudart.so``, already-loaded first), or ``FD_ASYNC_COPY_CUDART``.
Using the framework's own runtime means the same primary context, the same current device of the
thread and streams that are valid here. ``ctypes.CDLL`` releases the GIL around every call, so a
``cudaEventSynchronize`` on one thread does not stop another thread from launching work (Paddle's
``Event.synchronize()`` holds the GIL). Why not NVIDIA's ``cuda-bindings``: docs/architecture.md.

``HostRuntime`` has the same methods over plain host memory (copies land at once, events are
always complete): the ``host`` backend and the CPU tests run the cuda backend's code through it.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from functools import partialmethod

CUDART_ENV = "FD_ASYNC_COPY_CUDART"
SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")

# driver_types.h
_MEMCPY_HOST_TO_DEVICE, _MEMCPY_DEVICE_TO_HOST = 1, 2
HOST_ALLOC_PORTABLE = 0x01
EVENT_BLOCKING_SYNC, EVENT_DISABLE_TIMING = 0x01, 0x02
_NOT_READY = 600
MEMORY_TYPES = {0: "unregistered", 1: "host", 2: "device", 3: "managed"}


class CudaUnavailable(RuntimeError):
    """No usable CUDA runtime in this process (the message says why)."""


class CudaError(RuntimeError):
    """A CUDA runtime call returned an error."""

    def __init__(self, call: str, code: int, message: str) -> None:
        super().__init__(f"{call} failed: {message} (cudaError {code})")
        self.call, self.code = call, code


class _PointerAttributes(ctypes.Structure):
    # CUDA 11-13 layout; ``reserved`` covers the padding CUDA 13 added.
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("devicePointer", ctypes.c_void_p),
                ("hostPointer", ctypes.c_void_p), ("reserved", ctypes.c_long * 8)]


class _Api(ctypes.Structure):
    # ``struct fdac_cuda_api`` (custom_ops/copy_batch.cc)
    _fields_ = [("memcpy_async", ctypes.c_void_p), ("event_record", ctypes.c_void_p),
                ("memcpy_batch", ctypes.c_void_p), ("batch_abi", ctypes.c_int)]


class D2HBatch:
    """The C call that issues a copy set (``fdac_d2h_set_issue``, custom_ops/copy_batch.cc; each
    set is a ``CopySet``) - its capacity check, its D2H copies and its event record - in one ctypes
    call, through the process's own ``cudaMemcpyAsync`` and ``cudaEventRecord`` (``memcpy_async``,
    ``event_record``: their addresses) and, once ``use_batch_api`` turned it on, the copies in one
    ``cudaMemcpyBatchAsync``."""

    MAX = 16  # copies per call

    def __init__(self, lib, memcpy_async: int, event_record: int, fail) -> None:
        self._api = _Api(memcpy_async, event_record, None, 0)
        self._fail, self._api_at = fail, ctypes.addressof(self._api)
        self._set_issue = lib.fdac_d2h_set_issue
        self._set_issue.argtypes, self._set_issue.restype = [ctypes.c_void_p] * 3, ctypes.c_int
        #: ``cudaMemcpyBatchAsync`` of the runtime: (address, ABI) until ``use_batch_api`` decided
        self.batch_api: tuple[int, int] | None = None
        self.batch_api_state = "not offered (a runtime without cudaMemcpyBatchAsync: CUDA < 12.8)"

    def use_batch_api(self, ok: bool, why: str) -> None:
        """Turn the offered ``cudaMemcpyBatchAsync`` on (``ok``) or off for good, saying ``why``."""
        on = ok and self.batch_api is not None
        self._api.memcpy_batch, self._api.batch_abi = (self.batch_api if on else (None, 0))
        self.batch_api_state = f"{'on' if on else 'off'}: {why}"
        if not ok:
            self.batch_api = None


class _SetArgs(ctypes.Structure):
    # ``struct fdac_d2h_set`` (custom_ops/copy_batch.cc)
    _fields_ = [("api", ctypes.c_void_p), ("count", ctypes.c_int), ("dst", ctypes.c_void_p), ("src", ctypes.c_void_p),
                ("nbytes", ctypes.c_void_p), ("capacity", ctypes.c_void_p), ("failed", ctypes.c_int)]


class CopySet:
    """A copy set described once for the C call (``fdac_d2h_set_issue``): its destinations and
    their capacities fixed (up to ``D2HBatch.MAX``); ``issue`` writes the sources (and the sizes,
    when they changed) into its own arrays and passes three arguments. Its owner serialises the
    calls (the backend lock)."""

    __slots__ = ("count", "_dst", "_src", "_nbytes", "_capacity", "_args", "_at", "_batch")

    def __init__(self, batch: D2HBatch, dst: list, capacity: list) -> None:
        count = self.count = len(dst)
        self._dst, self._src = (ctypes.c_void_p * count)(*dst), (ctypes.c_void_p * count)()
        self._nbytes, self._capacity = (ctypes.c_size_t * count)(), (ctypes.c_size_t * count)(*capacity)
        self._args = _SetArgs(batch._api_at, count, *(ctypes.addressof(a) for a in
                                                     (self._dst, self._src, self._nbytes, self._capacity)), -1)
        self._batch, self._at = batch, ctypes.addressof(self._args)

    def issue(self, src: list, nbytes: list | None, stream: int, event: int | None) -> None:
        """Sets the sources ``src`` and, unless None (as the last call's), the sizes ``nbytes``, then
        issues the set on ``stream`` and records ``event`` there (None: none): ``nbytes[i]`` bytes
        from device address ``src[i]`` to the host address ``dst[i]`` (zero bytes: skipped). First
        checks every size against its capacity and issues nothing if one does not fit."""
        self._src[:] = src
        if nbytes is not None:
            self._nbytes[:] = nbytes
        code = self._batch._set_issue(self._at, stream, event)
        if code == -2:
            failed = self._args.failed
            raise ValueError(f"fdac_d2h_batch: copy {failed} of {self._nbytes[failed]} bytes does not fit its "
                             f"destination's {self._capacity[failed]}; nothing was issued")
        if code:  # the call that failed: copy ``failed``'s, or after them the record, or the batch call
            call = {self.count: "cudaEventRecord", self.count + 1: "cudaMemcpyBatchAsync"}.get(self._args.failed)
            self._batch._fail(call or "cudaMemcpyAsync", code)


def loaded_cudart_paths() -> list[str]:
    """Paths of every ``libcudart`` shared object mapped into this process (Linux)."""
    try:  # (a line: address, perms, offset, dev, inode, path)
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "libcudart.so" in os.path.basename(line.rstrip())]
    except OSError:
        return []
    return list(dict.fromkeys(paths))  # (each once, in map order)


def find_cudart() -> tuple[ctypes.CDLL, str]:
    """The process's CUDA runtime library and how it was found; raises ``CudaUnavailable``."""
    tried = []
    if explicit := os.environ.get(CUDART_ENV):
        # Asked for by name: that library or none (a silent fallback would run another runtime).
        try:
            return ctypes.CDLL(explicit, mode=os.RTLD_GLOBAL), f"{explicit} (${CUDART_ENV})"
        except OSError as exc:
            raise CudaUnavailable(f"{CUDART_ENV}={explicit!r} cannot be loaded: {exc}; point it at the "
                                  "libcudart.so that Paddle loads, or unset it") from None
    candidates = [(p, "already loaded (/proc/self/maps)", 0) for p in loaded_cudart_paths()]
    candidates += [(name, "already loaded (RTLD_NOLOAD)", getattr(os, "RTLD_NOLOAD", 0)) for name in SONAMES]
    candidates += [(name, "loaded by soname", 0) for name in SONAMES]
    for name, origin, mode in candidates:
        try:
            return ctypes.CDLL(name, mode=mode | os.RTLD_GLOBAL), f"{name} ({origin})"
        except OSError as exc:
            tried.append(f"{name}: {exc}")
    raise CudaUnavailable("no CUDA runtime library found; tried " + "; ".join(tried[-len(SONAMES):]))


class CudaRuntime:
    """ctypes bindings of the few CUDA runtime calls the plugin needs, raising ``CudaError``. Their
    argtypes are set once: addresses, sizes and handles go in as Python ints (nothing built per call)."""

    def __init__(self, lib: ctypes.CDLL | None = None, origin: str = "") -> None:
        if lib is None:
            lib, origin = find_cudart()
        self.lib, self.origin = lib, origin
        P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        signatures = {
            "cudaHostAlloc": [ctypes.POINTER(P), S, ctypes.c_uint],
            **dict.fromkeys(("cudaFreeHost", "cudaEventQuery", "cudaEventSynchronize", "cudaEventDestroy",
                             "cudaStreamSynchronize"), [P]),  # one pointer or handle
            **dict.fromkeys(("cudaGetDevice", "cudaGetDeviceCount", "cudaRuntimeGetVersion",
                             "cudaDriverGetVersion"), [ctypes.POINTER(I)]),  # an int written
            **dict.fromkeys(("cudaDeviceSynchronize", "cudaGetLastError"), []),
            "cudaMemcpyAsync": [P, P, S, I, P],
            "cudaEventCreateWithFlags": [ctypes.POINTER(P), ctypes.c_uint],
            "cudaEventRecord": [P, P],
            "cudaSetDevice": [I],
            "cudaPointerGetAttributes": [ctypes.POINTER(_PointerAttributes), P]}
        if missing := [name for name in (*signatures, "cudaGetErrorString") if not hasattr(lib, name)]:
            what = f"{CUDART_ENV}={lib._name!r}" if CUDART_ENV in origin else (origin or lib._name)
            lacks = ", ".join(missing[:3]) + (" and more" if len(missing) > 3 else "")
            raise CudaUnavailable(f"{what} is not a CUDA runtime library: it lacks {lacks}; point "
                                  f"{CUDART_ENV} at libcudart.so, or unset it")
        self._f = {}
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, I
            self._f[name] = fn
        self._error_string = lib.cudaGetErrorString
        self._error_string.argtypes, self._error_string.restype = [I], ctypes.c_char_p

    name = "cuda"
    batch: D2HBatch | None = None  # the custom ops' C call, once ``use_batch`` found it

    def use_batch(self, lib: ctypes.CDLL) -> None:
        """Issue batches of copies through ``lib``'s ``fdac_d2h_batch`` (the custom-ops module), offering
        it this runtime's ``cudaMemcpyBatchAsync`` where there is one (CUDA 12.8 and later)."""
        address = [ctypes.cast(self._f[name], ctypes.c_void_p).value for name in ("cudaMemcpyAsync", "cudaEventRecord")]
        self.batch = D2HBatch(lib, *address, self._fail)
        version = self.versions()["runtime"]
        if version >= 12080 and hasattr(self.lib, "cudaMemcpyBatchAsync"):
            # Offered (``abi``: 13, or 12 for CUDA 12.8-12.9's signature), unused until a check of it
            # on a GPU passes (``D2HBatch.use_batch_api``; the accessor probe checks).
            abi = 13 if version >= 13000 else 12
            self.batch.batch_api = (ctypes.cast(self.lib.cudaMemcpyBatchAsync, ctypes.c_void_p).value, abi)
            self.batch.batch_api_state = f"offered (CUDA {abi}), not checked yet"

    def _call(self, name: str, *args) -> int:
        code = self._f[name](*args)
        if code != 0 and not (code == _NOT_READY and name == "cudaEventQuery"):
            self._fail(name, code)
        return code

    def _fail(self, name: str, code: int):
        # Clear the sticky "last error" of a non-sticky failure so later calls are not blamed.
        self._f["cudaGetLastError"]()
        raise CudaError(name, code, self._error_string(code).decode(errors="replace"))

    def _out(self, name: str, ctype, *args):
        """Call ``name`` with a pointer to a fresh ``ctype`` first and return the value it wrote."""
        value = ctype()
        self._call(name, ctypes.byref(value), *args)
        return value.value

    # -- device -----------------------------------------------------------------------------------
    def device_count(self) -> int:
        return self._out("cudaGetDeviceCount", ctypes.c_int)

    def get_device(self) -> int:
        return self._out("cudaGetDevice", ctypes.c_int)

    def set_device(self, device: int) -> None:
        self._call("cudaSetDevice", int(device))

    def versions(self) -> dict:
        return {"runtime": self._out("cudaRuntimeGetVersion", ctypes.c_int),
                "driver": self._out("cudaDriverGetVersion", ctypes.c_int), "library": self.origin}

    def pointer_info(self, ptr: int) -> tuple[str, int]:
        """(memory type, device) of an address: ``("device", 0)`` for a GPU allocation on gpu:0."""
        attrs = _PointerAttributes()
        self._call("cudaPointerGetAttributes", ctypes.byref(attrs), ptr)
        return MEMORY_TYPES.get(attrs.type, str(attrs.type)), attrs.device

    # -- pinned host memory -----------------------------------------------------------------------
    def host_alloc(self, nbytes: int) -> int:
        return self._out("cudaHostAlloc", ctypes.c_void_p, max(1, int(nbytes)), HOST_ALLOC_PORTABLE)

    host_free = partialmethod(_call, "cudaFreeHost")

    # -- copies -----------------------------------------------------------------------------------
    # The calls of every decode step (copies, records, waits) skip ``_call``: one Python frame each.
    def memcpy_d2h_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        if code := self._f["cudaMemcpyAsync"](dst, src, nbytes, _MEMCPY_DEVICE_TO_HOST, stream):
            self._fail("cudaMemcpyAsync", code)

    def memcpy_h2d_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._call("cudaMemcpyAsync", dst, src, nbytes, _MEMCPY_HOST_TO_DEVICE, stream)

    # -- events and streams -----------------------------------------------------------------------
    def event_create(self, blocking: bool = False) -> int:
        """A timing-free event; waits spin or yield as FD's own events do (``blocking``: sleep, slower)."""
        flags = EVENT_DISABLE_TIMING | (EVENT_BLOCKING_SYNC if blocking else 0)
        return self._out("cudaEventCreateWithFlags", ctypes.c_void_p, flags)

    def event_record(self, event: int, stream: int) -> None:
        if code := self._f["cudaEventRecord"](event, stream):
            self._fail("cudaEventRecord", code)

    def event_query(self, event: int) -> bool:
        return self._call("cudaEventQuery", event) == 0

    def event_synchronize(self, event: int) -> None:
        """Blocks this thread only (the GIL is released for the call)."""
        if code := self._f["cudaEventSynchronize"](event):
            self._fail("cudaEventSynchronize", code)

    event_destroy = partialmethod(_call, "cudaEventDestroy")
    stream_synchronize = partialmethod(_call, "cudaStreamSynchronize")
    device_synchronize = partialmethod(_call, "cudaDeviceSynchronize")


class HostRuntime:
    """``CudaRuntime``'s contract over host memory: "device" addresses are host addresses, copies
    are ``memmove`` and land at once, events are always complete. The ``host`` backend and the CPU
    tests of the cuda backend's logic (and of the accessor probe) run through it."""

    name = "host"
    origin = "host memory (no CUDA)"
    batch = None  # copies are memmoves: nothing to batch

    def host_stream(self) -> int:
        """The stream of copies whose "device" is host memory (``HostBackend``): none."""
        return 0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[int, ctypes.Array] = {}
        self._event_ids = itertools.count(1)
        self.allocations = self.frees = 0

    def get_device(self) -> int:
        return 0

    def pointer_info(self, ptr: int) -> tuple[str, int]:
        return "host", -1

    def host_alloc(self, nbytes: int) -> int:
        block = (ctypes.c_byte * max(1, int(nbytes)))()
        ptr = ctypes.addressof(block)
        with self._lock:
            self._blocks[ptr] = block
            self.allocations += 1
        return ptr

    def host_free(self, ptr: int) -> None:
        with self._lock:
            if self._blocks.pop(ptr, None) is None:
                raise CudaError("cudaFreeHost", 1, f"{ptr:#x} was not allocated by host_alloc")
            self.frees += 1

    def memcpy_d2h_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        ctypes.memmove(dst, src, int(nbytes))

    memcpy_h2d_async = memcpy_d2h_async

    def event_create(self, blocking: bool = False) -> int:
        return next(self._event_ids)  # (atomic under the GIL)

    def _nothing(self, *args) -> None:
        """A record, wait, destroy or synchronize: host copies have landed when they return."""

    event_record = event_synchronize = event_destroy = stream_synchronize = device_synchronize = _nothing

    def event_query(self, event: int) -> bool:
        return True


_runtime_lock = threading.Lock()
_runtime: CudaRuntime | None = None


def runtime() -> CudaRuntime:
    """The process's ``CudaRuntime`` (created once); raises ``CudaUnavailable``."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = CudaRuntime()
        return _runtime
