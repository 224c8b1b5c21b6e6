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

import logging
from functools import partial
from math import prod

from . import census
from .backend import AsyncCopyError, CopyBackend, CopyEvent
from .cudart import PreparedBatch
from .glue import composed_facts

_EVENT_POOL = 8
_PLANS = 32  # prepared ``copy_d2h_many`` plans a backend keeps
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
        from .cudart import runtime

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
        self._probe_enabled = probe
        self._probe_ops = probe_ops  # the framework ops the probe uses (None: Paddle's)
        self.probes: dict[int, dict] = {}  # device -> probe_accessors() result
        self._probed_ok: set[int] = set()  # devices whose probe passed (the copies' one check)
        self._streams: dict[int, int] = {}  # stream -> device, every stream copied on so far
        self._events: dict[int, list[int]] = {}  # stream -> pool of event handles
        self._next_event = 0
        self._plans: dict[tuple, _CopyPlan | None] = {}  # (label, destination ids) -> plan
        facts = getattr(self.glue, "facts", None)
        self._facts_of = facts if facts is not None else partial(composed_facts, self.glue)

    # -- first use of a device -----------------------------------------------------------------
    def ensure_probed(self, device: int, kernels=None, ops=None) -> dict:
        """Probe the accessors on ``device`` once (again with ``kernels``, the stop-flag library, if
        the first probe ran without); raise ``AccessorProbeError`` if they disagree."""
        result = self.probes.get(device)
        if result is None or (kernels is not None and not result.get("with_kernels")):
            if self._probe_enabled:
                from .probe import probe_accessors

                ops = ops or self._probe_ops
                result = probe_accessors(device, glue=self.glue, rt=self.rt, ops=ops, kernels=kernels)
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
        if device is None:
            return ""
        try:
            self.ensure_probed(device)
        except AccessorProbeError as exc:
            return str(exc)
        return ""

    # -- copies ----------------------------------------------------------------------------------
    # Every source and destination checked first (nothing issued if one fails); under the lock each
    # copy's bookkeeping and CUDA call in order, each device's current stream asked once, the event.
    def copy_d2h(self, dst, src, label):
        self._issue((dst,), (label,), self._sources((src,)), None)

    def copy_d2h_many(self, copies, label):
        if label is not None:
            # A step's copies into the same pinned buffers as before (the stop flag's, step_syncs'
            # snapshot, overlap's flags) replay the plan prepared for those buffers and labels.
            key = (label, *[(id(dst), name) for dst, _, name in copies])
            plan = self._plans.get(key)
            if plan is not None:
                event = plan.replay(self, copies, label)
                if event is not None:
                    return event
        dsts, names = [dst for dst, _, _ in copies], [name for _, _, name in copies]
        facts = self._sources([src for _, src, _ in copies])
        event = self._issue(dsts, names, facts, label)
        if label is not None:  # (no event: nothing to prepare)
            if len(self._plans) >= _PLANS:  # (buffers come and go: plans of gone ones never replay)
                self._plans.clear()
            self._plans[key] = _CopyPlan.prepare(self, dsts, names, facts, label)
        return event

    def fill(self, ring, writer, sources, labels, label, reserve=None):
        # The ring's lock held (``PinnedRing.fill``). The common step: the ring's next slot is free
        # and its plan replays these sources (each source's facts read once, there).
        slot = ring._free_next()
        event = None if slot is None else self._replay_fill(slot, sources, labels, label)
        if event is not None:
            return ring._take(slot), event
        # Otherwise the ring chooses (and grows) a slot for these shapes; its plan may still replay.
        facts = self._sources(list(sources.values()))
        slot = ring._acquire(writer, {field: f[2] for field, f in zip(sources, facts)}, reserve)
        event = self._replay_fill(slot, sources, labels, label)
        if event is None:
            dsts, names = [slot.buffers[field] for field in sources], [labels[field] for field in sources]
            event = self._issue(dsts, names, facts, label)
            slot.plan = _CopyPlan.prepare(self, dsts, names, facts, label, labels)
        return slot, event

    def _replay_fill(self, slot, sources: dict, labels: dict, label):
        """The event of ``slot``'s plan replayed for ``sources``, or None (no plan, or it declined)."""
        plan = slot.plan
        if plan is None or plan.labels is not labels or label is None or len(sources) != len(plan.entries):
            return None
        buffers = slot.buffers
        return plan.replay(self, [(buffers[field], src, None) for field, src in sources.items()], label)

    def _sources(self, sources: list) -> list[tuple]:
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

    def _issue(self, dsts, names, sources: list, label):
        """Copy each source (its ``_sources`` facts) into its destination, then ``record(label)``.
        With the runtime's batch (``fdac_d2h_batch``), two or more copies, or copies and their
        event, go to the GPU in one C call when they share one stream."""
        fit, fitted = self._fit, []
        for dst, source in zip(dsts, sources):  # every destination checked before anything is issued
            facts = fit(dst, source[2], source[3])  # (its memory is alive: ``_fit`` checked it)
            fitted.append((facts, facts.memory()))
        batch = self.rt.batch
        if batch is not None and (len(dsts) < 2 and label is None or len(dsts) > batch.MAX):
            batch = None  # one copy and no event: nothing to batch
        with self._lock:  # issued under the lock: sequence order is stream order, for every thread
            streams, seq, last, known, memcpy = {}, self._seq, self._copy_seq, self._streams, self.rt.memcpy_d2h_async
            counting, ptrs, srcs, sizes, on = census._ACTIVE is not None, [], [], [], []
            try:
                for dst, name, source, (facts, memory) in zip(dsts, names, sources, fitted):
                    if counting:
                        census.record("async_d2h", name)
                    seq += 1
                    last[id(dst)] = (seq, name, facts.buf)  # (``facts.buf``: the weak reference to ``dst``)
                    device = source[0]
                    stream = streams.get(device)
                    if stream is None:
                        stream = streams[device] = 0 if device is None else self.glue.stream(device)
                        known.setdefault(stream, -1 if device is None else device)
                    if facts.nbytes:
                        if batch is None:
                            memcpy(facts.ptr, source[1], facts.nbytes, stream)
                        else:
                            ptrs.append(facts.ptr)
                            srcs.append(source[1])
                            sizes.append(facts.nbytes)
                            on.append(stream)
                        # ``memory.fence(stream, seq, device)``, inline
                        memory.fence_stream, memory.fence_seq = stream, seq
                        memory.fence_device = -1 if device is None else device
            finally:
                self._seq = seq  # never reused (if a CUDA call fails, later events cover what was issued)
            handle = None
            if batch is not None and len(streams) != 1:  # copies on two streams: one call each
                for copy in zip(ptrs, srcs, sizes, on):
                    memcpy(*copy)
            elif batch is not None:
                # One C call: the copies, and the event when this stream is the only one copied on (an
                # event covers every stream's copies: ``_record_native``).
                handle = self._event(stream, known[stream]) if label is not None and len(known) == 1 else None
                batch.issue(ptrs, srcs, sizes, stream, handle)
            if label is None:
                return None
            return self.record(label) if handle is None else self._listed(label, (handle,))

    def _plan_other(self, src, device) -> tuple:
        """The facts of a source that cannot be copied by address (the ``host`` backend copies it
        another way): (device, address, shape, dtype, contiguous, what keeps the copy alive)."""
        if device is None:
            raise ValueError("copy_d2h: the source must be a GPU tensor for the cuda backend")
        raise ValueError("copy_d2h: the source must be contiguous (a copy by address reads it flat)")

    def _copy_h2d(self, dst_ptr, device, memory, offset, nbytes, seq, label):
        # Backend lock held (``CopyBackend.copy_h2d``). ``device`` None: host memory (``host``).
        if device is None and self.device_sources:
            raise ValueError("copy_h2d: the destination must be GPU memory for the cuda backend")
        stream = self.glue.stream(device) if device is not None else 0
        if nbytes:
            self.rt.memcpy_h2d_async(dst_ptr, memory.ptr + offset, nbytes, stream)
            memory.fence(stream, seq, -1 if device is None else device)
        self._streams.setdefault(stream, -1 if device is None else device)

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
        # An event belongs to the device current when it is created: create it on the stream's.
        current = self.rt.get_device() if device >= 0 else device
        if current != device:
            self.rt.set_device(device)
        try:
            pool.append(self.rt.event_create(True))
        finally:
            if current != device:
                self.rt.set_device(current)
        return pool[-1]

    def _record_native(self, seq, label):
        # Called with the backend lock held (``CopyBackend.record``): every copy issued so far is
        # on one of these streams, and no copy is issued between the records.
        recorded, record = [], self.rt.event_record
        for stream, device in self._streams.items():  # (``_event`` adds no stream)
            event = self._event(stream, device)
            record(event, stream)
            recorded.append(event)
        return tuple(recorded)

    def _wait_native(self, event: CopyEvent) -> None:
        for handle in event.native or ():
            self.rt.event_synchronize(handle)  # GIL released: other threads keep launching

    def _drain_native(self, device: bool = False) -> None:
        if device:
            self.rt.device_synchronize()
            return
        with self._wait_lock("stream_synchronize"):
            streams = list(self._streams)
        for stream in streams:
            self.rt.stream_synchronize(stream)

    def query(self, event: CopyEvent) -> bool:
        """Whether ``event``'s copies have landed, without waiting."""
        return event.seq <= self._completed or all(self.rt.event_query(h) for h in event.native or ())


