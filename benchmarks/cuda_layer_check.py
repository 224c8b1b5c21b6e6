#!/usr/bin/env python3
"""H200 check of the CUDA layer and the ``cuda`` backend, without Paddle.

PyTorch provides device tensors and the current stream only (``TorchGlue`` in ``_torch_glue.py``
is the whole framework binding); everything else is the plugin's own code, imported from the repository:
``runtime.cudart`` (the layer: ctypes on the CUDA runtime PyTorch loaded), ``runtime.cuda.CudaBackend``
(pinned buffers from cudaHostAlloc, cudaMemcpyAsync on the current stream, blocking-sync events),
``runtime.ring.PinnedRing``, ``runtime.census``, ``runtime.probe`` and the stop-flag kernels
(``ops.stop_flag_library``). It runs a decode-loop model with ~2 ms of GPU work queued per step:

1. probe: the accessor probe (current device, data_ptr, stream order, kernel order, pinned wrap)
   passes with PyTorch's accessors, and fails on planted wrong answers (wrong stream, wrong address);
2. correctness with real asynchronous copies, B in 1..1024, logprobs K in 0/1/20 and -1 (vocab
   150k), prompt chunks, consumers lagging 0/1/10 steps: every byte equals a blocking reference;
   every host read is checked against a CUDA event recorded right after the copy (a read before it
   completed raises - and a planted early read is caught); the ring never hands out a slot a
   consumer still holds; zero pinned allocations per step after warm-up; a buffer released while
   its copy is in flight does not corrupt the memory allocated next; then the same (fewer sizes)
   with each step's copies and event issued by ``fdac_d2h_batch`` (``custom_ops/copy_batch.cc``,
   compiled with g++), as ``CudaBackend`` issues them when the custom ops are built;
3. two threads: one launches steps (kernel + copies + event) while the other waits on events; the
   launcher is not stalled with the layer's waits (GIL released), and is with a GIL-holding wait;
4. host time per decode step on the output copies, side by side, GPU idle and busy: the plugin's
   ring + event vs FastDeploy 2.4's blocking copies vs FastDeploy 2.5's per-step pinned
   allocation + copy + event + free, all through the same runtime calls.

Targets (RESULT: PASS/FAIL): GPU busy, plugin host time per step <= 1/10 of blocking and below
per-step pinned; 0 pinned allocations per step after warm-up; everything in 1-3 holds.

    python3 benchmarks/cuda_layer_check.py [--cuda-lib libfd_async_copy_cuda.so] [--quick] [--output FILE]

``--quick`` (for compute-sanitizer) runs 1-2 on fewer sizes and skips 3-4.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import logging

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fd_async_copy_plugin.ops.stop_flag_library import StopFlagLibrary  # noqa: E402
from fd_async_copy_plugin.runtime import PinnedRing, collecting  # noqa: E402
from fd_async_copy_plugin.runtime.backend import AsyncCopyError, host_view  # noqa: E402
from fd_async_copy_plugin.runtime import cuda as cuda_module  # noqa: E402
from fd_async_copy_plugin.runtime.cuda import CudaBackend  # noqa: E402
from fd_async_copy_plugin.runtime.cudart import CudaRuntime  # noqa: E402
from fd_async_copy_plugin.runtime.probe import probe_accessors  # noqa: E402

assert "paddle" not in sys.modules, "the layer, backend and ring must import without Paddle"

import torch  # noqa: E402  (after the assertion: the plugin's modules imported without it)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _torch_glue import TorchGlue, TorchProbeOps  # noqa: E402 - benchmarks/_torch_glue.py

VOCAB = 150_000
MAX_PINNED_BYTES = 64 << 20  # patches/logprobs.py: above it, FastDeploy's blocking copies
DTYPES = {"ids": "int64", "logprobs": "float32", "ranks": "int64"}
LABELS = {f: f"gather_logprobs.{f}" for f in DTYPES}
OUT = io.StringIO()
FAILURES: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    OUT.write(line + "\n")


def check(ok: bool, what: str) -> bool:
    say(f"  {'OK  ' if ok else 'FAIL'} {what}")
    if not ok:
        FAILURES.append(what)
    return ok


class CountingRuntime(CudaRuntime):
    """The real layer, counting pinned allocations and frees."""

    allocs = frees = 0

    def host_alloc(self, nbytes):
        CountingRuntime.allocs += 1
        return super().host_alloc(nbytes)

    def host_free(self, ptr):
        CountingRuntime.frees += 1
        return super().host_free(ptr)


class HostReadBeforeEvent(AsyncCopyError):
    pass


class CheckedBackend(CudaBackend):
    """CudaBackend plus an independent witness: a CUDA event recorded right after every copy into
    a buffer. A host read of the buffer while that event is not complete raises."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._witness: dict[int, int] = {}
        self.checked_reads = self.witnessed = 0

    # Every way a copy is issued - copy_d2h, copy_d2h_many and ring.fill, through ``_issue`` or a
    # prepared plan's one C call (``_CopyPlan``) - ends here: a witness event per destination,
    # recorded on its source's stream right after the copies.
    def copy_d2h(self, dst, src, label):
        super().copy_d2h(dst, src, label)
        self._witnessed([(dst, src)])

    def copy_d2h_many(self, copies, label):
        event = super().copy_d2h_many(copies, label)
        self._witnessed([(dst, src) for dst, src, _ in copies])
        return event

    def fill(self, ring, writer, sources, labels, label, reserve=None):
        slot, event = super().fill(ring, writer, sources, labels, label, reserve)
        self._witnessed([(slot.buffers[f], src) for f, src in sources.items()])
        return slot, event

    def _witnessed(self, copies) -> None:
        for dst, src in copies:
            witness = self._witness.get(id(dst))
            if witness is None:
                witness = self._witness[id(dst)] = self.rt.event_create(False)
            self.rt.event_record(witness, self.glue.stream(self.glue.gpu_device(src)))
            self.witnessed += 1

    def read(self, buf, reader, start=None, end=None):  # (every host read of a pinned buffer goes here)
        event = self._witness.get(id(buf))
        self.checked_reads += 1
        if event is not None and not self.rt.event_query(event):
            raise HostReadBeforeEvent(f"{reader}: host read of a pinned buffer before its copy completed")
        return super().read(buf, reader, start, end)


