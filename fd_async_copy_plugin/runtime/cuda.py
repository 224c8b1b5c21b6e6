"""Backend ``cuda``: pinned memory, asynchronous D2H copies and events through the CUDA layer.

Everything CUDA goes through ``runtime/cudart.py`` (ctypes on the CUDA runtime the process has
loaded) on integers: ``cudaHostAlloc`` for pinned buffers (wrapped as zero-copy CPU-place tensors,
never ``paddle.empty(...).cpu().pin_memory()``), ``cudaMemcpyAsync`` on the framework's current
stream of the source's device, ``cudaEventRecord``/``cudaEventSynchronize`` with blocking-sync
events (the wait releases the GIL), and memory released only after every copy into it.

The framework is reduced to the accessors of ``runtime/glue.py`` (``data_ptr()``, shape, dtype,
device id, the current stream's handle). Before the first copy on a device, ``runtime.probe``
checks that those accessors agree with the layer; a disagreement raises ``AccessorProbeError``
(the features stand down with its reason; strict mode refuses to start).

``RuntimeBackend`` is the logic with the runtime left open: ``CudaBackend`` runs it on
``CudaRuntime``; ``HostBackend`` (host.py) and the CPU tests run the same code on ``HostRuntime``.
"""

from __future__ import annotations

import ctypes
import logging
from functools import partial
from operator import itemgetter

from . import census
from .backend import AsyncCopyError, CopyBackend, CopyEvent, CopySetState
from .cudart import CopySet, runtime
from .glue import composed_facts

_EVENT_POOL = 8
_shape = itemgetter(2)  # a source's shape in its ``_sources`` facts
log = logging.getLogger("fd_async_copy")


class AccessorProbeError(AsyncCopyError):
    """The framework's accessors disagree with the CUDA layer on this device (see ``probe``)."""


def cuda_available() -> tuple[bool, str]:
    """Whether this Paddle can run the ``cuda`` backend, and why not.

    Checks ``is_compiled_with_cuda()`` before touching any CUDA API: on the CPU build,
    ``paddle.device.cuda.current_stream()`` segfaults the process. Then that the CUDA layer finds
    the runtime Paddle loaded.
    """
    import paddle

    if not paddle.is_compiled_with_cuda():
        return False, "Paddle is not compiled with CUDA (CPU build)"
    try:
        count = paddle.device.cuda.device_count()
    except Exception as exc:  # pragma: no cover - GPU builds only
        return False, f"cannot query CUDA devices: {exc}"
    if count < 1:
        return False, "Paddle is compiled with CUDA but sees no GPU"
    try:  # pragma: no cover - GPU builds only
        origin = runtime().origin
    except Exception as exc:  # pragma: no cover - GPU builds only
        return False, f"the CUDA layer cannot reach the CUDA runtime: {exc}"
    return True, f"{count} CUDA device(s); CUDA runtime {origin}"  # pragma: no cover


