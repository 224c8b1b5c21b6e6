"""Backend ``sim``: the production copy path over a race-detecting fake CUDA runtime.

``sim`` is not a model of the backend: it is ``RuntimeBackend`` - the ctypes layer
(``CudaRuntime``), the C call that issues a copy set (``fdac_d2h_batch``, with its
``cudaMemcpyBatchAsync`` branch on), the rings, the events - run over ``custom_ops/fake_cudart.cc``,
a stand-in for ``libcudart`` compiled here with g++ on first use (with ``copy_batch.cc``, into the
custom ops' cache folder). Only the CUDA runtime is replaced. On the CPU build of Paddle every copy
is otherwise synchronous, so an ordering bug could never show; the fake makes it loud:

- a D2H copy does not land when issued: its destination holds poison (a bool inverted, a float NaN,
  an integer -7777) until a wait covers it (the event of its copy set, a later event on its stream,
  a stream or device synchronize) - or, when a test asks for it (``run_ahead``), at a random later
  call, as a device that ran ahead;
- a host read through the backend's one read accessor (``CopyBackend.read``) of a buffer a pending
  copy still writes raises ``PendingCopyError`` naming the buffer, the writer and the reader; code
  that bypasses it (FastDeploy's own ``.numpy()``) sees the poison: the outputs differ;
- a copy into a buffer a pending copy on another stream still writes (no wait between them), and a
  free of memory a copy still writes, raise ``BufferInUseError``;
- a ring that picks a slot its reader still references raises ``BufferInUseError`` naming the
  referrers (reference counts are Python's; the ring reports it, ``ring.py``).

Every race the fake saw is counted (``errors()``), also where a caller swallowed the exception (the
free path logs and goes on). ``switch_streams(True)``: the current stream alternates between two
streams from one call to the next; ``use_stream(i)``: the current stream is stream ``i`` until
changed (a test moves FastDeploy to the next stream at every step: FD 2.5 changes it under a stream
guard). ``stream_wait_event`` is ``cudaStreamWaitEvent`` (the device orders; nothing lands), what
``paddle.device.current_stream().wait_event`` reaches in the replica. FastDeploy's own copies in the
replica go through ``framework_copy_d2h``: as Paddle's ``copy_``, with no host wait ordering them
after a copy on another stream - two such copies into one buffer are reported, not hidden.
``run_ahead(seed)``: from now on a random prefix of each stream's pending copies lands at each
runtime call (``run_ahead(None)`` stops it).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from .backend import BufferInUseError, CopyBackend, PendingCopyError
from .cudart import CudaError, CudaRuntime
from .host import HostBackend

SOURCES = ("fake_cudart.cc", "copy_batch.cc")
POISON_INT = -7777  # what an integer destination holds until its copy landed (fake_cudart.cc)
_RACES = {9001: PendingCopyError, 9002: BufferInUseError, 9003: BufferInUseError, 9004: BufferInUseError}
_lock = threading.Lock()
_runtime: FakeRuntime | None = None


def fake_library(out_dir: Path | None = None) -> Path:
    """The fake libcudart with ``fdac_d2h_batch``, compiled once per source version."""
    from ..ops import cache

    src = cache.sources_dir()
    if src is None:
        raise RuntimeError("backend 'sim' needs the custom_ops sources (fake_cudart.cc), which are missing")
    digest = hashlib.sha256(b"".join((src / name).read_bytes() for name in SOURCES)).hexdigest()[:12]
    out_dir = Path(out_dir) if out_dir is not None else cache.ops_dir()
    lib = out_dir / f"libfdac_fake_cudart-{digest}.so"
    if not lib.is_file():
        cxx = shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            raise RuntimeError("backend 'sim' compiles its fake CUDA runtime with g++, which is not on PATH")
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-DFAKE_BATCH_ABI=13", "-o", str(tmp),
                        *(str(src / name) for name in SOURCES)], check=True, capture_output=True)
        os.replace(tmp, lib)
    return lib


class FakeRuntime(CudaRuntime):
    """``CudaRuntime`` on the fake libcudart, plus the fake's own calls (checks, switches)."""

    name = "sim"

    def __init__(self, path: Path | None = None) -> None:
        lib = ctypes.CDLL(str(path or fake_library()))
        super().__init__(lib=lib, origin=f"fake libcudart (backend sim, {Path(lib._name).name})")
        P, S = ctypes.c_void_p, ctypes.c_size_t
        for name, args, res in (("fake_check_read", [P, S], ctypes.c_int), ("fake_pending", [P, S], ctypes.c_int),
                                ("fake_report_reuse", [P, S], ctypes.c_int), ("fake_current_stream", [], P),
                                ("fake_set_kind", [P, ctypes.c_int, ctypes.c_char], None),
                                ("fake_seed", [ctypes.c_ulonglong], None),
                                ("cudaStreamWaitEvent", [P, P, ctypes.c_uint], ctypes.c_int)):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        self.use_batch(lib)  # the production C call, with its cudaMemcpyBatchAsync branch
        self.batch.use_batch_api(True, "the fake runtime's cudaMemcpyBatchAsync (backend sim)")

    def _var(self, name: str) -> ctypes.c_int:
        return ctypes.c_int.in_dll(self.lib, name)

    def _fail(self, name: str, code: int):
        error = _RACES.get(code)
        if error is not None:
            raise error(f"{name}: {self.last_error()}")
        super()._fail(name, code)

    @property
    def allocations(self) -> int:
        return self._var("fake_allocations").value

    @property
    def frees(self) -> int:
        return self._var("fake_frees").value

    def errors(self) -> int:
        """Races the fake reported since this process loaded it."""
        return self._var("fake_errors").value

    def last_error(self) -> str:
        return (ctypes.c_char * 1024).in_dll(self.lib, "fake_error_text").value.decode(errors="replace")

    def host_stream(self) -> int:
        return self.lib.fake_current_stream() or 0

    def set_kind(self, ptr: int, itemsize: int, kind: str) -> None:
        self.lib.fake_set_kind(ptr, itemsize, kind.encode())

    def check_read(self, ptr: int, nbytes: int) -> None:
        code = self.lib.fake_check_read(ptr, nbytes)
        if code:
            raise PendingCopyError(self.last_error())

    def pending(self, ptr: int, nbytes: int) -> int:
        return self.lib.fake_pending(ptr, nbytes)

    def report_reuse(self, ptr: int, nbytes: int) -> None:
        self.lib.fake_report_reuse(ptr, nbytes)

    def switch_streams(self, on: bool) -> None:
        self._var("fake_stream_switch").value = int(on)

    def use_stream(self, index: int) -> None:
        """The current stream is stream number ``index`` from now on (0: the default one)."""
        self._var("fake_stream_index").value = index

    @property
    def stream_waits(self) -> int:
        """``cudaStreamWaitEvent`` calls that ordered something, since this process loaded the fake."""
        return self._var("fake_stream_waits").value

    def stream_wait_event(self, stream: int, event: int) -> None:
        """``stream``'s later work runs after ``event``'s (on the device; no host wait)."""
        code = self.lib.cudaStreamWaitEvent(stream, event, 0)
        if code:
            self._fail("cudaStreamWaitEvent", code)

    def run_ahead(self, seed: int | None) -> None:
        if seed is not None:
            self.lib.fake_seed(seed)
        self._var("fake_random_landing").value = int(seed is not None)