# --- helpers ----------------------------------------------------------------------------------


def sleep_cycles_per_ms() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    end.synchronize()
    return 2_000_000 / start.elapsed_time(end)


def build_cuda_library(path: str | None) -> StopFlagLibrary:
    if path:
        return StopFlagLibrary(path, "cuda")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = Path(tempfile.mkdtemp()) / "libfd_async_copy_cuda.so"
    major, minor = torch.cuda.get_device_capability(0)
    cmd = [nvcc, "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", f"-I{REPO / 'custom_ops'}",
           "-gencode", f"arch=compute_{major}{minor},code=sm_{major}{minor}", "-o", str(out),
           str(REPO / "custom_ops" / "stop_flag_kernels.cu")]
    subprocess.run(cmd, check=True)
    return StopFlagLibrary(out, "cuda")


def step_tensors(step: int, rows: int, columns: int, device):
    """This step's logprob results, made on the current stream (after the step's queued work)."""
    base = torch.arange(rows * columns, device=device, dtype=torch.int64).view(rows, columns)
    ids = (base * 31 + step * 7) % VOCAB
    logprobs = ids.to(torch.float32) * -1e-3 - step
    ranks = torch.arange(rows, device=device, dtype=torch.int64) + step
    return {"ids": ids, "logprobs": logprobs, "ranks": ranks}


def over_cap(rows: int, columns: int) -> bool:
    return rows * columns * 8 > MAX_PINNED_BYTES


class StopFlagState:
    """Device state of the stop-flag kernel for ``bsz`` slots (update_inputs, FD 2.5 semantics)."""

    def __init__(self, bsz: int, device) -> None:
        z32 = lambda: torch.zeros(bsz, dtype=torch.int32, device=device)  # noqa: E731
        self.stop_flags = torch.zeros(bsz, dtype=torch.bool, device=device)
        self.not_need_stop = torch.zeros(1, dtype=torch.bool, device=device)
        self.seq_lens = [z32(), z32(), z32()]
        self.input_ids = torch.zeros(bsz, 1, dtype=torch.int64, device=device)
        self.is_block_step = torch.zeros(bsz, dtype=torch.bool, device=device)
        self.bsz = bsz

    def launch(self, lib, next_tokens, stream: int, step: int) -> None:
        if step % 3 == 2:
            self.stop_flags.fill_(True)  # every third step: all slots stopped -> flag False
        else:
            self.stop_flags.fill_(False)
        status = lib.update_inputs(
            self.stop_flags.data_ptr(), self.not_need_stop.data_ptr(), *(s.data_ptr() for s in self.seq_lens),
            self.input_ids.data_ptr(), None, next_tokens.data_ptr(), self.is_block_step.data_ptr(),
            bsz=self.bsz, max_bsz=self.bsz, input_ids_stride=1, stream=stream,
        )
        if status != 0:
            raise RuntimeError(lib.message(status))


# --- 1. probe ---------------------------------------------------------------------------------


