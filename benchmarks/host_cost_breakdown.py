#!/usr/bin/env python3
"""Where the plugin's host time per decode step goes, on the output copies (issue 24, "measure first").

One decode step's output copies (logprob ids / logprobs / ranks of B rows x K+1 columns, as in
``cuda_layer_check.py``'s timing part), GPU idle and GPU busy (~2 ms of queued work per step), for:

- ``plugin``: ``PinnedRing.acquire`` + one ``CudaBackend.copy_d2h_many`` (the three copies and their
  event: what the logprobs feature's producer calls); the consumer (next step) ``wait``s on the
  event and ``read``s each buffer - the plugin's real code;
- ``plugin, census on``: the same inside an active census (tests and ``bench`` run it on);
- ``plugin, per-copy API``: ``acquire`` + one ``copy_d2h`` per tensor + ``record`` (the API other
  producers use; issue 24's "before" measured this path);
- ``plugin: ring.fill``: what the logprobs producer calls since the fifth cut - one ``PinnedRing.fill``
  (each source's facts read once), one ctypes call per copy; and ``+ fdac_d2h_batch (default)``: the
  same with the step's copies and event in one C call (``custom_ops/copy_batch.cc``, compiled here with
  g++ unless ``--batch-lib`` names a build), as ``CudaBackend`` does when the custom ops are built;
- ``FD 2.4``: blocking copies (``cudaMemcpyAsync`` into pageable memory + stream synchronize each);
- ``FD 2.5``: per-step pinned allocation + copies + a new event, freed a step later;
- ``floor``: only the CUDA calls a step cannot avoid, through ctypes with prebuilt arguments
  (3 x ``cudaMemcpyAsync`` + ``cudaEventRecord``; the consumer's ``cudaEventSynchronize``), and the
  same calls made by ``fdac_d2h_batch`` in one ctypes call.

Each variant runs twice, interleaved over ``--rounds``: plain (producer, consumer and wall time per
step, nothing wrapped) and instrumented, where every part is wrapped with ``time.perf_counter_ns``
and charged its *exclusive* time (a part's callees are charged to them): the raw ctypes CUDA calls,
the ``CudaRuntime`` wrappers around them, the ring's bookkeeping, the census, the framework
accessors (glue), the backend's own Python (copy_d2h/_fit/record/wait/read), and the call-site
Python of the step (what no wrapper covers). The wrappers cost time of their own (about 1 us per
wrapped call on the H200, against well under 1 us for a no-op): the report gives each part's
instrumented time and an estimate for the plain run: the plugin's step is cut into segments
(acquire | copies | record, wait | reads), each timed exactly in the plain run with a perf_counter_ns
read between them and nothing wrapped, and each segment's parts are scaled by plain / instrumented
of that segment (other variants: of the whole phase). Per-part figures are estimates to rank the
parts by; the plain producer/consumer/wall figures and the segments are exact.

No runtime code is changed: the parts are wrapped from outside, on this script's objects only.

    python3 benchmarks/host_cost_breakdown.py [--device cuda|cpu] [--sizes 128,1024] [--k 20]
        [--steps 200] [--rounds 3] [--busy-ms 2.0] [--batch-lib FILE] [--output FILE] [--json FILE]

``--device cpu`` runs the same code on the ``host`` backend (HostRuntime: memmove copies, events
always complete) with numpy arrays as the framework: a smoke path, not a measurement of CUDA.
The result is a measurement (RESULT: MEASURED), not a pass/fail check.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import logging
import statistics
import sys
import time
from math import prod
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _report  # noqa: E402 - benchmarks/_report.py

from fd_async_copy_plugin.runtime import PinnedRing, collecting  # noqa: E402
from fd_async_copy_plugin.runtime import backend as backend_module  # noqa: E402
from fd_async_copy_plugin.runtime import census as census_module  # noqa: E402
from fd_async_copy_plugin.runtime import cuda as _cuda, cudart as _cudart  # noqa: E402

# Before issue 36 a copy was issued by a prepared plan (``_CopyPlan``, ``PreparedBatch``) or
# ``_issue``; from issue 36 on ``_issue`` is the one path and a copy set's C call is ``CopySet.issue``.
# This script drives both kinds of tree.
_CopyPlan = getattr(_cuda, "_CopyPlan", None)
PreparedBatch = getattr(_cudart, "PreparedBatch", None)
CopySet = getattr(_cudart, "CopySet", None)

DTYPES = {"ids": "int64", "logprobs": "float32", "ranks": "int64"}
ns = time.perf_counter_ns


# --- a numpy "framework" for the cpu path -------------------------------------------------------


class HostTensor:
    """A host array with a resizable shape inside its allocation (what a framework's host tensor
    gives the backend); ``--device cpu`` uses it for sources and pinned wraps alike."""

    __slots__ = ("base", "view", "__weakref__")

    def __init__(self, array: np.ndarray) -> None:
        self.base = array
        self.view = array


class NumpyGlue:
    name = "numpy"

    def address(self, t):
        return int(t.view.ctypes.data)

    def shape(self, t):
        return tuple(int(s) for s in t.view.shape)

    def dtype(self, t):
        return str(t.view.dtype)

    def is_contiguous(self, t):
        return bool(t.view.flags.c_contiguous)

    def gpu_device(self, t):
        return None

    def current_device(self):
        return 0

    def stream(self, device):
        return 0

    def wrap(self, array):
        return HostTensor(array)

    def set_shape(self, t, shape):
        if t.view.shape != tuple(shape):
            t.view = t.base.reshape(-1)[:prod(shape)].reshape(shape)

    def from_numpy(self, array):
        return HostTensor(array)

    def blocking_d2h(self, t):
        return HostTensor(t.view.copy())

    def snapshot(self, t):
        return t.view.copy()


# --- the instrument ---------------------------------------------------------------------------


class Profiler:
    """Exclusive time per (phase, part): a wrapped call's time minus its wrapped callees' (whose
    wrappers' cost stays with the caller; the report scales each segment back to its plain time)."""

    def __init__(self) -> None:
        self.enabled = False
        self.phase = "producer"
        self.time = collections.defaultdict(int)  # (phase, part) -> ns
        self.calls = collections.defaultdict(int)
        self._stack: list[int] = []
        self._undo: list = []

    def wrap(self, owner, attr: str, part: str, on_dict: bool = False) -> None:
        original = owner[attr] if on_dict else getattr(owner, attr)
        prof = self
        stack = self._stack

        def timed(*args, **kwargs):
            if not prof.enabled:
                return original(*args, **kwargs)
            stack.append(0)
            t0 = ns()
            try:
                return original(*args, **kwargs)
            finally:
                dt = ns() - t0
                child = stack.pop()
                key = (prof.phase, part)
                prof.time[key] += dt - child
                prof.calls[key] += 1
                if stack:
                    stack[-1] += dt

        if on_dict:
            owner[attr] = timed
            self._undo.append(lambda: owner.__setitem__(attr, original))
        else:
            had_own = attr in getattr(owner, "__dict__", {})
            setattr(owner, attr, timed)
            self._undo.append((lambda: setattr(owner, attr, original)) if had_own else
                              (lambda: delattr(owner, attr)))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def reset(self) -> None:
        self.time.clear()
        self.calls.clear()

    def overhead_ns(self, n: int = 200_000) -> float:
        """What one wrapped call adds, measured on a no-op (enabled, outside any phase of interest)."""
        box = {"f": lambda: None}
        plain = box["f"]
        t0 = ns()
        for _ in range(n):
            plain()
        bare = ns() - t0
        self.wrap(box, "f", "calibration", on_dict=True)
        wrapped = box["f"]
        self.enabled, phase, self.phase = True, self.phase, "calibration"
        t0 = ns()
        for _ in range(n):
            wrapped()
        timed = ns() - t0
        self.enabled, self.phase = False, phase
        self._undo.pop()
        self.time.pop(("calibration", "calibration"), None)
        self.calls.pop(("calibration", "calibration"), None)
        return max(0.0, (timed - bare) / n)


RT_PARTS = {  # CudaRuntime method -> the CUDA call it wraps
    "memcpy_d2h_async": "cudaMemcpyAsync", "event_record": "cudaEventRecord", "event_query": "cudaEventQuery",
    "event_synchronize": "cudaEventSynchronize", "stream_synchronize": "cudaStreamSynchronize",
    "host_alloc": "cudaHostAlloc", "host_free": "cudaFreeHost", "event_create": "cudaEventCreateWithFlags",
    "event_destroy": "cudaEventDestroy", "get_device": "cudaGetDevice",
}
GLUE = ("address", "shape", "dtype", "is_contiguous", "gpu_device", "facts", "stream", "set_shape", "wrap",
        "from_numpy")


def instrument(prof: Profiler, backend, rings, glue: bool = True) -> None:
    rt = backend.rt
    raw = getattr(rt, "_f", None)  # CudaRuntime: the ctypes function objects themselves
    for method, call in RT_PARTS.items():
        prof.wrap(rt, method, f"CudaRuntime wrapper Python ({method})" if raw is not None else f"HostRuntime.{method}")
        if raw is not None and call in raw:
            prof.wrap(raw, call, f"ctypes {call} (the CUDA call)", on_dict=True)
    if getattr(rt, "batch", None) is not None:
        prof.wrap(rt.batch, "issue", "ctypes fdac_d2h_batch (the CUDA calls: one C call)")
    for name in GLUE if glue else ():  # (a glue shared by two backends is wrapped once)
        if hasattr(backend.glue, name):
            prof.wrap(backend.glue, name, f"framework accessors (glue.{name})")
    for ring in rings:
        prof.wrap(ring, "acquire", "ring: acquire (refcounts, slot choice)")
        prof.wrap(ring, "_acquire", "ring: acquire (refcounts, slot choice)")
    prof.wrap(census_module, "record", "census.record")
    prof.wrap(backend_module, "host_view", "backend: host_view (zero-copy view)")
    for method, part in (("copy_d2h", "copy_d2h"), ("copy_d2h_many", "copy_d2h"), ("_issue", "copy_d2h"),
                         ("fill", "copy_d2h"), ("_sources", "copy_d2h"),
                         ("_copy", "copy_d2h"), ("_facts", "is_pinned/memory_of"),
                         ("_fit", "_fit (dtype/shape/capacity)"),
                         ("ensure_probed", "ensure_probed"), ("record", "record"), ("_record_native", "record"),
                         ("_event", "record"), ("wait", "wait"), ("_wait_native", "wait"),
                         ("read", "read (np.array copy-out)"), ("is_pinned", "is_pinned/memory_of"),
                         ("memory_of", "is_pinned/memory_of"), ("_check_readable", "read (np.array copy-out)")):
        if hasattr(backend, method):  # (a method of one tree's backend only: this script drives several trees)
            prof.wrap(backend, method, f"backend: {part}")


def group_of(part: str) -> str:
    if part.startswith("ctypes "):
        return "CUDA calls (ctypes)"
    if part.startswith(("CudaRuntime", "HostRuntime")):
        return "CudaRuntime wrappers"
    if part.startswith("ring"):
        return "ring bookkeeping"
    if part.startswith("census"):
        return "census recording"
    if part.startswith("framework"):
        return "framework accessors"
    if part.startswith("backend"):
        return "backend Python"
    return part


# --- the step variants --------------------------------------------------------------------------


def make_variants(backend, out, is_cuda: bool, batched=None, looped=None):
    """``batched``: a backend like ``backend`` whose runtime issues a step through fdac_d2h_batch (and
    its ``cudaMemcpyBatchAsync`` where the probe turned that on); ``looped``: the same with the batch
    call off (a ``cudaMemcpyAsync`` each from C: what a CUDA runtime before 12.8 gets), or None."""
    rt, glue = backend.rt, backend.glue
    stream = glue.stream(0) if is_cuda else 0
    nbytes = {f: int(np.prod(glue.shape(t))) * np.dtype(DTYPES[f]).itemsize for f, t in out.items()}
    pageable = {f: np.empty(nbytes[f], dtype=np.uint8) for f in DTYPES}
    capacity = {f: int(np.prod(glue.shape(t))) for f, t in out.items()}
    rings = {name: PinnedRing(backend, f"bench.{name}", DTYPES, capacity, slots=2)
             for name in ("plain", "census", "per-copy", "fill")}
    if batched is not None:
        rings["fill+batch"] = PinnedRing(batched, "bench.fill+batch", DTYPES, capacity, slots=2)
    if looped is not None:
        rings["fill+loop"] = PinnedRing(looped, "bench.fill+loop", DTYPES, capacity, slots=2)
    labels = {f: f"bench.{f}" for f in DTYPES}

    def fill_producer(ring):
        def produce(state):  # what the logprobs producer calls: one ring.fill per step
            seg = state.setdefault("segments", collections.defaultdict(list))
            pr = state.get("prof")
            if pr is not None:
                pr.phase = "producer: ring.fill"
            t0 = ns()
            slot, event = ring.fill("bench", out, labels, "bench")
            t1 = ns()
            if pr is not None:
                pr.phase = "producer"
            previous, state["prev"] = state.get("prev"), ([slot.buffers[f] for f in DTYPES], event)
            seg["producer: ring.fill"].append(t1 - t0)
            return previous
        return produce

    def plugin_producer(ring, batched=True):
        def produce(state):  # the segments' times: a few perf_counter_ns reads per step, no wrappers
            seg = state.setdefault("segments", collections.defaultdict(list))
            pr = state.get("prof")  # instrumented runs: the parts are charged to their segment
            if pr is not None:
                pr.phase = "producer: ring.acquire"
            t0 = ns()
            slot = ring.acquire("bench", {f: list(glue.shape(t)) for f, t in out.items()})
            t1 = ns()
            if batched:  # the logprobs producer's call: 3 copies + the event
                if pr is not None:
                    pr.phase = "producer: backend.copy_d2h_many"
                t1 = ns()
                buffers = slot.buffers
                event = backend.copy_d2h_many([(buffers[f], out[f], labels[f]) for f in DTYPES], "bench")
                t3 = t2 = ns()
            else:
                if pr is not None:
                    pr.phase = "producer: 3 x backend.copy_d2h"
                t1 = ns()
                for f in DTYPES:
                    backend.copy_d2h(slot.buffers[f], out[f], labels[f])
                t2 = ns()
                if pr is not None:
                    pr.phase = "producer: backend.record"
                t2 = ns()
                event = backend.record("bench")
                t3 = ns()
            if pr is not None:
                pr.phase = "producer"
            previous, state["prev"] = state.get("prev"), ([slot.buffers[f] for f in DTYPES], event)
            seg["producer: ring.acquire"].append(t1 - t0)
            if batched:
                seg["producer: backend.copy_d2h_many"].append(t3 - t1)
            else:
                seg["producer: 3 x backend.copy_d2h"].append(t2 - t1)
                seg["producer: backend.record"].append(t3 - t2)
            return previous
        return produce

    def consumer_of(backend):
        return lambda previous, state: plugin_consume(previous, state, backend)

    def plugin_consume(previous, state, backend=backend):
        if previous is not None:
            buffers, event = previous
            pr = state.get("prof")
            if pr is not None:
                pr.phase = "consumer: backend.wait"
            t0 = ns()
            backend.wait(event, "consumer")
            t1 = ns()
            if pr is not None:
                pr.phase = "consumer: 3 x backend.read"
            t1 = ns()
            for buf in buffers:
                backend.read(buf, "consumer")
            t2 = ns()
            if pr is not None:
                pr.phase = "consumer"
            seg = state["segments"]
            seg["consumer: backend.wait"].append(t1 - t0)
            seg["consumer: 3 x backend.read"].append(t2 - t1)

    def blocking(state):  # FastDeploy 2.4: .cpu() = copy into pageable memory, stream sync
        for f in DTYPES:
            rt.memcpy_d2h_async(pageable[f].ctypes.data, glue.address(out[f]), nbytes[f], stream)
            rt.stream_synchronize(stream)
        return None

    def no_consume(previous, state):
        return None

    def per_step_pinned(state):  # FastDeploy 2.5: new pinned tensors + event every step
        for ptr in state.pop("free", []):  # last step's tensors dropped after the consumer read them
            rt.host_free(ptr)
        ptrs = [rt.host_alloc(nbytes[f]) for f in DTYPES]
        for ptr, f in zip(ptrs, DTYPES):
            rt.memcpy_d2h_async(ptr, glue.address(out[f]), nbytes[f], stream)
        event = rt.event_create(False)
        rt.event_record(event, stream)
        previous, state["prev"] = state.get("prev"), (ptrs, event)
        return previous

    def per_step_consume(previous, state):
        if previous is not None:
            ptrs, event = previous
            rt.event_synchronize(event)
            rt.event_destroy(event)
            for ptr, f in zip(ptrs, DTYPES):
                ctypes.string_at(ptr, nbytes[f])
            state["free"] = ptrs

    def per_step_cleanup(state):
        for ptr in state.pop("free", []):
            rt.host_free(ptr)
        if "prev" in state:
            ptrs, event = state.pop("prev")
            rt.event_synchronize(event)
            rt.event_destroy(event)
            for ptr in ptrs:
                rt.host_free(ptr)

    floor = {}
    if is_cuda:  # the unavoidable CUDA calls, arguments prebuilt: the physical limit from Python
        fns = rt._f
        memcpy, record_fn, sync_fn = fns["cudaMemcpyAsync"], fns["cudaEventRecord"], fns["cudaEventSynchronize"]
        floor_bufs = {f: rt.host_alloc(nbytes[f]) for f in DTYPES}
        floor_events = [rt.event_create() for _ in range(2)]
        s = ctypes.c_void_p(stream)
        args = [(ctypes.c_void_p(floor_bufs[f]), ctypes.c_void_p(glue.address(out[f])), nbytes[f], 2, s)
                for f in DTYPES]
        ev = [ctypes.c_void_p(e) for e in floor_events]

        def floor_produce(state):
            for a in args:
                memcpy(*a)
            i = state["i"] = state.get("i", 0) ^ 1
            record_fn(ev[i], s)
            return None if "started" not in state else ev[i ^ 1]

        def floor_consume(previous, state):
            state["started"] = True
            if previous is not None:
                sync_fn(previous)

        def floor_cleanup(state):
            rt.device_synchronize()

        floor = {"floor: 3 ctypes cudaMemcpyAsync + 1 cudaEventRecord": (floor_produce, floor_consume, floor_cleanup)}
        if batched is not None:  # the same calls from C: one ctypes call (fdac_d2h_batch)
            copies = ([floor_bufs[f] for f in DTYPES], [glue.address(out[f]) for f in DTYPES], [nbytes[f] for f in DTYPES])

            def one_set(rt):  # the C call on one copy set of these buffers, its sizes written once
                copy_set = _cudart.CopySet(rt.batch, copies[0], copies[2])
                copy_set._nbytes[:] = copies[2]
                return lambda dst, src, sizes, stream, event: copy_set.issue(src, None, stream, event)

            issue = one_set(batched.rt)

            def batch_produce(state):
                i = state["i"] = state.get("i", 0) ^ 1
                issue(*copies, stream, floor_events[i])
                return None if "started" not in state else ev[i ^ 1]

            floor["floor: fdac_d2h_batch (3 copies + record, one C call)"] = (batch_produce, floor_consume,
                                                                            floor_cleanup)
        if looped is not None:  # the same C call with the batch call off: a cudaMemcpyAsync each
            loop_issue = one_set(looped.rt)

            def loop_produce(state):
                i = state["i"] = state.get("i", 0) ^ 1
                loop_issue(*copies, stream, floor_events[i])
                return None if "started" not in state else ev[i ^ 1]

            floor["floor: fdac_d2h_batch, a cudaMemcpyAsync each"] = (loop_produce, floor_consume, floor_cleanup)

    variants = {
        "plugin: ring + copy_d2h_many": (plugin_producer(rings["plain"]), plugin_consume, None),
        "plugin, census on": (plugin_producer(rings["census"]), plugin_consume, None),
        "plugin, per-copy API: ring + copy_d2h + record": (plugin_producer(rings["per-copy"], False), plugin_consume,
                                                           None),
        "plugin: ring.fill (one ctypes call per copy)": (fill_producer(rings["fill"]), plugin_consume, None),
        **({"plugin: ring.fill + fdac_d2h_batch (default)": (fill_producer(rings["fill+batch"]), consumer_of(batched),
                                                             None)} if batched is not None else {}),
        **({"plugin: the same, a cudaMemcpyAsync each (CUDA < 12.8)": (fill_producer(rings["fill+loop"]),
                                                                       consumer_of(looped), None)}
           if looped is not None else {}),
        "FD 2.4: blocking copies": (blocking, no_consume, None),
        "FD 2.5: per-step pinned + event": (per_step_pinned, per_step_consume, per_step_cleanup),
        **floor,
    }
    return variants, list(rings.values())


def run_variant(name, fns, steps, warmup, busy, prof: Profiler | None, sync):
    produce, consume, cleanup = fns
    state: dict = {"prof": prof}
    producer, consumer = [], []
    census_on = name == "plugin, census on"
    ctx = collecting() if census_on else None
    if ctx is not None:
        ctx.__enter__()
    try:
        wall0 = ns()
        for step in range(warmup + steps):
            if step == warmup:
                sync()
                wall0 = ns()
                if prof is not None:
                    prof.reset()
                    prof.enabled = True
            busy()
            if census_on:
                census_module.begin_step()
            if prof is not None:
                prof.phase = "producer"
            t0 = ns()
            previous = produce(state)
            t1 = ns()
            if prof is not None:
                prof.phase = "consumer"
            consume(previous, state)
            previous = None  # the consumer is done with the last step's buffers (kept, they made the ring grow)
            t2 = ns()
            if step >= warmup:
                producer.append(t1 - t0)
                consumer.append(t2 - t1)
        sync()
        wall = (ns() - wall0) / steps
    finally:
        if prof is not None:
            prof.enabled = False
        if ctx is not None:
            ctx.__exit__(None, None, None)
    segments = {k: v[-steps:] for k, v in state.get("segments", {}).items()}
    if cleanup is not None:
        cleanup(state)
    state.clear()
    return {"producer": producer, "consumer": consumer, "wall": wall, "segments": segments}


# --- report -------------------------------------------------------------------------------------


def us(x_ns: float) -> str:
    return f"{x_ns / 1e3:8.1f}"


def per_round_ratios(plain, name, steps: int, against=("FD 2.4: blocking copies", "FD 2.5: per-step pinned + event")) -> str:
    """``name``'s producer + consumer over each reference's, round by round (each round's medians;
    the variants of a round ran back to back): the median ratio and the range over the rounds."""
    def rounds(r):
        pc = [a + b for a, b in zip(r["producer"], r["consumer"])]
        return [statistics.median(pc[i:i + steps]) for i in range(0, len(pc), steps)]

    mine, parts = rounds(plain[name]), []
    for ref in against:
        ratios = sorted(a / b for a, b in zip(mine, rounds(plain[ref])))
        parts.append(f"{statistics.median(ratios):.2f}x {ref.split(':')[0]} ({ratios[0]:.2f}-{ratios[-1]:.2f})")
    return f"{name.split(' (')[0]}, producer + consumer per round, median (range) over {len(mine)} rounds: " + ", ".join(parts)


def report_case(say, title, plain, profiled, calls, wrap_ns, steps_total, round_steps=None):
    say(f"  {title}: per decode step, median over the measured steps (p90); wall = loop time per step")
    say(f"    {'variant':52s} {'producer':>9s} {'(p90)':>9s} {'consumer':>9s} {'(p90)':>9s} {'prod+cons':>9s} "
        f"{'wall':>9s}   [instrumented: producer, consumer]")
    for name, r in plain.items():
        p, c = statistics.median(r["producer"]), statistics.median(r["consumer"])
        p90 = sorted(r["producer"])[int(0.9 * (len(r["producer"]) - 1))]
        c90 = sorted(r["consumer"])[int(0.9 * (len(r["consumer"]) - 1))]
        pc = statistics.median([a + b for a, b in zip(r["producer"], r["consumer"])])
        i = profiled[name]
        say(f"    {name:52s} {us(p)} {us(p90)} {us(c)} {us(c90)} {us(pc)} {us(r['wall'])}   "
            f"[{us(statistics.median(i['producer'])).strip()}, {us(statistics.median(i['consumer'])).strip()}]")
    default = "plugin: ring.fill + fdac_d2h_batch (default)"
    if default in plain:  # round by round: the host's speed drifts between rounds, not within one
        say("    " + per_round_ratios(plain, default, round_steps or steps_total))
    for name, r in plain.items():
        if r.get("segments"):
            say(f"    {name} - its steps in segments (plain runs; median, p90; a perf_counter_ns read between "
                f"segments, nothing wrapped):")
            for key, values in r["segments"].items():
                values = sorted(values)
                say(f"      {key:44s} {us(statistics.median(values))} {us(values[int(0.9 * (len(values) - 1))])}")
    say(f"  {title}: where the host time goes: exclusive us per step (mean) of each part in the instrumented "
        f"runs, and scaled to the plain run segment by segment (est. plain); calls per step")
    for name, r in profiled.items():
        parts = calls[name]
        say(f"    {name}")
        for phase in ("producer", "consumer"):
            mean_instr = sum(r[phase]) / len(r[phase])
            base_mean = sum(plain[name][phase]) / len(plain[name][phase])
            # Segments (the plugin's): each has an exact plain time; its parts are scaled to it by
            # plain / instrumented of that segment. The rest of the phase (no segment) likewise.
            segs = [k for k in (plain[name].get("segments") or {}) if k.startswith(phase + ": ")]
            exact = {k: sum(plain[name]["segments"][k]) / len(plain[name]["segments"][k]) for k in segs}
            instr = {k: sum(r["segments"][k]) / len(r["segments"][k]) for k in segs}
            exact[phase] = base_mean - sum(exact.values())
            instr[phase] = mean_instr - sum(instr.values())
            groups = collections.defaultdict(lambda: [0.0, 0.0])
            lines = []
            n_calls = 0.0
            for seg in [*segs, phase]:
                scale = exact[seg] / instr[seg] if instr[seg] > 0 else 0.0
                raw = {part: t / steps_total for (ph, part), t in parts["time"].items() if ph == seg}
                n = {part: parts["calls"][(seg, part)] / steps_total for part in raw}
                n_calls += sum(n.values())
                rest = instr[seg] - sum(raw.values())
                label = seg.split(": ", 1)[1] if seg != phase else "outside the segments" if segs else "the whole " + phase
                lines.append(f"        [{label}: {exact[seg] / 1e3:.1f} us plain, {instr[seg] / 1e3:.1f} instrumented, "
                             f"x{scale:.2f}]")
                for part in sorted(raw, key=lambda p: -raw[p]):
                    groups[group_of(part)][0] += raw[part]
                    groups[group_of(part)][1] += raw[part] * scale
                    lines.append(f"          . {part:56s} {raw[part] / 1e3:8.2f} {raw[part] * scale / 1e3:8.2f} us  "
                                 f"{n[part]:5.1f} calls")
                site = "unwrapped Python (step code; wrapper cost in the instrumented column)"
                groups[site][0] += rest
                groups[site][1] += rest * scale
                if raw:
                    lines.append(f"          . {'(unwrapped Python here)':56s} {rest / 1e3:8.2f} {rest * scale / 1e3:8.2f} us")
            say(f"      {phase}: plain mean {base_mean / 1e3:.1f} us, instrumented mean {mean_instr / 1e3:.1f} us "
                f"({n_calls:.0f} wrapped calls/step; a wrapped no-op costs ~{wrap_ns:.0f} ns)   [instrumented, est. plain]")
            for g, (t_raw, t_est) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
                say(f"        {g:68s} {t_raw / 1e3:8.2f} {t_est / 1e3:8.2f} us")
            for line in lines:
                say(line)


def run_step_copies(say, backend, batched, make_out, steps: int, rounds: int, sync, looped=None) -> None:
    """FD 2.4's default decode step: the stop flag, the sampled tokens and step_syncs' 4-copy snapshot,
    then the step's event (6 small copies, 1-128 elements), issued one by one (the fourth cut's
    ``after_update``) or as one ``copy_d2h_many`` (the fifth's), with and without fdac_d2h_batch.
    Host time to issue them (the event wait after each step is not timed)."""
    small, rows = make_out(1, 1), make_out(128, 1)
    sources = [small["ranks"], rows["ids"], rows["ranks"], small["ids"], rows["logprobs"], small["logprobs"]]
    variants = {}
    for name, b, batch in (("one by one: 6 x copy_d2h + record (fourth cut)", backend, False),
                           ("one copy_d2h_many, one ctypes call per copy", backend, True),
                           ("one copy_d2h_many + fdac_d2h_batch (default)", batched, True),
                           ("the same, a cudaMemcpyAsync each (CUDA < 12.8)", looped, True)):
        if b is None:
            continue
        glue = b.glue
        copies = [(b.new_pinned(list(glue.shape(t)), glue.dtype(t), f"step.{i}"), t, f"step.{i}")
                  for i, t in enumerate(sources)]

        def issue(b=b, copies=copies, batch=batch):
            if batch:
                return b.copy_d2h_many(copies, "post_process")
            for copy in copies:
                b.copy_d2h(*copy)
            return b.record("post_process")

        variants[name] = (b, issue)
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (b, issue) in variants.items():
            for step in range(steps + 20):
                t0 = ns()
                event = issue()
                t1 = ns()
                b.wait(event, "step")
                if step >= 20:
                    times[name].append(t1 - t0)
            sync()
    say("  a decode step's own copies on FD 2.4's default path (stop flag, tokens, 4-copy snapshot + the event; "
        "host time to issue them, median (p90)):")
    for name, values in times.items():
        values.sort()
        say(f"    {name:52s} {us(statistics.median(values))} {us(values[int(0.9 * (len(values) - 1))])}")


def run_changing_batch(say, batched, make_out, rows: int, k: int, every: int, steps: int, rounds: int, sync) -> None:
    """Serving: requests join and leave, so the decode batch changes size every few steps. Rows cycle
    through ``rows``, ``rows``-1, ... ``rows``-15, a new size every ``every`` steps (GPU idle): the
    default plugin path (each new shape given to the slot's buffers, its plan's sizes updated), the
    same without prepared plans (``_CopyPlan.prepare`` answers None: ``_issue`` every step), FD 2.4's
    blocking copies and FD 2.5's per-step pinned path on the same tensors; producer + consumer."""
    from fd_async_copy_plugin.runtime import cuda as cuda_module

    rt, glue = batched.rt, batched.glue
    stream, columns = glue.stream(0), k + 1
    outs = [make_out(rows - i, columns) for i in range(16)]
    nbytes = [{f: int(np.prod(glue.shape(t))) * np.dtype(DTYPES[f]).itemsize for f, t in out.items()} for out in outs]
    pageable = {f: np.empty(nbytes[0][f], dtype=np.uint8) for f in DTYPES}
    labels = {f: f"bench.{f}" for f in DTYPES}

    def plugin(planned):
        ring = PinnedRing(batched, f"bench.vary.{planned}", DTYPES, {f: n // np.dtype(DTYPES[f]).itemsize
                                                                    for f, n in nbytes[0].items()}, slots=2)
        prepare = cuda_module._CopyPlan.prepare if _CopyPlan is not None else None

        def step(i, state):
            t0 = ns()
            slot, event = ring.fill("bench", outs[i], labels, "bench")
            previous, state["prev"] = state.get("prev"), ([slot.buffers[f] for f in DTYPES], event)
            del slot
            t1 = ns()
            if previous is not None:
                batched.wait(previous[1], "consumer")
                for buf in previous[0]:
                    batched.read(buf, "consumer")
            return t0, t1, ns()

        def run(i, state):
            if planned or prepare is None:  # (one path from issue 36 on: nothing to turn off)
                return step(i, state)
            cuda_module._CopyPlan.prepare = classmethod(lambda cls, *a: None)
            try:
                return step(i, state)
            finally:
                cuda_module._CopyPlan.prepare = prepare
        return run

    def blocking(i, state):
        t0 = ns()
        for f in DTYPES:
            rt.memcpy_d2h_async(pageable[f].ctypes.data, glue.address(outs[i][f]), nbytes[i][f], stream)
            rt.stream_synchronize(stream)
        t1 = ns()
        return t0, t1, ns()

    def per_step(i, state):
        t0 = ns()
        for ptr in state.pop("free", []):
            rt.host_free(ptr)
        ptrs = [rt.host_alloc(nbytes[i][f]) for f in DTYPES]
        for ptr, f in zip(ptrs, DTYPES):
            rt.memcpy_d2h_async(ptr, glue.address(outs[i][f]), nbytes[i][f], stream)
        event = rt.event_create(False)
        rt.event_record(event, stream)
        previous, state["prev"] = state.get("prev"), (ptrs, event, i)
        t1 = ns()
        if previous is not None:
            ptrs, event, j = previous
            rt.event_synchronize(event)
            rt.event_destroy(event)
            for ptr, f in zip(ptrs, DTYPES):
                ctypes.string_at(ptr, nbytes[j][f])
            state["free"] = ptrs
        return t0, t1, ns()

    variants = {"plugin: ring.fill + fdac_d2h_batch (default)": plugin(True),
                "plugin, without prepared plans (_issue every step)": plugin(False),
                "FD 2.4: blocking copies": blocking, "FD 2.5: per-step pinned + event": per_step}
    plain = {name: {"producer": [], "consumer": []} for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            state: dict = {}
            for step in range(20 + steps):
                t0, t1, t2 = run((step // every) % len(outs), state)
                if step >= 20:
                    plain[name]["producer"].append(t1 - t0)
                    plain[name]["consumer"].append(t2 - t1)
            sync()
            for ptr in state.pop("free", []):
                rt.host_free(ptr)
            if "prev" in state and name.startswith("FD 2.5"):
                ptrs, event, _ = state.pop("prev")
                rt.event_synchronize(event)
                rt.event_destroy(event)
                for ptr in ptrs:
                    rt.host_free(ptr)
    say(f"  B={rows - 15}..{rows} K={k}, a new batch size every {every} step(s) (requests joining and leaving), GPU "
        f"idle: per decode step, median (p90), {rounds} interleaved rounds x {steps} steps")
    say(f"    {'variant':52s} {'producer':>9s} {'(p90)':>9s} {'consumer':>9s} {'(p90)':>9s} {'prod+cons':>9s}")
    for name, r in plain.items():
        p, c = sorted(r["producer"]), sorted(r["consumer"])
        pc = statistics.median([a + b for a, b in zip(r["producer"], r["consumer"])])
        say(f"    {name:52s} {us(statistics.median(p))} {us(p[int(0.9 * (len(p) - 1))])} "
            f"{us(statistics.median(c))} {us(c[int(0.9 * (len(c) - 1))])} {us(pc)}")
    say("    " + per_round_ratios(plain, "plugin: ring.fill + fdac_d2h_batch (default)", steps))
    say("    " + per_round_ratios(plain, "plugin, without prepared plans (_issue every step)", steps))


def build_batch_library() -> tuple[str | None, str]:
    """custom_ops/copy_batch.cc compiled alone (what the custom-ops module holds), or why not."""
    import shutil
    import subprocess
    import tempfile

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None, "not built (no g++): the ring.fill + fdac_d2h_batch variant is left out"
    out = Path(tempfile.mkdtemp(prefix="fdac-batch-")) / "libfd_async_copy_batch.so"
    done = subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", str(out), str(REPO / "custom_ops" / "copy_batch.cc")],
                          capture_output=True, text=True)
    if done.returncode:
        return None, f"not built ({cxx} failed: {done.stderr.strip()[:200]}): its variant is left out"
    return str(out), ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--sizes", default="128,1024", help="batch sizes B (comma-separated)")
    parser.add_argument("--k", type=int, default=20, help="logprobs K (K+1 columns)")
    parser.add_argument("--steps", type=int, default=200, help="measured steps per variant and round")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (steps pooled)")
    parser.add_argument("--busy-ms", type=float, default=2.0, help="GPU work queued per step when busy")
    parser.add_argument("--changing", type=int, default=2, metavar="N",
                        help="also a decode batch that changes size every N steps (0: not run; needs the batch)")
    parser.add_argument("--batch-lib", help="a built custom_ops/copy_batch.cc (default: compiled here with g++)")
    parser.add_argument("--output", help="also write the report here")
    parser.add_argument("--json", help="also write every step's times and the parts' totals here (JSON)")
    args = parser.parse_args(argv)
    say = _report.Report("host_cost_breakdown.py", argv)
    logging.getLogger("fd_async_copy").setLevel(logging.ERROR)  # the rings' warm-up growth
    sizes = [int(s) for s in args.sizes.split(",") if s]

    if args.device == "cuda":
        import torch

        from fd_async_copy_plugin.runtime.cuda import CudaBackend
        from fd_async_copy_plugin.runtime.cudart import CudaRuntime
        from _torch_glue import TorchGlue, TorchProbeOps

        assert torch.cuda.is_available(), "--device cuda needs a GPU (use --device cpu for the smoke path)"
        torch.cuda.init()
        current = torch.cuda.Stream()  # a non-default current stream, as in FD
        torch.cuda.set_stream(current)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(2_000_000)
        end.record()
        end.synchronize()
        per_ms = 2_000_000 / start.elapsed_time(end)
        cycles = int(args.busy_ms * per_ms)
        rt = CudaRuntime()
        backend = CudaBackend(glue=TorchGlue(), rt=rt, probe_ops=TorchProbeOps(cycles))
        backend.ensure_probed(0)
        batch_lib, why, batched, looped = args.batch_lib, "", None, None
        if batch_lib is None:
            batch_lib, why = build_batch_library()
        if batch_lib is not None:  # what the plugin's CudaBackend uses: the process's runtime + the helper
            batch_rt = CudaRuntime()
            batch_rt.use_batch(ctypes.CDLL(batch_lib))
            batched = CudaBackend(glue=backend.glue, rt=batch_rt, probe_ops=TorchProbeOps(cycles))
            batched.ensure_probed(0)  # (its batch_api check turns cudaMemcpyBatchAsync on where it works)
            if getattr(batch_rt.batch, "batch_api_state", "").startswith("on"):  # a row without it, for CUDA < 12.8
                loop_rt = CudaRuntime()
                loop_rt.use_batch(ctypes.CDLL(batch_lib))
                loop_rt.batch.use_batch_api(False, "this script's comparison row")
                looped = CudaBackend(glue=backend.glue, rt=loop_rt, probe_ops=TorchProbeOps(cycles))
                looped.ensure_probed(0)
        say(f"fdac_d2h_batch: {batch_lib or why}; cudaMemcpyBatchAsync: "
            f"{getattr(batched.rt.batch, 'batch_api_state', 'not in this tree') if batched is not None else '-'}")
        say(f"framework (device tensors and the stream only): PyTorch {torch.__version__}, "
            f"{torch.cuda.get_device_name(0)}; Paddle imported: {'paddle' in sys.modules}")
        say(f"CUDA layer: {rt.versions()}; accessor probe: {'ok' if backend.probes[0]['ok'] else 'FAILED'}")
        device = torch.device("cuda:0")

        def make_out(rows, columns):
            base = torch.arange(rows * columns, device=device, dtype=torch.int64).view(rows, columns)
            return {"ids": base % 150_000, "logprobs": base.to(torch.float32) * -1e-3,
                    "ranks": torch.arange(rows, device=device, dtype=torch.int64)}

        cases = [(False, lambda: None), (True, lambda: torch.cuda._sleep(cycles))]
        sync = torch.cuda.synchronize
    else:
        from fd_async_copy_plugin.runtime.host import HostBackend

        backend, batched, looped = HostBackend(glue=NumpyGlue()), None, None
        say("device cpu: the host backend (HostRuntime: memmove copies, events always complete) with numpy "
            "arrays as the framework - a smoke path, not a CUDA measurement")

        def make_out(rows, columns):
            base = np.arange(rows * columns, dtype=np.int64).reshape(rows, columns)
            return {"ids": HostTensor(base % 150_000), "logprobs": HostTensor(base.astype(np.float32) * -1e-3),
                    "ranks": HostTensor(np.arange(rows, dtype=np.int64))}

        cases = [(False, lambda: None)]
        sync = lambda: None  # noqa: E731

    prof = Profiler()
    wrap_ns = prof.overhead_ns()
    raw_data: list = []
    say(f"B in {sizes}, K={args.k}; {args.rounds} interleaved round(s) x {args.steps} measured steps (+{args.warmup} "
        f"warm-up) per variant, plain and instrumented; a wrapped no-op costs ~{wrap_ns:.0f} ns")
    say("producer = issuing this step's copies (+ event); consumer = the next step's wait on it and the host reads; "
        "FD 2.4's consumer reads nothing (its .cpu() already waited)")
    for rows in sizes:
        columns = args.k + 1
        out = make_out(rows, columns)
        variants, rings = make_variants(backend, out, args.device == "cuda", batched, looped)

        def instrumented():  # the wrappers, installed for the instrumented runs only (plain runs: none)
            instrument(prof, backend, rings)
            for other in (batched, looped):
                if other is not None:
                    instrument(prof, other, [], glue=False)
            if batched is not None and CopySet is not None:  # (class-wide, once: sets come and go)
                prof.wrap(CopySet, "issue", "ctypes fdac_d2h_set_issue (the CUDA calls: one C call)")
            elif batched is not None:  # a tree before issue 36: a ring slot's prepared fill
                prof.wrap(PreparedBatch, "issue", "ctypes fdac_d2h_batch_prepared (the CUDA calls: one C call)")
                # (``issue`` before the eighth cut: this script also drives an older tree's package)
                prof.wrap(_CopyPlan, "replay" if hasattr(_CopyPlan, "replay") else "issue", "backend: copy_d2h")

        try:
            for busy, busy_fn in cases:
                plain = {name: {"producer": [], "consumer": [], "wall": []} for name in variants}
                profiled = {name: {"producer": [], "consumer": [], "wall": []} for name in variants}
                calls = {name: {"time": collections.Counter(), "calls": collections.Counter()} for name in variants}
                for _ in range(args.rounds):
                    for name, fns in variants.items():
                        r = run_variant(name, fns, args.steps, args.warmup, busy_fn, None, sync)
                        for key in ("producer", "consumer"):
                            plain[name][key] += r[key]
                        for key, values in r["segments"].items():
                            plain[name].setdefault("segments", {}).setdefault(key, []).extend(values)
                        plain[name]["wall"].append(r["wall"])
                        instrumented()
                        try:
                            r = run_variant(name, fns, args.steps, args.warmup, busy_fn, prof, sync)
                        finally:
                            prof.restore()
                        for key in ("producer", "consumer"):
                            profiled[name][key] += r[key]
                        for key, values in r["segments"].items():
                            profiled[name].setdefault("segments", {}).setdefault(key, []).extend(values)
                        calls[name]["time"].update(prof.time)
                        calls[name]["calls"].update(prof.calls)
                for d in (plain, profiled):
                    for r in d.values():
                        r["wall"] = statistics.median(r["wall"]) if r["wall"] else 0.0
                nb = rows * columns * 12 + rows * 8
                title = (f"B={rows} K={args.k} ({nb} bytes/step), GPU "
                         + (f"busy (~{args.busy_ms:.1f} ms queued per step)" if busy else "idle"))
                if args.device == "cpu":
                    title = f"B={rows} K={args.k} ({nb} bytes/step), host backend"
                report_case(say, title, plain, profiled, calls, wrap_ns, args.steps * args.rounds, args.steps)
                say("    ring slots after the runs (2: a consumer one step behind, the common step throughout): "
                    + ", ".join(f"{ring.name} {len(ring.slots)}" for ring in rings))
                raw_data.append({"title": title, "plain": plain, "instrumented": profiled, "parts": {
                    name: [[ph, part, t, calls[name]["calls"][(ph, part)]] for (ph, part), t in c["time"].items()]
                    for name, c in calls.items()}})
        finally:
            prof.restore()
        sync()
    run_step_copies(say, backend, batched, make_out, args.steps, args.rounds, sync, looped)
    if batched is not None and args.changing:
        for rows in sizes:
            run_changing_batch(say, batched, make_out, rows, args.k, args.changing, args.steps, args.rounds, sync)
    say("The figures are host times of this script's loop; the breakdown's 'exclusive' time of a part excludes "
        "the wrapped parts it calls; 'call-site Python' is the step code around the calls (FD's own in production).")
    say("RESULT: MEASURED")
    if args.output:
        Path(args.output).write_text(say.text())
    if args.json:
        Path(args.json).write_text(json.dumps({"wrap_ns": wrap_ns, "steps": args.steps * args.rounds,
                                               "cases": raw_data}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