class RuntimeBackend(CopyBackend):
    """Copies by address on a runtime's streams; see the module docstring."""

    name = "runtime"
    #: sources must be on a GPU (``cuda``) or may be host tensors (``host``)
    device_sources = True

    def __init__(self, rt, glue=None, probe: bool = True, probe_ops=None) -> None:
        super().__init__(glue=glue, rt=rt)
        self._probe_enabled, self._probe_ops = probe, probe_ops  # (``probe_ops``: the probe's framework ops)
        self.probes: dict[int, dict] = {}  # device -> probe_accessors() result
        self._probed_ok: set[int] = set()  # devices whose probe passed (the copies' one check)
        self._streams: dict[int, int] = {}  # stream -> device, every stream copied on so far
        self._events: dict[int, list[int]] = {}  # stream -> pool of event handles
        self._next_event = 0
        self._facts_of = getattr(self.glue, "facts", None) or partial(composed_facts, self.glue)

    # -- first use of a device -----------------------------------------------------------------
    def ensure_probed(self, device: int, kernels=None, ops=None) -> dict:
        """Probe the accessors on ``device`` once (again with ``kernels``, the stop-flag library, if
        the first probe ran without); raise ``AccessorProbeError`` if they disagree."""
        result = self.probes.get(device)
        if result is None or (kernels is not None and not result.get("with_kernels")):
            if self._probe_enabled:
                from .probe import probe_accessors

                result = probe_accessors(device, self.glue, self.rt, ops or self._probe_ops, kernels)
            else:
                result = {"ok": True, "device": device, "checks": [], "reason": "", "probe": "disabled"}
            result["with_kernels"] = kernels is not None
            self.probes[device] = result
        if not result["ok"]:
            self._probed_ok.discard(device)
            raise AccessorProbeError(f"gpu:{device}: {result['reason']}")
        self._probed_ok.add(device)
        return result

    def unusable_for(self, src) -> str:
        """Why copies of ``src`` must not use this backend ("" when they may): the accessor probe
        of its device failed."""
        device = self.glue.gpu_device(src)
        try:
            if device is not None:
                self.ensure_probed(device)
        except AccessorProbeError as exc:
            return str(exc)
        return ""

    # -- copies ----------------------------------------------------------------------------------
    def copy_d2h_many(self, copies, label):
        """Issue the non-blocking D2H copies ``(dst, src, copy_label)`` as one copy set with its own
        event (``label``; None: the first copy's label), returned and kept by each destination:
        every copy checked before the first is issued, the set issued under one lock acquisition."""
        dsts, names = [dst for dst, _, _ in copies], [name for _, _, name in copies]
        facts = self._sources([src for _, src, _ in copies])
        return self._issue(dsts, names, facts, names[0] if label is None else label)

    def fill(self, ring, writer, sources, labels, label, reserve=None):
        """One step's copies into ``ring`` (``PinnedRing.fill``, whose lock is held): a slot for
        ``sources`` (``PinnedRing.acquire``), each source copied into its buffer as one copy set
        with its event ``label``. Returns (the slot, the event)."""
        # The ring's lock held (``PinnedRing.fill``): each source's facts read once, for the slot's
        # choice and for its copy.
        # (``map`` over C callables: no comprehension frame per call)
        facts, names = self._sources(sources.values()), list(map(labels.__getitem__, sources))
        slot = ring._free_next()  # the common step: the next slot, its buffers large enough
        event = None if slot is None else self._issue(list(map(slot.buffers.__getitem__, sources)), names, facts,
                                                      label, grow=False)
        if event is not None:
            return ring._take(slot), event
        slot = ring._acquire(writer, dict(zip(sources, map(_shape, facts))), reserve)
        return slot, self._issue(list(map(slot.buffers.__getitem__, sources)), names, facts, label)

    def _sources(self, sources) -> list[tuple]:
        """Each source's checked facts: (device, address, shape, dtype, ...) (see ``_plan_other``)."""
        facts_of, probed, on_device, out = self._facts_of, self._probed_ok, self.device_sources, []
        for src in sources:
            facts = facts_of(src)
            device = facts[0]
            if (device is None) == on_device or not facts[4]:
                facts = self._plan_other(src, device)
            elif device is not None and device not in probed:
                self.ensure_probed(device)  # probes a device not used before (raises if it failed)
            out.append(facts)
        return out

    def _stream(self, device) -> int:
        """The stream a copy from ``device`` goes on: the framework's current one (``host``/``sim``:
        the runtime's, for host memory). Backend lock held. (``_event`` notes it among the streams
        copied on.)"""
        return self.glue.stream(device) if device is not None else self.rt.host_stream()

    def _issue(self, dsts, names, sources: list, label: str, grow: bool = True) -> CopyEvent | None:
        """The one function that issues D2H copies: copy each source (its ``_sources`` facts) into
        its destination as one copy set with its own event ``label``; each destination names the set
        (``_Pinned.set``) and a reader waits on the set's event.

        Every destination is fitted (dtype, capacity, shape) before anything is issued. A copy set is
        described once (``CopySetState``, kept by its first destination): per stream (one, unless
        sources sit on two GPUs) one C call, ``fdac_d2h_set_issue``, checks the capacities, issues the
        copies (one ``cudaMemcpyBatchAsync`` where the runtime has it) and records the set's event;
        a steady step passes it only the sources, the stream and the event. Without the C call
        (``HostRuntime``, a build without it) a runtime call each. A destination whose last copy went
        on another stream and is not known complete is waited on first (``_order_after``): two
        unordered copies into one buffer may land in either order. Sources on several GPUs (rare)
        are issued as one copy set per GPU, the event returned covering them all.

        ``grow=False``: a destination too small for its source (or not a pinned buffer) makes it
        return None, having issued nothing (``fill``'s common step: the ring then chooses, grows and
        fits a slot)."""
        pinned, glue = self._pinned, self.glue
        address, shape_of, fitted, srcs = glue.address, glue.shape, [], []
        device = sources[0][0] if sources else -2
        for dst, source in zip(dsts, sources):  # every destination checked before anything is issued
            facts, shape = pinned.get(id(dst)), source[2]
            if (facts is None or facts.buf() is not dst or shape != facts.shape or source[3] != facts.dtype
                    or not facts.private and (address(dst) != facts.ptr or shape_of(dst) != shape)):
                facts = self._fit(dst, shape, source[3], grow)  # (as the backend left it: nothing to fit)
                if facts is None:
                    return None
            fitted.append(facts)
            srcs.append(source[1])
            if source[0] != device:
                device = -2
        if device == -2:  # sources on several GPUs, or none (an event on no stream, complete)
            groups: dict = {}
            for i, source in enumerate(sources):
                groups.setdefault(source[0], []).append(i)
            events = [self._issue([dsts[i] for i in group], [names[i] for i in group], [sources[i] for i in group],
                                  label) for group in groups.values()]
            return CopyEvent(label, sum((e.native for e in events), ()), events)
        described = fitted[0].copyset  # (the copy set these destinations make, described once)
        if described is None or described.facts != fitted:
            batch = self.rt.batch
            c = None if batch is None or len(fitted) > batch.MAX else CopySet(
                batch, [f.ptr for f in fitted], [f.memory().nbytes for f in fitted])
            described = fitted[0].copyset = CopySetState(fitted, c)
        with self._lock:
            if census._ACTIVE is not None:
                for name in names:
                    census.record("async_d2h", name)
            stream = self.glue.stream(device) if device is not None else self.rt.host_stream()  # (``_stream``)
            claim = () if described.whole and described.stream == stream else self._ordered(
                described, fitted, stream, names)
            handle = self._event(stream, -1 if device is None else device)
            c = described.c
            if c is not None:
                reshapes = self._reshapes  # (read once: a reshape since makes it write the new sizes)
                sizes = None if described.sizes_at == reshapes else [f.nbytes for f in fitted]
                c.issue(srcs, sizes, stream, handle)
                described.sizes_at = reshapes
            else:
                memcpy = self.rt.memcpy_d2h_async
                for facts, src in zip(fitted, srcs):
                    if facts.nbytes:
                        memcpy(facts.ptr, src, facts.nbytes, stream)
                self.rt.event_record(handle, stream)
            event = self._last[stream] = CopyEvent(label, (handle,), (self._last.get(stream),))
            described.event, described.names, described.stream, described.whole = event, names, stream, True
            for i in claim:
                facts = fitted[i]
                if facts.set is not None:
                    facts.set.whole = False  # (that set no longer wrote this buffer last)
                facts.set, facts.index = described, i
            return event

    def _ordered(self, described, fitted, stream: int, names) -> list:
        """Wait for a copy into one of ``fitted`` still running on another stream (``_order_after``);
        returns the indices of the destinations another copy set wrote last (backend lock held)."""
        claim = []
        for i, facts in enumerate(fitted):
            earlier = facts.set
            if earlier is not described:
                claim.append(i)
            if earlier is not None and earlier.stream != stream and not earlier.event.done:
                self._order_after(earlier.event, names[i])
            h2d = facts.h2d_event
            if h2d is not None and facts.h2d_stream != stream and not h2d.done:
                self._order_after(h2d, names[i])
        return claim

    def _order_after(self, earlier: CopyEvent, name: str) -> None:
        """A copy into memory whose last copy went on another stream and may still run: the host
        waits for that copy's event first (rare: the framework changed streams between two steps)."""
        self.wait(earlier, f"{name}: ordered after a copy on another stream")

    def _plan_other(self, src, device) -> tuple:
        """The facts of a source that cannot be copied by address (the ``host`` backend copies it
        another way): (device, address, shape, dtype, contiguous, what keeps the copy alive)."""
        if device is None:
            raise ValueError("copy_d2h: the source must be a GPU tensor for the cuda backend")
        raise ValueError("copy_d2h: the source must be contiguous (a copy by address reads it flat)")

    def _copy_h2d(self, dst_ptr, device, facts, memory, offset, nbytes, label):
        # Backend lock held (``CopyBackend.copy_h2d``). ``device`` None: host memory (``host``).
        if device is None and self.device_sources:
            raise ValueError("copy_h2d: the destination must be GPU memory for the cuda backend")
        stream = self._stream(device)
        if nbytes:
            self.rt.memcpy_h2d_async(dst_ptr, memory.ptr + offset, nbytes, stream)
        handle = self._event(stream, -1 if device is None else device)
        self.rt.event_record(handle, stream)
        event = self._last[stream] = CopyEvent(label, (handle,), (self._last.get(stream),))
        facts.h2d_stream = stream  # (``copy_h2d`` keeps the event: ``facts.h2d_event``)
        return event

    # -- events ----------------------------------------------------------------------------------
    def _event(self, stream: int, device: int) -> int:
        pool = self._events.get(stream)
        if pool is not None and len(pool) == _EVENT_POOL:
            # Reused round-robin: re-recording an event an older CopyEvent still refers to only
            # makes that waiter wait longer, never shorter.
            self._next_event += 1
            return pool[self._next_event % _EVENT_POOL]
        if pool is None:
            pool = self._events[stream] = []
            self._streams.setdefault(stream, device)  # (a stream copied on: ``record`` covers it)
        # An event belongs to the device current when it is created: create it on the stream's.
        current = self.rt.get_device() if device >= 0 else device
        if current != device:
            self.rt.set_device(device)
        try:
            pool.append(self.rt.event_create())
        finally:
            if current != device:
                self.rt.set_device(current)
        return pool[-1]

    def _record_native(self, label):
        # Backend lock held (``CopyBackend.record``): every copy issued so far is on one of these
        # streams, and no copy is issued between the records.
        recorded = []
        for stream, device in self._streams.items():  # (``_event`` adds no stream)
            recorded.append(self._event(stream, device))
            self.rt.event_record(recorded[-1], stream)
        event = CopyEvent(label, tuple(recorded), [self._last.get(stream) for stream in self._streams])
        self._last.update(dict.fromkeys(self._streams, event))
        return event