def run_probe(backend, lib, ops) -> None:
    say("probe (accessors vs layer, PyTorch's accessors):")
    result = backend.ensure_probed(0, kernels=lib, ops=ops)
    for c in result["checks"]:
        say(f"    {c['check']:15s} {'ok' if c['ok'] else 'FAILED'}: {c['detail']}")
    check(result["ok"], f"probe passes on gpu:0 ({result['seconds'] * 1e3:.1f} ms)")

    class WrongStream(TorchGlue):
        other = torch.cuda.Stream()

        def stream(self, device):
            return int(self.other.cuda_stream)

    class WrongAddress(TorchGlue):
        def address(self, t):
            return int(t.data_ptr()) + (8 if t.is_cuda else 0)

    planted = probe_accessors(0, glue=WrongStream(), rt=backend.rt, ops=ops, kernels=lib)
    bad = [c["check"] for c in planted["checks"] if not c["ok"]]
    # Either ordering check may catch it (under compute-sanitizer, which serialises work, the
    # copy on the wrong stream can happen to run late; the kernel read still comes early).
    check(bool(bad) and set(bad) <= {"stream_order", "kernel_order"},
          f"planted wrong stream handle is caught: failed checks {bad}")
    planted = probe_accessors(0, glue=WrongAddress(), rt=backend.rt, ops=ops)
    bad = [c["check"] for c in planted["checks"] if not c["ok"]]
    check(not planted["ok"] and "data_ptr" in bad, f"planted wrong data_ptr is caught: failed checks {bad}")


# --- 2. correctness ---------------------------------------------------------------------------