def fake_runtime() -> FakeRuntime:
    """The process's fake runtime (one: its state is the library's, as a device's is the process's)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = FakeRuntime()
        return _runtime


class SimulatedBackend(HostBackend):
    """``RuntimeBackend`` (as ``host``: host tensors are the "device") on ``FakeRuntime``."""

    name = "sim"
    copy_in_flight = CopyBackend.copy_in_flight  # (``host``'s copies land at once; these do not)

    def __init__(self, glue=None) -> None:
        super().__init__(glue=glue, rt=fake_runtime())
        self._labels: dict[int, str] = {}
        self._framework = threading.local()  # .on: a framework's own copy is being issued
        #: None: a race between the framework's own copies raises; a list: it is noted here (the
        #: copy's label) and the copy ordered after the other (a host wait), so the run goes on
        self.framework_races: list | None = None

    def new_pinned(self, shape, dtype, label, private=False):
        t = super().new_pinned(shape, dtype, label, private)
        self._labels[id(t)] = label
        return t

    def label_of(self, buf) -> str:
        return self._labels.get(id(buf), f"<unlabelled buffer {id(buf):#x}>")

    def run_ahead(self, seed: int | None) -> None:
        self.rt.run_ahead(seed)

    def switch_streams(self, on: bool) -> None:
        self.rt.switch_streams(on)

    def use_stream(self, index: int) -> None:
        """FastDeploy's current stream is stream number ``index`` from now on (0: the default)."""
        self.rt.use_stream(index)

    def stream_wait_event(self, event) -> None:
        """``paddle.device.current_stream().wait_event(event)``: the current stream's later work runs
        after ``event``'s copies, on the device (``cudaStreamWaitEvent``; nothing lands now)."""
        with self._lock:
            stream = self._stream(None)
            for handle in event.native:
                self.rt.stream_wait_event(stream, handle)

    def framework_copy_d2h(self, dst, src, label: str):
        """FastDeploy's own ``dst.copy_(src, False)`` (Paddle's copy, not the plugin's): issued on the
        current stream with no ordering after an unwaited copy into ``dst`` on another stream - the
        fake runtime reports such a pair (9002), naming the buffer here."""
        self._framework.on = True
        try:
            return self.copy_d2h(dst, src, label)
        except BufferInUseError as exc:
            if self.framework_races is None:
                raise BufferInUseError(f"FastDeploy's copy {label!r} into pinned buffer {self.label_of(dst)!r}: "
                                       f"{exc}") from None
            self.framework_races.append(label)
        finally:
            self._framework.on = False
        return self.copy_d2h(dst, src, label)  # noted; now ordered as the plugin's own copies are

    def _order_after(self, earlier, name: str) -> None:
        if not getattr(self._framework, "on", False):  # Paddle's copy_ does not wait on the host
            super()._order_after(earlier, name)

    def reused_while_referenced(self, message, buffers):
        for buf in buffers.values():
            facts = self._facts(buf)
            if facts is not None:
                self.rt.report_reuse(facts.ptr, facts.nbytes)
        referrers = sorted({type(r).__name__ for b in buffers.values() for r in gc.get_referrers(b)
                            if r is not buffers})
        raise BufferInUseError(f"{message}; referrers: {referrers}: the slot was reused too early")

    def pending_writers(self) -> list[str]:
        """The labels of the copies into this backend's buffers that have not landed."""
        return sorted(_writer(f) for f in list(self._pinned.values())
                      if f.set is not None and f.buf() is not None and self.rt.pending(f.ptr, f.flat.nbytes))

    def _read_checked(self, buf, reader, rows):
        try:
            self._check_read(rows.ctypes.data, rows.nbytes)
        except PendingCopyError as exc:
            facts = self._facts(buf)
            raise PendingCopyError(
                f"host read of pinned buffer {self.label_of(buf)!r} by {reader!r} before the copy "
                f"{_writer(facts) if facts else '?'!r} into it completed: wait on that copy set's event first ({exc})"
            ) from None

    def _h2d_still_read(self, buf, writer, event):
        raise BufferInUseError(
            f"host write of pinned buffer {self.label_of(buf)!r} by {writer!r} while the copy "
            f"{event.label!r} may still read it: wait on that copy's event first"
        )


def _writer(facts) -> str | None:
    """The label of the last copy into a buffer (its facts; None: never written)."""
    return None if facts.set is None else facts.set.names[facts.index]


__all__ = ["CudaError", "FakeRuntime", "SimulatedBackend", "fake_library", "fake_runtime"]