class CudaBackend(RuntimeBackend):
    name = "cuda"

    def __init__(self, glue=None, rt=None, probe: bool = True, probe_ops=None) -> None:
        if glue is None:
            ok, why = cuda_available()
            if not ok:
                raise RuntimeError(f"backend 'cuda' needs CUDA: {why}. Use FD_ASYNC_COPY_BACKEND=host to run the "
                                   "patched code with synchronous copies")
        if rt is None:
            rt = runtime()
            self.batch_origin = attach_batch(rt)
        super().__init__(rt, glue=glue, probe=probe, probe_ops=probe_ops)


def attach_batch(rt) -> str:
    """Give the process's runtime the built custom-ops module's ``fdac_d2h_batch`` (a step's copies
    and event in one call); without it each copy is its own ctypes call. Returns what was done."""
    if rt.batch is not None:
        return "fdac_d2h_batch: loaded"
    try:
        from ..ops import cache

        artifact = cache.ops_dir() / cache.PYBIND_FILE
        why = cache.staleness(artifact, cache.pybind_fingerprint())
        if why is None:
            rt.use_batch(ctypes.CDLL(str(artifact)))
            return f"fdac_d2h_batch from {artifact}"
    except Exception as exc:  # an old build without the symbol, an unreadable cache: copies one by one
        why = f"{type(exc).__name__}: {exc}"
    log.info("fd_async_copy: copies issued one ctypes call each (%s)", why)
    return f"one ctypes call per copy ({why})"