def decode_run(backend, lib, rows, k, lag, steps, cycles, device, vary: bool = False) -> dict:
    """``vary``: the batch changes size every other step (B, 7B/8, 6B/8, 5B/8: requests joining and
    leaving), so the ring's slots are given new shapes - the prepared plans' resized replays."""
    columns = VOCAB + 1 if k == -1 else k + 1
    ring = PinnedRing(backend, "logprobs.decode", DTYPES,
                      {"ids": rows * 21, "logprobs": rows * 21, "ranks": rows}, slots=2)
    flag = backend.new_pinned([1], "bool", "not_need_stop")
    tokens = backend.new_pinned([rows, 1], "int64", "sampled_token_ids")
    state = StopFlagState(rows, device)
    stream = backend.glue.stream(0)
    held: collections.deque = collections.deque()
    mismatches = reused = blocking_steps = 0
    allocs_before = CountingRuntime.allocs
    warmup = lag + 3
    with collecting() as census:
        for step in range(steps):
            census.begin_step()
            if step == warmup:
                allocs_before = CountingRuntime.allocs
            torch.cuda._sleep(cycles)  # the step's model work, queued ahead of its outputs
            out = step_tensors(step, rows - (step // 2 % 4) * (rows // 8) if vary else rows, columns, device)
            next_tokens = torch.arange(rows, device=device, dtype=torch.int64) + step
            state.launch(lib, next_tokens, stream, step)
            expect_flag = step % 3 != 2
            if over_cap(rows, columns):
                blocking_steps += 1
                payload = {f: backend.blocking_d2h(t, f) for f, t in out.items()}
                slot = None
            else:
                # the logprobs producer's call: a free slot, the three copies, their event
                slot, _ = ring.fill("gather_logprobs", out, LABELS, "gather_logprobs",
                                    reserve={f: rows * columns if f != "ranks" else rows for f in DTYPES})
                for entry in held:
                    if entry[1] is not None and any(slot.buffers[f] is entry[1][f] for f in DTYPES):
                        reused += 1
                payload = {f: slot.buffers[f] for f in DTYPES}
            # the stop flag's after_update: the flag and the tokens, and the step's event, in one call
            backend.copy_d2h_many([(flag, state.not_need_stop, "not_need_stop"),
                                   (tokens, state.input_ids, "sampled_token_ids")], "post_process")
            # the flag is consumed in the same step (FD's loop condition), after its event
            got_flag = bool(backend.to_host(flag, "not_need_stop")[0])
            got_tokens = backend.to_host(tokens, "sampled_tokens").numpy().reshape(-1)
            mismatches += got_flag != expect_flag
            mismatches += not np.array_equal(got_tokens, next_tokens.cpu().numpy())
            held.append((step, payload if slot is not None else None, out, payload))
            while len(held) > lag:
                _, _, ref, data = held.popleft()
                for f in DTYPES:
                    host = backend.to_host(data[f], f"consumer.{f}") if backend.is_pinned(data[f]) else data[f]
                    if not np.array_equal(host.numpy(), ref[f].cpu().numpy()):
                        mismatches += 1
            payload = data = host = slot = out = ref = None  # only ``held`` keeps buffers referenced
        allocs_after = CountingRuntime.allocs - allocs_before
        per_step = census.per_step(skip=warmup)
    held.clear()
    return {"mismatches": mismatches, "reused": reused, "ring": ring.size, "grow": ring.grow_events,
            "pinned_per_step": per_step["pinned_alloc"], "runtime_allocs_after_warmup": allocs_after,
            "blocking_steps": blocking_steps}


def prompt_chunks(backend, k, chunks, device) -> int:
    columns = VOCAB + 1 if k == -1 else k + 1
    ring = PinnedRing(backend, "logprobs.prompt", DTYPES, {"ids": 1, "logprobs": 1, "ranks": 1}, slots=1)
    mismatches = 0
    for i, rows in enumerate(chunks):
        out = step_tensors(100 + i, rows, columns, device)
        if over_cap(rows, columns):
            host = {f: backend.blocking_d2h(t, f) for f, t in out.items()}
        else:
            slot = ring.acquire("prompt", {f: list(t.shape) for f, t in out.items()})
            for f in DTYPES:
                backend.copy_d2h(slot.buffers[f], out[f], f)
            backend.record("prompt")
            host = {f: backend.to_host(slot.buffers[f], "prompt") for f in DTYPES}
        mismatches += sum(not np.array_equal(host[f].numpy(), out[f].cpu().numpy()) for f in DTYPES)
    return mismatches


REPLAYS = [0]  # prepared plans replayed during the correctness runs (``_CopyPlan.replay`` answers)


def run_correctness(backend, lib, cycles, quick: bool, device) -> None:
    """The checks below, with the default path's C calls counted: on the batched runtime the default
    path must have run - a prepared plan's replay before issue 36, a copy set's ``CopySet.issue`` after."""
    plan_cls = getattr(cuda_module, "_CopyPlan", None)
    if plan_cls is None:  # one copy path (issue 36): every copy set's C call
        from fd_async_copy_plugin.runtime import cudart as cudart_module

        owner, name = cudart_module.CopySet, "issue"
    else:
        owner, name = plan_cls, "replay" if hasattr(plan_cls, "replay") else "issue"  # (``issue`` in an older tree)
    plan_replay = getattr(owner, name)

    def counted(this, *args):
        event = plan_replay(this, *args)  # (a plan's replay answers None when it declined; a CopySet's issue, None)
        REPLAYS[0] += plan_cls is None or event is not None
        return event

    before = REPLAYS[0]
    setattr(owner, name, counted)
    try:
        _run_correctness(backend, lib, cycles, quick, device)
    finally:
        setattr(owner, name, plan_replay)
    if backend.rt.batch is not None:
        check(REPLAYS[0] > before, f"{REPLAYS[0] - before} copy calls went through the default path's C call; "
                                   f"{backend.witnessed} witness events recorded")


def _run_correctness(backend, lib, cycles, quick: bool, device) -> None:
    say("correctness (real asynchronous copies; every host read checked against a CUDA event):")
    batch_sizes = [1, 64, 1024] if quick else [1, 7, 64, 256, 1024]
    ks = [0, 20] if quick else [0, 1, 20, -1]
    lags = [0, 1] if quick else [0, 1, 10]
    steps = 8 if quick else 16
    total = {"runs": 0, "mismatches": 0, "reused": 0, "pinned_after_warmup": 0.0, "runtime_allocs": 0}
    for k in ks:
        # whole-vocabulary rows: 36 fit the 64 MiB pinned cap, 64 take FastDeploy's blocking path
        for rows in (batch_sizes if k != -1 else ([1, 36] if quick else [1, 7, 36, 64])):
            for lag in lags:
                r = decode_run(backend, lib, rows, k, lag, steps, cycles, device)
                total["runs"] += 1
                total["mismatches"] += r["mismatches"]
                total["reused"] += r["reused"]
                total["pinned_after_warmup"] += r["pinned_per_step"]
                total["runtime_allocs"] += r["runtime_allocs_after_warmup"]
                say(f"    B={rows:5d} K={k:3d} lag={lag:2d}: mismatches {r['mismatches']}, held slot reused "
                    f"{r['reused']}, ring {r['ring']} slots ({r['grow']} grown in warm-up), pinned allocs/step "
                    f"after warm-up {r['pinned_per_step']:.2f} (cudaHostAlloc calls {r['runtime_allocs_after_warmup']})"
                    + (f", {r['blocking_steps']} steps over the pinned cap copied blocking" if r["blocking_steps"] else ""))
    for k in [k for k in ks if k != -1]:
        for rows in [64] if quick else [64, 1024]:
            for lag in lags:
                r = decode_run(backend, lib, rows, k, lag, steps, cycles, device, vary=True)
                total["runs"] += 1
                total["mismatches"] += r["mismatches"]
                total["reused"] += r["reused"]
                say(f"    B={rows - 3 * (rows // 8)}..{rows} changing K={k:3d} lag={lag:2d}: mismatches {r['mismatches']}, "
                    f"held slot reused {r['reused']}, ring {r['ring']} slots")
    check(total["mismatches"] == 0, f"{total['runs']} decode runs: every byte equals the blocking reference")
    check(total["reused"] == 0, "the ring never handed out a slot a lagging consumer held (lag 0/1/10)")
    check(total["pinned_after_warmup"] == 0 and total["runtime_allocs"] == 0,
          "zero pinned allocations per step after warm-up (census and cudaHostAlloc count)")
    check(backend.checked_reads > 0, f"{backend.checked_reads} host reads, each after its copy's CUDA event")
    chunks = [512, 2048] if quick else [128, 512, 2048, 8192]
    bad = sum(prompt_chunks(backend, k, chunks, device) for k in ks)
    check(bad == 0, f"prompt chunks {chunks} x K {ks}: every byte equals the blocking reference")

    # planted: a host read right after the copy, GPU busy -> the witness must catch it
    buf = backend.new_pinned([1 << 16], "int64", "early")
    torch.cuda._sleep(cycles * 3)
    src = torch.full((1 << 16,), 5, dtype=torch.int64, device=device)
    backend.copy_d2h(buf, src, "early")
    try:
        backend.read(buf, "too-early")
        caught = False
    except HostReadBeforeEvent:
        caught = True
    stale = not (host_view(buf, backend.glue) == 5).all()
    check(caught, f"a planted host read before the event is caught (the data was {'stale' if stale else 'already there'})")
    torch.cuda.synchronize()
    del buf
    if backend.rt.batch is not None:  # the same on a replayed plan: a ring slot's fill and a step's copies
        ring = PinnedRing(backend, "early.plan", DTYPES, {"ids": 128 * 21, "logprobs": 128 * 21, "ranks": 128}, slots=1)
        step_buf = backend.new_pinned([1 << 16], "int64", "early.step")
        caught = []
        for attempt in range(2):  # the first call prepares each plan, the second replays it
            torch.cuda._sleep(cycles * 3)
            out = step_tensors(7 + attempt, 128, 21, device)
            src = torch.full((1 << 16,), 9 + attempt, dtype=torch.int64, device=device)
            before = REPLAYS[0]
            slot, event = ring.fill("early", out, LABELS, "early")
            step_event = backend.copy_d2h_many([(step_buf, src, "early.step")], "early.step")
            replayed = REPLAYS[0] - before
            for buf in (slot.buffers["ids"], step_buf) if attempt else ():
                try:
                    backend.read(buf, "too-early")
                    caught.append(False)
                except HostReadBeforeEvent:
                    caught.append(True)
            backend.wait(event, "after")
            backend.wait(step_event, "after")
            del slot
        check(replayed == 2 and caught == [True, True],
              f"a planted host read right after a replayed plan is caught (ring fill, step copies: {caught}; "
              f"{replayed} of 2 calls replayed)")
        torch.cuda.synchronize()
        del ring, step_buf

    # release while a copy is in flight, then allocate again: the new memory must stay intact
    n = 1 << 20
    old = backend.new_pinned([n], "int64", "released")
    old_ptr = backend.memory_of(old).ptr
    torch.cuda._sleep(cycles * 5)
    src = torch.full((n,), 3, dtype=torch.int64, device=device)
    backend.copy_d2h(old, src, "in-flight")
    start = time.perf_counter()
    backend.free_pinned(old, "released")
    del old
    gc.collect()
    release_ms = (time.perf_counter() - start) * 1e3
    new = backend.new_pinned([n], "int64", "next")
    host_view(new, backend.glue)[:] = -1
    torch.cuda.synchronize()
    intact = bool((host_view(new, backend.glue) == -1).all())
    same = backend.memory_of(new).ptr == old_ptr
    check(intact, f"release while a copy is in flight (~10 ms queued): release took {release_ms:.2f} ms (event "
                  f"wait, then cudaFreeHost); the next allocation ({'same' if same else 'another'} address) is intact")
    del new
    # for the record: a plain cudaFreeHost with a copy in flight
    rt = backend.rt
    ptr = rt.host_alloc(n * 8)
    torch.cuda._sleep(cycles * 5)
    src = torch.full((n,), 4, dtype=torch.int64, device=device)
    rt.memcpy_d2h_async(ptr, src.data_ptr(), n * 8, backend.glue.stream(0))
    start = time.perf_counter()
    rt.host_free(ptr)
    say(f"    (for the record: a bare cudaFreeHost with a copy in flight returned after "
        f"{(time.perf_counter() - start) * 1e3:.2f} ms; with ~10 ms queued)")
    torch.cuda.synchronize()


# --- 3. two threads ---------------------------------------------------------------------------


def run_two_threads(backend, lib, cycles, device) -> None:
    say("two threads: the main thread launches steps while another thread waits on events:")
    rt = backend.rt
    gil_holding = ctypes.PyDLL(rt.lib._name, mode=getattr(os, "RTLD_NOLOAD", 0))
    gil_sync = gil_holding.cudaEventSynchronize
    gil_sync.argtypes, gil_sync.restype = [ctypes.c_void_p], ctypes.c_int
    side = torch.cuda.Stream()
    state = StopFlagState(128, device)
    tokens = torch.zeros(128, dtype=torch.int64, device=device)
    flag = backend.new_pinned([1], "bool", "flag")
    stream = backend.glue.stream(0)
    results = {}
    for mode in ("layer wait (GIL released)", "GIL-holding wait (like Paddle's Event.synchronize)"):
        stop = threading.Event()
        waits = []

        def waiter():
            event = rt.event_create(True)
            while not stop.is_set():
                with torch.cuda.stream(side):
                    torch.cuda._sleep(cycles * 10)  # ~20 ms on another stream
                rt.event_record(event, int(side.cuda_stream))
                t0 = time.perf_counter()
                if mode.startswith("layer"):
                    rt.event_synchronize(event)
                else:
                    gil_sync(event)
                waits.append(time.perf_counter() - t0)
            rt.event_destroy(event)

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.005)
        lat = []
        end = time.perf_counter() + 0.6
        step = 0
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            state.launch(lib, tokens, stream, step)
            backend.copy_d2h(flag, state.not_need_stop, "flag")
            backend.record("flag")
            lat.append(time.perf_counter() - t0)
            step += 1
            time.sleep(0.0002)
        stop.set()
        thread.join()
        backend.wait(backend.record("drain"), "drain")
        lat_us = sorted(x * 1e6 for x in lat)
        results[mode] = lat_us
        say(f"    {mode:52s}: {len(lat_us)} launches in 0.6 s, launch host time median {statistics.median(lat_us):7.1f} us, "
            f"p99 {lat_us[int(0.99 * (len(lat_us) - 1))]:8.1f} us, max {lat_us[-1]:8.1f} us; waiter waited "
            f"{len(waits)} x {statistics.median(waits) * 1e3 if waits else 0:.1f} ms")
    layer, held = results["layer wait (GIL released)"], results["GIL-holding wait (like Paddle's Event.synchronize)"]
    check(layer[-1] < 5000, f"launching thread not stalled while the other thread waits (max {layer[-1]:.0f} us < 5 ms)")
    check(held[-1] > 10000, f"the test detects a stall when the wait holds the GIL (max {held[-1] / 1e3:.1f} ms)")


# --- 4. host time per step ----------------------------------------------------------------------


def run_timing(backend, cycles, device, rows=128, k=20, steps=200, looped=None) -> dict:
    """``looped``: a backend like ``backend`` whose C call issues a cudaMemcpyAsync each (CUDA < 12.8),
    timed as one more plugin row ("plugin, a copy each")."""
    rt = backend.rt
    stream = backend.glue.stream(0)
    columns = k + 1
    out = step_tensors(1, rows, columns, device)
    nbytes = {f: t.numel() * t.element_size() for f, t in out.items()}
    ring = PinnedRing(backend, "bench", DTYPES, {f: t.numel() for f, t in out.items()}, slots=2)
    loop_ring = None if looped is None else PinnedRing(looped, "bench", DTYPES, {f: t.numel() for f, t in out.items()},
                                                       slots=2)
    pageable = {f: np.empty(nbytes[f], dtype=np.uint8) for f in DTYPES}

    def plugin(step, state, ring=ring):  # the logprobs producer's call: a free slot, the three copies, their event
        with ring.lock:
            slot, event = ring.fill("bench", out, LABELS, "bench")
            buffers = [slot.buffers[f] for f in DTYPES]
            del slot
        previous, state["prev"] = state.get("prev"), (buffers, event)
        return previous

    def plugin_consume(previous, backend=backend):
        if previous is not None:
            buffers, event = previous
            backend.wait(event, "consumer")
            for buf in buffers:
                backend.read(buf, "consumer")

    def blocking(step, state):  # FastDeploy 2.4: .cpu() = copy into pageable memory, stream sync
        for f in DTYPES:
            rt.memcpy_d2h_async(pageable[f].ctypes.data, out[f].data_ptr(), nbytes[f], stream)
            rt.stream_synchronize(stream)
        return None

    def per_step_pinned(step, state):  # FastDeploy 2.5: new pinned tensors + event every step
        for ptr in state.pop("free", []):  # last step's tensors dropped after the consumer read them
            rt.host_free(ptr)
        ptrs = [rt.host_alloc(nbytes[f]) for f in DTYPES]
        for ptr, f in zip(ptrs, DTYPES):
            rt.memcpy_d2h_async(ptr, out[f].data_ptr(), nbytes[f], stream)
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

    results = {}
    for busy in (False, True):
        named = [("plugin: ring + event", plugin), ("FD 2.4: blocking copies", blocking),
                 ("FD 2.5: per-step pinned + event", per_step_pinned)]
        if looped is not None:
            named.insert(1, ("plugin, a copy each (CUDA<12.8)", lambda step, state: plugin(step, state, loop_ring)))
        for name, produce in named:
            state: dict = {}
            allocs0 = CountingRuntime.allocs
            host, consumer, wall = [], [], time.perf_counter()
            for step in range(steps + 10):
                if step == 10:
                    wall, allocs0 = time.perf_counter(), CountingRuntime.allocs
                if busy:
                    torch.cuda._sleep(cycles)
                t0 = time.perf_counter()
                previous = produce(step, state)
                t1 = time.perf_counter()
                if step >= 10:
                    host.append(t1 - t0)
                if name.startswith("plugin"):
                    plugin_consume(previous, looped if "copy each" in name else backend)
                elif name.startswith("FD 2.5"):
                    per_step_consume(previous, state)
                previous = None  # the consumer is done with the last step's buffers (kept, they made the ring grow)
                if step >= 10:  # the consumer: the wait on the previous step's event and the host reads
                    consumer.append(time.perf_counter() - t1)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - wall) / steps
            if name.startswith("FD 2.5"):
                for ptr in state.pop("free", []):
                    rt.host_free(ptr)
                ptrs, event = state.pop("prev")
                rt.event_synchronize(event)
                rt.event_destroy(event)
                for ptr in ptrs:
                    rt.host_free(ptr)
            host_us = sorted(x * 1e6 for x in host)
            results[(busy, name)] = {
                "median": statistics.median(host_us), "p90": host_us[int(0.9 * (len(host_us) - 1))],
                "consumer": statistics.median(x * 1e6 for x in consumer),
                "both": statistics.median((p + c) * 1e6 for p, c in zip(host, consumer)),
                "wall": wall * 1e6, "allocs_per_step": (CountingRuntime.allocs - allocs0) / steps,
                "slots": len((loop_ring if "copy each" in name else ring).slots) if name.startswith("plugin") else None,
            }
        state = None
    ring = None
    return results