class _CopyPlan:
    """Copies into the same pinned buffers as a previous call, prepared once (issue 24): each
    buffer's allocation facts and its copy's label, and the batch's destinations and sizes
    (``PreparedBatch``). A ring slot keeps one (``RuntimeBackend.fill``), the backend one per set of
    destinations and labels of ``copy_d2h_many`` (a step's outputs).

    ``replay`` is ``_issue`` for exactly those buffers: it reads each source's facts and makes
    ``_sources``' and ``_fit``'s checks itself (the sources on the plan's probed GPU and contiguous;
    each buffer registered, alive, at its memory, of the source's dtype), gives a buffer the
    source's shape through ``_fit`` where it changed and fits the allocation (a decode batch that
    grew or shrank), then does the same bookkeeping and one C call. It returns None, having issued
    nothing, when the call differs otherwise (its buffers, their order, the device, a shape too
    large): the caller goes on to the general path (the ring grows the slot, ``_issue`` refits or
    raises). The ring drops a slot's plan when one of its buffers changes
    (``PinnedRing._new_buffer``)."""

    __slots__ = ("labels", "entries", "sizes", "device", "batch")

    @classmethod
    def prepare(cls, backend, dsts, names, facts, label, labels=None):
        """The plan of the copies just issued, or None where they cannot be replayed: no batch, no
        event, sources not all on one GPU, an empty copy. ``labels``: a ring's fields' (its fill)."""
        batch, pinned = backend.rt.batch, backend._pinned
        if batch is None or label is None or not 0 < len(dsts) <= batch.MAX:
            return None
        device = facts[0][0]
        held = [pinned.get(id(dst)) for dst in dsts]
        if device is None or any(f[0] != device for f in facts) or any(p is None or not p.nbytes for p in held):
            return None
        plan = cls()
        plan.labels, plan.device = labels, device
        plan.entries, plan.sizes = tuple(zip(held, names, map(id, dsts))), [p.nbytes for p in held]
        plan.batch = PreparedBatch(batch, [p.ptr for p in held], plan.sizes)
        return plan

    def replay(self, backend, copies, label):
        """``copies``: (destination, source, _) for each entry, in order (the callers check the count)."""
        device, pinned, facts_of, glue = self.device, backend._pinned, backend._facts_of, backend.glue
        if device not in backend._probed_ok:
            return None
        address, shape_of, srcs, memories, resized = glue.address, glue.shape, [], [], False
        for (held, _, ident), size, (dst, src, _) in zip(self.entries, self.sizes, copies):
            f, memory = facts_of(src), held.memory()
            if (f[0] != device or not f[4] or f[3] != held.dtype or pinned.get(ident) is not held
                    or held.buf() is not dst or memory is None or address(dst) != held.ptr):
                return None
            shape = f[2]
            # (``size``: what the batch copies; another call may have given the buffer a new shape)
            if shape != held.shape or size != held.nbytes or shape_of(dst) != shape:
                # The decode batch grew or shrank, or a framework op reshaped the buffer: ``_fit``
                # gives it the source's shape; one that does not fit goes to the general path (the
                # ring grows the slot).
                if (prod(shape) if shape else 1) * held.flat.itemsize > memory.nbytes:
                    return None
                backend._fit(dst, shape, f[3])
                resized = True
            srcs.append(f[1])
            memories.append(memory)
        with backend._lock:  # as ``_issue``: sequence order is stream order
            if resized:  # (under the lock, as the batch's sources: zero bytes, the C loop skips that copy)
                self.sizes = [entry[0].nbytes for entry in self.entries]
                self.batch.resize(self.sizes)
            stream = glue.stream(device)
            known = backend._streams
            if stream not in known:
                known[stream] = device
            seq, last, counting = backend._seq, backend._copy_seq, census._ACTIVE is not None
            for (held, name, ident), memory in zip(self.entries, memories):
                if counting:
                    census.record("async_d2h", name)
                seq += 1
                last[ident] = (seq, name, held.buf)
                if held.nbytes:  # ``memory.fence(stream, seq, device)``, inline
                    memory.fence_stream, memory.fence_seq, memory.fence_device = stream, seq, device
            backend._seq = seq
            handle = backend._event(stream, device) if len(known) == 1 else None
            self.batch.issue(srcs, stream, handle)
            return backend.record(label) if handle is None else backend._listed(label, (handle,))


class CudaBackend(RuntimeBackend):
    name = "cuda"

    def __init__(self, glue=None, rt=None, probe: bool = True, probe_ops=None) -> None:
        if glue is None:
            ok, why = cuda_available()
            if not ok:
                raise RuntimeError(f"backend 'cuda' is unavailable: {why}")
        if rt is None:
            from .cudart import runtime

            rt = runtime()
            self.batch_origin = attach_batch(rt)
        super().__init__(rt, glue=glue, probe=probe, probe_ops=probe_ops)


def attach_batch(rt) -> str:
    """Give the process's runtime the built custom-ops module's ``fdac_d2h_batch`` (a step's copies
    and event in one call); without it each copy is its own ctypes call. Returns what was done."""
    if rt.batch is not None:
        return "fdac_d2h_batch: loaded"
    try:
        import ctypes

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