def report_timing(results, rows, k, busy_ms) -> None:
    for busy in (False, True):
        say(f"  GPU {'busy (~%.1f ms queued per step)' % busy_ms if busy else 'idle'}: host time per step on the "
            f"output copies: producer median (p90), consumer median (FD 2.4: nothing left to wait for), "
            f"producer + consumer median; loop wall per step; pinned allocations per step")
        for (b, name), r in results.items():
            if b == busy:
                say(f"    {name:34s} {r['median']:9.1f} us ({r['p90']:9.1f})   consumer {r['consumer']:7.1f} us   "
                    f"prod+cons {r['both']:8.1f} us   wall {r['wall']:8.1f} us   allocs/step {r['allocs_per_step']:.2f}")
        plugin = results[(busy, "plugin: ring + event")]
        blocking = results[(busy, "FD 2.4: blocking copies")]
        pinned = results[(busy, "FD 2.5: per-step pinned + event")]
        say(f"    ratios: blocking / plugin = {blocking['median'] / plugin['median']:.1f}x, "
            f"per-step pinned / plugin = {pinned['median'] / plugin['median']:.1f}x; producer + consumer: "
            f"blocking / plugin = {blocking['both'] / plugin['both']:.2f}x, per-step pinned / plugin = "
            f"{pinned['both'] / plugin['both']:.2f}x")
        loop = results.get((busy, "plugin, a copy each (CUDA<12.8)"))
        if loop is not None:
            say(f"    ratios, a copy each (CUDA<12.8): blocking / plugin = {blocking['median'] / loop['median']:.1f}x; "
                f"producer + consumer: blocking / plugin = {blocking['both'] / loop['both']:.2f}x, per-step pinned / "
                f"plugin = {pinned['both'] / loop['both']:.2f}x")
        check(all(r["slots"] == 2 for (b, name), r in results.items() if b == busy and r["slots"] is not None),
              f"B={rows} K={k}, GPU {'busy' if busy else 'idle'}: the plugin's ring kept its 2 slots (a consumer one step "
              f"behind, as FD's save under overlap: the common step, never the ring's growth)")
        if busy:
            check(plugin["median"] * 10 <= blocking["median"],
                  f"B={rows} K={k}, GPU busy: plugin host time/step <= 1/10 of blocking")
            check(plugin["median"] < pinned["median"], f"B={rows} K={k}, GPU busy: plugin below per-step pinned")
            check(plugin["allocs_per_step"] == 0, f"B={rows} K={k}: 0 pinned allocations per step (plugin)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda-lib", help="a built libfd_async_copy_cuda.so (default: compile with nvcc)")
    parser.add_argument("--quick", action="store_true", help="probe + fewer correctness sizes (for compute-sanitizer)")
    parser.add_argument("--output", help="also write the report here")
    args = parser.parse_args(argv)
    say(f"$ python3 benchmarks/cuda_layer_check.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    logging.getLogger("fd_async_copy").setLevel(logging.ERROR)  # ring growth is reported per run below
    device = torch.device("cuda:0")
    torch.cuda.init()
    stream = torch.cuda.Stream()  # a non-default current stream: every copy must follow it
    torch.cuda.set_stream(stream)
    lib = build_cuda_library(args.cuda_lib)
    rt = CountingRuntime()
    say(f"framework (device tensors and streams only): PyTorch {torch.__version__}, "
        f"{torch.cuda.get_device_name(0)}; Paddle imported: {'paddle' in sys.modules}")
    say(f"CUDA layer: {rt.versions()}")
    per_ms = sleep_cycles_per_ms()
    cycles = int(2.0 * per_ms)
    ops = TorchProbeOps(cycles)
    backend = CheckedBackend(glue=TorchGlue(), rt=rt, probe_ops=ops)
    run_probe(backend, lib, ops)
    run_correctness(backend, lib, cycles, args.quick, device)
    from host_cost_breakdown import build_batch_library

    batch_lib, why = build_batch_library()
    if batch_lib is None:
        check(False, f"custom_ops/copy_batch.cc {why}")
    else:  # what CudaBackend does with the process's runtime when the custom ops are built
        batch_rt = CountingRuntime()
        batch_rt.use_batch(ctypes.CDLL(batch_lib))
        batched = CheckedBackend(glue=TorchGlue(), rt=batch_rt, probe_ops=ops)
        batched.ensure_probed(0)  # (the probe's batch_api check: cudaMemcpyBatchAsync on where it works)
        api = getattr(batch_rt.batch, "batch_api_state", None)  # (None: a tree before the batch call)
        say(f"the same with each step's copies and event issued by fdac_d2h_batch (one C call; "
            f"cudaMemcpyBatchAsync {api or 'not in this tree'}):")
        if api is not None:
            check(not api.startswith("off"), f"cudaMemcpyBatchAsync offered by CUDA >= 12.8 passes the probe's check: {api}")
        run_correctness(batched, lib, cycles, True, device)
    if not args.quick:
        run_two_threads(backend, lib, cycles, device)
        # No witness events; the default path: the runtime with fdac_d2h_batch when it was built.
        timing_backend = CudaBackend(glue=TorchGlue(), rt=rt if batch_lib is None else batch_rt, probe_ops=ops)
        timing_backend.probes = dict(batched.probes if batch_lib is not None else backend.probes)
        looped = None
        if batch_lib is not None and getattr(batch_rt.batch, "batch_api_state", "").startswith("on"):  # as CUDA < 12.8
            loop_rt = CountingRuntime()
            loop_rt.use_batch(ctypes.CDLL(batch_lib))
            loop_rt.batch.use_batch_api(False, "this script's comparison row")
            looped = CudaBackend(glue=TorchGlue(), rt=loop_rt, probe_ops=ops)
            looped.probes = dict(backend.probes)
        say(f"host time per decode step (same runtime calls for all three; the plugin: ring.fill, "
            f"{'one ctypes call per copy' if batch_lib is None else 'one C call per step (fdac_d2h_batch)'}"
            f"{', its copies in one cudaMemcpyBatchAsync' if looped is not None else ''}):")
        for rows, k in ((128, 20), (1024, 20)):
            say(f"  B={rows}, K={k} ({rows * (k + 1) * 12 + rows * 8} bytes per step)")
            report_timing(run_timing(timing_backend, cycles, device, rows, k, looped=looped), rows, k, cycles / per_ms)
    say(f"RESULT: {'PASS' if not FAILURES else 'FAIL'}" + (f" ({len(FAILURES)} failed: {FAILURES})" if FAILURES else ""))
    if args.output:
        Path(args.output).write_text(OUT.getvalue())
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
