#!/usr/bin/env python3
"""Decode-step model on the H200: FD 2.4's and FD 2.5's host waits at their sites, the plugin's fixes, overlap.

Issue 12's "decode-loop model, extended to a whole step". Without Paddle: PyTorch provides the GPU
work (calibrated spin kernels ``torch.cuda._sleep`` plus small real ops) and the current stream;
pinned buffers, asynchronous D2H copies, events and stream syncs go through the plugin's own CUDA
layer (``runtime.cudart``), ``runtime.cuda.CudaBackend`` and ``runtime.ring.PinnedRing``, as
``benchmarks/cuda_layer_check.py`` does. It is a model of FastDeploy's step, not FastDeploy.

One decode step (docs/fd24-step-syncs.md names the sites):

    host "prepare" (busy-wait)  -> prepare kernels (token count) -> GPU forward (F ms, queued)
    -> host "between forward and sampler" -> GPU sampler (Fs ms) -> post-process kernels
    -> output copies -> host "save" (busy-wait)

Variants (each places its host waits at the real sites):

- ``fd24``: FD 2.4 unpatched. S7 (exist_prefill_task_signal ``.cpu()``) at the top of the step;
  S1 (token count: kernel + blocking D2H) after prepare; S2 (bad_tokens_len), S3 (exist_prefill);
  T before the sampler (a stream sync through the CUDA layer - it waits for the forward - plus the
  pageable H2D of the CPU ``infer_seed``); S5 (update_inputs_v1: pageable H2D of not_need_stop
  before the kernel, waits for the sampler; D2H after it); S6 (save_output: blocking D2H of ids).
- ``fd24+backport``: S5/S6 replaced by async copies into a PinnedRing slot and one event wait at
  save; S1, S2, S3, T, S7 remain.
- ``fd24+one-wait``: only the save event wait: token count from the host (the pinned
  seq_lens_this_time snapshot copied under the previous save event), seed on the device, the
  prefill flags on the host.
- ``fd24+overlap``: one-wait plus #6259's schedule: prepare + launch forward N+1 (token count:
  upper bound from the last pinned snapshot, no sync), save N (wait on N's event), host "between",
  launch sampler/post/copies of N+1 and record its event.
- ``overlap, T kept`` (information, not a target): the same schedule with T still draining the
  stream before the sampler, as FD 2.5 has it (input_batch.py ``.cpu()`` seed).
- ``overlap, prepare`` (``FD_ASYNC_COPY_OVERLAP_COUNT=prepare``, the default's fallback): the same
  schedule, but the one wait (N-1's event) comes before prepare N, so N is sized by its exact
  token count (no padded GEMM rows); save N-1 still runs after forward N was launched.
- ``exact, at launch`` (the plugin's default ``FD_ASYNC_COPY_OVERLAP_COUNT=exact``): prepare N sized
  by the upper bound, then the one wait right before forward N and a trim to the exact count.
  ``fd24+overlap`` is ``FD_ASYNC_COPY_OVERLAP_COUNT=bound`` (FD 2.5's upper bound). Results recorded
  before the renaming call ``overlap, prepare`` ``overlap, exact``, and judge it as ``exact``.
- ``gpu-only``: the same GPU work and copies back to back, the host two steps ahead (lower bound).

FD 2.5 (``gpu_model_runner.py``; no S1-S3/S5-S7: fixed upstream), reported in their own block against
``fd25`` and ``gpu-only``. Its ``_prepare_inputs`` launches ``recover_decode_task``, copies
seq_lens_this_time and is_block_step into pinned buffers and records ``token_num_event``:

- ``fd25``: FD 2.5 unpatched, overlap off. tn (``token_num_event.synchronize()``, short: only the
  recover kernel and the copies are queued; the count is the host sum of the pinned copy) before the
  prepare kernels; tn2 (``_postprocess`` waits the same event again: signalled); T before the sampler
  (``infer_seed`` is a CPU tensor in 2.5, input_batch.py ``.cpu()``); the save event wait.
- ``fd25-overlap``: FD 2.5's ``execute_model_overlap``: prepare + forward N (token count:
  ``last_token_num``, the upper bound read in ``_postprocess`` N-1, no wait), save N-1 (its event),
  ``_postprocess`` N (tn2, which also reads N's pinned counts for N+1; T; sampler, post, copies).
- ``fd25+plugin``: ``fd25`` with the plugin's FD 2.5 fixes: ``infer_seed`` and its increment on the
  device (as FD develop #6765), so T is gone; tn and tn2 answered from the host shadow (the count the
  previous save's snapshot gives; FD's pinned copies and event are still issued, not waited on; the
  first step waits as FD does); the save event stays, its copies carry the snapshot.
- ``fd25+plugin-overlap``: ``fd25-overlap`` with T gone and tn2 answered the same way.

Wall time per step = median of the differences between consecutive saves (the host's timestamp
after each step's save), over ``--steps`` steps after ``--warmup``, in ``--rounds`` interleaved
rounds. Every saved step's ids are checked against the expected values (each event wait really
covered its copy), and the token count each variant used is checked.

Targets: overlap <= 0.92x fd24 in ``tpot11`` and <= 0.70x in ``hostheavy``, judged for each
token count (``exact``, the default, and ``bound``; ``prepare`` is reported, not judged), with a
verdict each (``verdicts()``); FD 2.5:
``fd25+plugin-overlap`` <= 1.03x ``gpu-only`` in both (``fd25_verdicts()``); and no mismatched output,
no wrong token count. RESULT is PASS only when both modes meet both FD 2.4 targets, the FD 2.5 target
is met and every output is right; the verdict lines name each mode's and FD 2.5's verdict.

    python3 benchmarks/step_model.py [--quick] [--output FILE] [--dry-run] [--config NAME:F:FS:P:B:S]
        [--host-split JSON[:B]] [--finishes A-B] [--insert-ms MS] [--graph-sizes]

Issue 40: ``--host-split JSON[:B]`` divides each configuration's prepare time as the measured split
of ``benchmarks/overlap_exact_phases.py --json`` does (worker loop before prepare's wait; count-independent
and mixed; count-dependent) and adds the variant ``prepare, prep first`` (the count-independent and mixed
share before prepare's wait: an upper estimate of moving it); ``--finishes A-B`` makes A..B requests
finish per step, each refilled by an insert at the next step's start (``--insert-ms`` host per
request), and an insert first flushes the pending save, as the plugin's ``get_tasks``/insert flush does.
The variant ``exact, at launch`` prepares by the bound and makes the wait right before the forward
(then ``TRIM_MS`` of trimming): the default ``FD_ASYNC_COPY_OVERLAP_COUNT=exact``. ``--graph-sizes`` prints only a simulation
of counts: how often step N+1's CUDA-graph captured size is known before prepare's wait
(``graph_size_decisions``; docs/overlap-token-count.md, "What FD 2.4's CUDA graph decides").

``--dry-run`` runs the same schedules on a fake clock (no GPU, no torch; the plugin's HostBackend
and PinnedRing over host memory): a logic check, and the modelled numbers printed next to the
measured ones on the GPU. Its costs per operation are assumptions (``FakeEngine``).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import io
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fd_async_copy_plugin.runtime.host import HostBackend  # noqa: E402
from fd_async_copy_plugin.runtime.ring import PinnedRing  # noqa: E402

assert "paddle" not in sys.modules, "the layer, backend and ring must import without Paddle"

VOCAB = 150_000
SEED_MOD = 1 << 40
SEED_INC = 4
STOP_LIMIT = 1 << 30  # seq_lens_decoder never reaches it: every slot keeps decoding
OUT = io.StringIO()


def say(line: str = "") -> None:
    print(line, flush=True)
    OUT.write(line + "\n")


@dataclass
class StepConfig:
    name: str
    forward_ms: float
    sampler_ms: float
    prepare_ms: float
    between_ms: float
    save_ms: float
    #: parts of ``prepare_ms`` from a measured split (``--host-split``; 0 without one): the worker loop's
    #: share (before ``_prepare_inputs``: before prepare's wait) and the count-independent share of
    #: ``_prepare_inputs`` (could run before prepare's wait: the ``prepare, prep first`` variant)
    worker_ms: float = 0.0
    movable_ms: float = 0.0
    split: str = ""
    #: finishing pattern (``--finishes A-B``): A..B requests finish per step, cycling, each refilled by
    #: an insert at the next step's start (``insert_ms`` host per inserted request)
    finishes: tuple = ()
    insert_ms: float = 0.0

    @property
    def host_ms(self) -> float:
        return self.prepare_ms + self.between_ms + self.save_ms

    def inserts_at(self, n: int) -> int:
        """Requests inserted at step ``n``'s start: those that finished at step n-1 (none at step 0)."""
        if not self.finishes or n == 0:
            return 0
        lo, hi = self.finishes
        return lo + (n - 1) % (hi - lo + 1)

    def describe(self) -> str:
        line = (f"forward {self.forward_ms:.2f} ms, sampler {self.sampler_ms:.2f} ms of GPU work; host prepare "
                f"{self.prepare_ms:.2f} / between {self.between_ms:.2f} / save {self.save_ms:.2f} ms "
                f"({self.host_ms:.2f} ms host per step)")
        if self.split:
            line += (f"; host phases from the measured split {self.split}: of prepare, worker loop "
                     f"{self.worker_ms:.2f} ms (before prepare's wait), count-independent and mixed {self.movable_ms:.2f} ms, "
                     f"count-dependent {self.prepare_ms - self.worker_ms - self.movable_ms:.2f} ms")
        if self.finishes:
            line += (f"; finishing pattern {self.finishes[0]}-{self.finishes[1]} per step, each refilled by an "
                     f"insert ({self.insert_ms:.2f} ms host per request; an insert flushes the pending save first)")
        return line


def split_config(cfg: StepConfig, split: dict, batch: str, source: str) -> StepConfig:
    """``cfg`` with its prepare time divided as the measured split of ``benchmarks/overlap_exact_phases.py
    --json`` divides FastDeploy 2.4's host time before the forward at ``batch`` (``host_us`` per phase:
    FastDeploy's and the plugin's Python with their Paddle calls; op ports and stand-ins left out):
    worker loop, count-independent + mixed (``movable_ms``: the upper estimate of what could run before
    prepare's wait), count-dependent. ``between_ms`` and ``save_ms`` stay the config's: on CPU Paddle the
    sampler's measured time is mostly its ops' compute over the vocabulary, which a GPU runs
    asynchronously, so the split's post-forward share is not a host share."""
    by_class: dict = collections.defaultdict(float)
    for phase in split["batches"][batch]["phases"].values():
        by_class[phase["class"]] += phase["host_us"]
    worker = by_class["worker"]
    movable = by_class["independent"] + by_class["mixed"]
    prepare = worker + movable + by_class["dependent"]
    if prepare <= 0:
        raise ValueError(f"{source}: no host time before the forward at B={batch}")
    k = cfg.prepare_ms / prepare
    return replace(cfg, worker_ms=worker * k, movable_ms=movable * k, split=f"{os.path.basename(source)} B={batch}")


CONFIGS = {
    # TPOT ~11 ms (GLM-4.5-Air-like in #6259's table): 9 ms forward, 0.5 ms sampler, ~2 ms host
    "tpot11": StepConfig("tpot11", 9.0, 0.5, 1.0, 0.3, 0.7),
    # small model, host-heavy: 3 ms forward, ~2.8 ms host
    "hostheavy": StepConfig("hostheavy", 3.0, 0.5, 1.4, 0.4, 1.0),
}
TARGETS = {"tpot11": 0.92, "hostheavy": 0.70}


#: FD_ASYNC_COPY_OVERLAP_COUNT -> the variant that models it (``exact`` is the plugin's default; results
#: recorded before the renaming hold ``prepare``'s variant as ``overlap, exact``)
MODES = {"exact": "exact, at launch", "bound": "fd24+overlap", "prepare": "overlap, prepare"}
#: the modes the targets judge (``prepare``, the default's fallback, is reported beside them)
JUDGED = ("exact", "bound")


def mode_ratios(res: dict) -> dict[str, float]:
    """Step time of each overlap mode over FD 2.4's (medians)."""
    return {mode: res[variant]["median"] / res["fd24"]["median"] for mode, variant in MODES.items()}


#: FD 2.5's variants: their own block in the report, against ``fd25`` and ``gpu-only``
FD25 = ("fd25", "fd25-overlap", "fd25+plugin", "fd25+plugin-overlap")
#: FD 2.5's target: fd25+plugin-overlap's step time over gpu-only's, in each of TARGETS' configs
FD25_TARGET = 1.03


def fd25_ratio(res: dict) -> float:
    """Step time of FD 2.5's overlap with the plugin over the GPU-only floor (medians)."""
    return res["fd25+plugin-overlap"]["median"] / res["gpu-only"]["median"]


def fd25_verdicts(ratios: dict[str, float]) -> tuple[list[str], list[str]]:
    """(report lines, failures): FD 2.5's target judged in every config of TARGETS."""
    lines, failures = [], []
    met = True
    for name in TARGETS:
        if name not in ratios:
            failures.append(f"{name}: fd25+plugin-overlap not run")
            met = False
            continue
        ratio = ratios[name]
        ok = ratio <= FD25_TARGET
        met &= ok
        lines.append(f"target {name}: fd25+plugin-overlap / gpu-only = {ratio:.3f} (<= {FD25_TARGET:.2f}): "
                     f"{'met' if ok else 'NOT met'}")
        if not ok:
            failures.append(f"{name}: fd25+plugin-overlap / gpu-only {ratio:.3f} > {FD25_TARGET:.2f}")
    lines.append(f"verdict FD 2.5: fd25+plugin-overlap {'meets' if met else 'MISSES'} the target "
                 f"(within {100 * (FD25_TARGET - 1):.0f}% of gpu-only in {' and '.join(TARGETS)})")
    return lines, failures


def verdicts(ratios: dict[str, dict[str, float]]) -> tuple[list[str], list[str]]:
    """(report lines, failures): every target judged for every judged overlap mode, the default first;
    ``prepare``'s ratio (where given) reported after them, not judged."""
    lines, failures = [], []
    per_mode = {mode: True for mode in JUDGED}
    for name, target in TARGETS.items():
        if name not in ratios:
            failures.append(f"{name}: not run")
            per_mode = {mode: False for mode in JUDGED}
            continue
        for mode in (m for m in MODES if m in JUDGED or m in ratios[name]):
            ratio = ratios[name][mode]
            ok = ratio <= target
            if mode not in JUDGED:
                lines.append(f"{name}: overlap {mode} (the default's fallback, not judged) / fd24 = {ratio:.3f}")
                continue
            per_mode[mode] &= ok
            default = " (default)" if mode == "exact" else ""
            lines.append(f"target {name}: overlap {mode}{default} / fd24 = {ratio:.3f} (<= {target:.2f}): "
                         f"{'met' if ok else 'NOT met'}")
            if not ok:
                failures.append(f"{name}: overlap {mode} / fd24 {ratio:.3f} > {target:.2f}")
    lines.append("verdict: " + "; ".join(
        f"{mode}{' (default)' if mode == 'exact' else ''} {'meets' if ok else 'MISSES'} the targets"
        for mode, ok in per_mode.items()))
    return lines, failures


def busy_wait(ms: float) -> None:
    """Host work: the thread spins (holds the CPU and the GIL, like FD's Python)."""
    end = time.perf_counter() + ms * 1e-3
    while time.perf_counter() < end:
        pass


def expected_ids(step: int, rows: int) -> np.ndarray:
    return (np.arange(rows, dtype=np.int64) * 31 + step * 7) % VOCAB


class Pending:
    """A step's outputs in a ring slot, copied but not yet waited for. Holding the buffers is what
    keeps the ring from handing the slot out again (PinnedRing counts references)."""

    __slots__ = ("step", "ids", "nns", "seq", "event", "done_at")

    def __init__(self, step, ids, nns, seq, event, done_at=None) -> None:
        self.step, self.ids, self.nns, self.seq, self.event, self.done_at = step, ids, nns, seq, event, done_at


class TokenNum:
    """FD 2.5's ``token_num_event`` of a step and the pinned seq_lens_this_time / is_block_step copies
    it covers (the engine's ``tn_bufs``: FD 2.5's fixed ``*_cpu`` pinned buffers, rewritten every step)."""

    __slots__ = ("seq", "block", "event", "done_at")

    def __init__(self, seq, block, event, done_at=None) -> None:
        self.seq, self.block, self.event, self.done_at = seq, block, event, done_at


class EngineBase:
    """What the schedules call. ``site(name)`` times a host wait (recorded once ``measuring``)."""

    forward_kernels = 4

    def __init__(self, cfg: StepConfig, rows: int, max_seqs: int) -> None:
        self.cfg, self.B, self.M = cfg, rows, max_seqs
        self.measuring = False
        self.sites: dict[str, list[float]] = collections.defaultdict(list)
        self.marks: list[float] = []
        self.ring: PinnedRing | None = None
        self.tn_bufs: dict[str, object] = {}

    def _shapes(self):
        return {"ids": [self.B], "not_need_stop": [1], "seq_lens": [self.B]}

    def _pinned(self, backend, prefix: str) -> None:
        B = self.B
        self.ring = PinnedRing(backend, f"{prefix}.{self.cfg.name}", {"ids": "int64", "not_need_stop": "bool", "seq_lens": "int32"},
                               {"ids": B, "not_need_stop": 1, "seq_lens": B}, slots=3)
        self.tn_bufs = {name: backend.new_pinned([B], dtype, f"{prefix}.{self.cfg.name}.{name}_cpu")
                        for name, dtype in (("seq_lens", "int32"), ("is_block_step", "bool"))}

    def token_num_wait(self, tn: TokenNum, name: str, read: bool = False):
        """FD 2.5's ``token_num_event.synchronize()`` at site ``name``; ``read``: then the pinned
        (seq_lens_this_time, is_block_step) as host arrays (None otherwise)."""
        self._wait(tn, name, "token_num")
        if not read:
            return None
        return self.backend.read(tn.seq, "token_num"), self.backend.read(tn.block, "token_num")

    class _Site:
        __slots__ = ("engine", "name", "t0")

        def __init__(self, engine, name) -> None:
            self.engine, self.name = engine, name

        def __enter__(self):
            self.t0 = self.engine.now()

        def __exit__(self, *exc):
            if self.engine.measuring:
                self.engine.sites[self.name].append(self.engine.now() - self.t0)
            return False

    def site(self, name: str):
        return self._Site(self, name)

    def mark(self) -> None:
        self.marks.append(self.now())

    def begin_variant(self) -> None:
        self.drain()
        self.reset_state()
        self.sites = collections.defaultdict(list)
        self.marks = []
        self.measuring = False


# --- the real engine: PyTorch work on the current stream, copies/events through the plugin ----------


class TorchEngine(EngineBase):
    def __init__(self, cfg, rows, max_seqs, backend, torch, cycles_for) -> None:
        super().__init__(cfg, rows, max_seqs)
        self.torch, self.backend, self.rt = torch, backend, backend.rt
        dev = torch.device("cuda:0")
        self.stream = int(torch.cuda.current_stream(dev).cuda_stream)
        z = lambda n, dt: torch.zeros(n, dtype=dt, device=dev)  # noqa: E731
        B, M = rows, max_seqs
        self.seq_lens_this_time = torch.ones(B, dtype=torch.int32, device=dev)
        self.seq_lens_decoder = z(B, torch.int32)
        self.stop_flags = z(B, torch.bool)
        self.not_need_stop_dev = torch.ones(1, dtype=torch.bool, device=dev)
        self.nns_cpu = torch.ones(1, dtype=torch.bool)  # FD 2.4's CPU not_need_stop (pageable)
        self.bad_tokens_len = torch.full((M,), 1, dtype=torch.int64, device=dev)
        self.is_prefill = z(M, torch.int32)
        self.task_signal = z(M, torch.int32)
        self.input_ids = z(B, torch.int64)
        self.ids_remove_padding = z(2 * B, torch.int64)
        self.cu_seqlens = z(B, torch.int64)
        self.base = torch.arange(B, dtype=torch.int64, device=dev)
        self.sampled = z(B, torch.int64)
        self.seed_dev = z(M, torch.int64)
        self.seed_cpu = torch.zeros(M, dtype=torch.int64)  # FD 2.4's CPU infer_seed (pageable)
        self.is_block_step = z(B, torch.bool)
        self.c_fwd = cycles_for(cfg.forward_ms / self.forward_kernels)
        self.c_samp = cycles_for(cfg.sampler_ms)
        self._pinned(backend, "step")

    def now(self) -> float:
        return time.perf_counter()

    def host(self, ms: float) -> None:
        busy_wait(ms)

    def drain(self) -> None:
        self.rt.device_synchronize()

    def reset_state(self) -> None:
        self.seq_lens_decoder.zero_()
        self.not_need_stop_dev.fill_(True)
        self.drain()

    # blocking reads (S2, S3, S7): the backend's blocking path, i.e. torch ``.cpu()``
    def short_read(self, name: str, tensor_name: str) -> np.ndarray:
        with self.site(name):
            return self.backend.blocking_d2h(getattr(self, tensor_name), name).numpy()

    def token_count_sync(self) -> int:  # S1: get_padding_offset's token_num.copy_to(CPU, false)
        tn = self.seq_lens_this_time.sum()
        with self.site("S1"):
            return int(self.backend.blocking_d2h(tn, "S1").item())

    def token_num_async(self) -> TokenNum:  # FD 2.5 _prepare_inputs (:1285-1333)
        self.seq_lens_this_time.add_(self.is_block_step)  # recover_decode_task (no block-step slot here: + 0)
        backend = self.backend
        seq, block = self.tn_bufs["seq_lens"], self.tn_bufs["is_block_step"]
        backend.copy_d2h(seq, self.seq_lens_this_time, "seq_lens_this_time")
        backend.copy_d2h(block, self.is_block_step, "is_block_step")
        return TokenNum(seq, block, backend.record("token_num"))

    def prepare_kernels(self, tok: int) -> None:  # the rest of get_padding_offset, sized by a host int
        torch = self.torch
        torch.cumsum(self.seq_lens_this_time, 0, dtype=torch.int64, out=self.cu_seqlens)
        self.ids_remove_padding[:tok].copy_(self.input_ids[:tok])

    def forward(self, step: int) -> None:
        for _ in range(self.forward_kernels):
            self.torch.cuda._sleep(self.c_fwd)

    def sync_stream(self, name: str) -> None:  # T: PrepareData's pool.Get(dst_place)->Wait()
        with self.site(name):
            self.rt.stream_synchronize(self.stream)

    def seed_h2d(self) -> None:  # T's copy of the CPU infer_seed (pageable H2D, blocking)
        self.seed_cpu.add_(SEED_INC).remainder_(SEED_MOD)
        with self.site("T.h2d"):
            self.seed_dev.copy_(self.seed_cpu)

    def seed_on_device(self) -> None:  # #6765: infer_seed on the GPU
        self.seed_dev.add_(SEED_INC).remainder_(SEED_MOD)

    def sampler(self, step: int) -> None:
        torch = self.torch
        torch.cuda._sleep(self.c_samp)
        torch.mul(self.base, 31, out=self.sampled)
        self.sampled.add_(step * 7).remainder_(VOCAB)

    def _update_kernels(self) -> None:  # update_inputs_v1 (stop flags, not_need_stop, next input ids)
        torch = self.torch
        self.seq_lens_decoder.add_(self.seq_lens_this_time)
        torch.ge(self.seq_lens_decoder, STOP_LIMIT, out=self.stop_flags)
        torch.any(torch.logical_not(self.stop_flags), 0, keepdim=True, out=self.not_need_stop_dev)
        self.input_ids.copy_(self.sampled)

    def post(self, step: int) -> None:
        self._update_kernels()

    def post_legacy(self, step: int) -> bool:  # FD 2.4: S5 around the update kernel
        with self.site("S5.h2d"):  # update_inputs_v1.cu:142, pageable H2D: waits for the sampler
            self.not_need_stop_dev.copy_(self.nns_cpu)
        self._update_kernels()
        with self.site("S5.d2h"):  # :163-166
            nns = bool(self.backend.blocking_d2h(self.not_need_stop_dev, "S5").item())
        self.nns_cpu.fill_(nns)
        return nns

    def blocking_ids(self) -> np.ndarray:  # S6: save_with_output_msg.cc:121
        with self.site("S6"):
            return self.backend.blocking_d2h(self.sampled, "S6").numpy()

    def outputs_async(self, step: int, snapshot: bool) -> Pending:
        backend = self.backend
        bufs = self.ring.acquire("save_output", self._shapes()).buffers
        ids, nns, seq = bufs["ids"], bufs["not_need_stop"], bufs["seq_lens"]
        copies = [(nns, self.not_need_stop_dev, "not_need_stop"), (ids, self.sampled, "sampled_token_ids")]
        if snapshot:
            copies.append((seq, self.seq_lens_this_time, "seq_lens_this_time"))
        # the step's copies and event in one batch, as the stop flag's after_update issues them
        return Pending(step, ids, nns, seq if snapshot else None, backend.copy_d2h_many(copies, "post_process"))

    def _wait(self, p, name: str, reason: str) -> None:  # a host wait on an event of the plugin's backend
        with self.site(name):
            self.backend.wait(p.event, reason)

    def outputs_wait(self, p: Pending):
        backend = self.backend
        self._wait(p, "event", "save")
        ids = backend.read(p.ids, "save")
        nns = bool(backend.read(p.nns, "save")[0])
        seq = backend.read(p.seq, "save") if p.seq is not None else None
        p.ids = p.nns = p.seq = None  # release the slot
        return ids, nns, seq


# --- the fake engine: same schedules on a fake clock, plugin HostBackend + PinnedRing -------------


class NumpyGlue:
    """Accessors for numpy arrays (the dry run's "device" arrays are host arrays)."""

    name = "numpy"

    def address(self, t):
        return int(t.ctypes.data)

    def shape(self, t):
        return tuple(int(s) for s in t.shape)

    def dtype(self, t):
        return str(t.dtype)

    def is_contiguous(self, t):
        return bool(t.flags.c_contiguous)

    def gpu_device(self, t):
        return None

    def current_device(self):
        return 0

    def stream(self, device):
        return 0

    def wrap(self, array):
        return array

    def set_shape(self, t, shape):
        if tuple(t.shape) != tuple(shape):
            if int(np.prod(shape)) != t.size:
                raise ValueError("NumpyGlue.set_shape: only same-size reshapes")
            t.shape = tuple(shape)

    def from_numpy(self, array):
        return array

    def blocking_d2h(self, t):
        return np.array(t, copy=True)

    def snapshot(self, t):
        return np.array(t, copy=True)


class FakeEngine(EngineBase):
    """A discrete clock: ``t`` is the host's time, ``tail`` when the GPU's queue drains (ms).
    The costs below are assumptions (rough H200/PyTorch magnitudes), not measurements."""

    LAUNCH = 0.008  # host cost of one kernel launch / small op
    ROUND_TRIP = 0.025  # blocking copy once the GPU is idle
    SYNC = 0.010  # stream sync return
    WAKE = 0.030  # blocking-sync event wake-up
    COPY = 0.006  # host cost of one cudaMemcpyAsync (+ ring bookkeeping)
    GPU_SMALL = 0.004  # GPU time of a small kernel or copy

    def __init__(self, cfg, rows, max_seqs) -> None:
        super().__init__(cfg, rows, max_seqs)
        self.backend = HostBackend(glue=NumpyGlue())
        self.t = self.tail = 0.0
        B, M = rows, max_seqs
        self.seq_lens_this_time = np.ones(B, dtype=np.int32)
        self.seq_lens_decoder = np.zeros(B, dtype=np.int32)
        self.not_need_stop_dev = np.ones(1, dtype=np.bool_)
        self.sampled = np.zeros(B, dtype=np.int64)
        self.bad_tokens_len = np.ones(M, dtype=np.int64)
        self.is_prefill = np.zeros(M, dtype=np.int32)
        self.task_signal = np.zeros(M, dtype=np.int32)
        self.is_block_step = np.zeros(B, dtype=np.bool_)
        self.stale_reads = 0
        self._pinned(self.backend, "fake")

    def now(self) -> float:
        return self.t * 1e-3

    def host(self, ms: float) -> None:
        self.t += ms

    def _launch(self, gpu_ms: float) -> None:
        self.t += self.LAUNCH
        self.tail = max(self.tail, self.t) + gpu_ms

    def _sync(self) -> None:
        self.t = max(self.t, self.tail)

    def drain(self) -> None:
        self._sync()

    def reset_state(self) -> None:
        self.seq_lens_decoder[:] = 0
        self.not_need_stop_dev[:] = True

    def _blocking(self) -> None:
        self._launch(self.GPU_SMALL)
        self._sync()
        self.t += self.ROUND_TRIP

    def short_read(self, name, tensor_name):
        with self.site(name):
            self._blocking()
            return np.array(getattr(self, tensor_name), copy=True)

    def token_count_sync(self) -> int:
        self._launch(self.GPU_SMALL)
        with self.site("S1"):
            self._blocking()
            return int(self.seq_lens_this_time.sum())

    def _copies(self, pairs) -> None:  # cudaMemcpyAsync each into pinned, then the event record's host cost
        for dst, src in pairs:
            self.t += self.COPY
            self.tail = max(self.tail, self.t) + self.GPU_SMALL
            self.backend.copy_d2h(dst, src, "fake")
        self.t += self.COPY

    def token_num_async(self) -> TokenNum:
        self._launch(self.GPU_SMALL)  # recover_decode_task
        seq, block = self.tn_bufs["seq_lens"], self.tn_bufs["is_block_step"]
        self._copies([(seq, self.seq_lens_this_time), (block, self.is_block_step)])
        # waited right after it is recorded: done once the GPU reaches the record, a small op after it is issued
        return TokenNum(seq, block, self.backend.record("token_num"), done_at=max(self.tail, self.t) + self.GPU_SMALL)

    def prepare_kernels(self, tok):
        self._launch(self.GPU_SMALL)
        self._launch(self.GPU_SMALL)

    def forward(self, step):
        for _ in range(self.forward_kernels):
            self._launch(self.cfg.forward_ms / self.forward_kernels)

    def sync_stream(self, name):
        with self.site(name):
            self._sync()
            self.t += self.SYNC

    def seed_h2d(self):
        self.t += 0.004
        with self.site("T.h2d"):
            self._blocking()

    def seed_on_device(self):
        self._launch(self.GPU_SMALL)
        self._launch(self.GPU_SMALL)

    def sampler(self, step):
        self._launch(self.cfg.sampler_ms)
        for _ in range(3):
            self._launch(self.GPU_SMALL)
        self.sampled[:] = expected_ids(step, self.B)

    def _update_kernels(self):
        for _ in range(5):
            self._launch(self.GPU_SMALL)
        self.seq_lens_decoder += self.seq_lens_this_time
        self.not_need_stop_dev[0] = bool((self.seq_lens_decoder < STOP_LIMIT).any())

    def post(self, step):
        self._update_kernels()

    def post_legacy(self, step) -> bool:
        with self.site("S5.h2d"):
            self._blocking()
        self._update_kernels()
        with self.site("S5.d2h"):
            self._blocking()
        return bool(self.not_need_stop_dev[0])

    def blocking_ids(self):
        with self.site("S6"):
            self._blocking()
            return np.array(self.sampled, copy=True)

    def outputs_async(self, step, snapshot) -> Pending:
        backend = self.backend
        bufs = self.ring.acquire("save_output", self._shapes()).buffers
        ids, nns, seq = bufs["ids"], bufs["not_need_stop"], bufs["seq_lens"]
        self._copies([(nns, self.not_need_stop_dev), (ids, self.sampled)] + ([(seq, self.seq_lens_this_time)] if snapshot else []))
        return Pending(step, ids, nns, seq if snapshot else None, backend.record("post_process"), done_at=self.tail)

    def _wait(self, p, name, reason):
        with self.site(name):
            if p.done_at > self.t:
                self.t = p.done_at + self.WAKE
            else:
                self.t += 0.002
            self.backend.wait(p.event, reason)
        if self.t < p.done_at:
            self.stale_reads += 1

    def outputs_wait(self, p: Pending):
        self._wait(p, "event", "save")
        backend = self.backend
        ids = backend.read(p.ids, "save")
        nns = bool(backend.read(p.nns, "save")[0])
        seq = backend.read(p.seq, "save") if p.seq is not None else None
        p.ids = p.nns = p.seq = None
        return ids, nns, seq


# --- the schedules ------------------------------------------------------------------------------


class Ctx:
    """Per-variant bookkeeping: output checks and the token counts used."""

    def __init__(self, e: EngineBase, warmup: int) -> None:
        self.e, self.warmup = e, warmup
        self.mismatches = 0
        self.bad_token_counts = 0
        self.sync_fallbacks = 0
        self.saved: list[int] = []

    def begin(self, n: int) -> None:
        self.e.measuring = n >= self.warmup

    def save(self, n: int, ids: np.ndarray, nns: bool, host_ms: float) -> None:
        self.e.host(host_ms)
        if not (np.array_equal(ids, expected_ids(n, self.e.B)) and nns):
            self.mismatches += 1
        self.saved.append(n)
        self.e.mark()

    def token_count(self, tok: int) -> int:
        if tok != self.e.B:
            self.bad_token_counts += 1
        return tok


def _inserts(c: Ctx, cfg: StepConfig, n: int) -> None:
    """The worker loop's inserts at step n's start (the finishing pattern's refills), no overlap pending."""
    k = cfg.inserts_at(n)
    if k:
        c.e.host(k * cfg.insert_ms)


def run_fd24(c: Ctx, cfg: StepConfig, total: int) -> None:
    e = c.e
    for n in range(total):
        c.begin(n)
        _inserts(c, cfg, n)
        e.short_read("S7", "task_signal")  # worker loop: exist_prefill_task_signal
        e.host(cfg.prepare_ms)
        tok = c.token_count(e.token_count_sync())  # S1
        int(np.max(e.short_read("S2", "bad_tokens_len")))  # S2
        e.prepare_kernels(tok)
        e.short_read("S3", "is_prefill")  # S3: exist_prefill -> CUDA graph?
        e.forward(n)
        e.host(cfg.between_ms)
        e.sync_stream("T")  # top_p_sampling's CPU seed: waits for the forward
        e.seed_h2d()
        e.sampler(n)
        nns = e.post_legacy(n)  # S5
        ids = e.blocking_ids()  # S6
        c.save(n, ids, nns, cfg.save_ms)


def run_backport(c: Ctx, cfg: StepConfig, total: int) -> None:
    e = c.e
    for n in range(total):
        c.begin(n)
        _inserts(c, cfg, n)
        e.short_read("S7", "task_signal")
        e.host(cfg.prepare_ms)
        tok = c.token_count(e.token_count_sync())
        int(np.max(e.short_read("S2", "bad_tokens_len")))
        e.prepare_kernels(tok)
        e.short_read("S3", "is_prefill")
        e.forward(n)
        e.host(cfg.between_ms)
        e.sync_stream("T")
        e.seed_h2d()
        e.sampler(n)
        e.post(n)
        p = e.outputs_async(n, snapshot=False)
        ids, nns, _ = e.outputs_wait(p)  # the one event wait at save
        del p
        c.save(n, ids, nns, cfg.save_ms)


def _exact_count(c: Ctx, tn: TokenNum) -> int:  # FD 2.5: token_num_event.synchronize(), pinned counts summed
    return c.token_count(int(c.e.token_num_wait(tn, "tn", read=True)[0].sum()))


def _host_count(c: Ctx, bound: int | None, tn: TokenNum | None = None) -> int:
    if bound is None:  # no snapshot yet (first steps): the synchronous count, as #6259 and FD 2.5 fall back
        c.sync_fallbacks += 1
        return _exact_count(c, tn) if tn is not None else c.token_count(c.e.token_count_sync())
    return c.token_count(bound)


def _seed(e: EngineBase, keep_t: bool) -> None:
    if keep_t:  # T: top_p_sampling's CPU infer_seed drains the stream (the forward), then a pageable H2D
        e.sync_stream("T")
        e.seed_h2d()
    else:
        e.seed_on_device()


def run_one_wait(c: Ctx, cfg: StepConfig, total: int) -> None:
    e = c.e
    bound = None
    for n in range(total):
        c.begin(n)
        _inserts(c, cfg, n)
        e.host(cfg.prepare_ms)
        e.prepare_kernels(_host_count(c, bound))
        e.forward(n)
        e.host(cfg.between_ms)
        e.seed_on_device()
        e.sampler(n)
        e.post(n)
        p = e.outputs_async(n, snapshot=True)
        ids, nns, seq = e.outputs_wait(p)
        del p
        bound = int(seq.sum())  # upper bound for the next step's count (no decode task inserted here)
        c.save(n, ids, nns, cfg.save_ms)


def _run_fd25(c: Ctx, cfg: StepConfig, total: int, keep_t: bool) -> None:
    """FD 2.5 without its overlap schedule (execute_model -> _prepare_inputs, forward, _postprocess,
    _save_model_output); ``keep_t``: unpatched (CPU infer_seed, both token_num waits), else the
    plugin's FD 2.5 fix: the device seed, and both token_num reads answered from the host shadow
    (the previous save's snapshot; FD still issues its copies and event, nobody waits on them)."""
    e = c.e
    shadow = None  # the plugin's count for this step (None: not known yet, FD's own waits run)
    for n in range(total):
        c.begin(n)
        _inserts(c, cfg, n)
        e.host(cfg.prepare_ms)
        tn = e.token_num_async()  # recover_decode_task, pinned copies, token_num_event.record()
        # tn: only the recover kernel and the copies are queued
        e.prepare_kernels(_exact_count(c, tn) if shadow is None else c.token_count(shadow))
        e.forward(n)
        e.host(cfg.between_ms)
        if shadow is None:
            e.token_num_wait(tn, "tn2")  # _postprocess waits token_num_event again (signalled)
        _seed(e, keep_t)
        e.sampler(n)
        e.post(n)
        p = e.outputs_async(n, snapshot=not keep_t)
        ids, nns, seq = e.outputs_wait(p)  # _save_model_output: post_process_event
        del p
        if seq is not None:
            shadow = int(seq.sum())  # exact: no task is inserted here
        c.save(n, ids, nns, cfg.save_ms)


def _run_overlap(c: Ctx, cfg: StepConfig, total: int, keep_t: bool, exact: bool = False, fd25: bool = False,
                 prep_first: bool = False, at_launch: bool = False) -> None:
    """#6259's schedule; ``fd25``: FD 2.5's execute_model_overlap: prepare N records token_num_event over
    N's pinned counts, _postprocess N waits it (tn2) and reads them for N+1's upper bound
    (last_token_num), the outputs carry no seq_lens snapshot. ``prep_first`` (exact only): the
    count-independent part of prepare (``cfg.movable_ms``) runs before the wait, not after it.
    ``at_launch`` (exact only): all of prepare runs sized by the bound, then the wait on N-1's event
    comes right before forward N's launch, followed by ``TRIM_MS`` of host work (trim the packed
    inputs to the exact count, decide the graph): the mechanism docs/overlap-token-count.md describes.
    With a measured split the worker loop's share (``cfg.worker_ms``) runs before prepare's wait; an
    insert (the finishing pattern's refill) first flushes the pending save, in every mode, as the
    plugin's ``get_tasks``/insert flush does."""
    e = c.e
    bound = None
    pending = None
    for n in range(total):
        c.begin(n)
        waited = None
        before = cfg.worker_ms + (cfg.movable_ms if exact and prep_first else 0.0)
        if cfg.inserts_at(n):
            if pending is not None:  # get_tasks/insert: the pending save runs first (its event waited)
                ids, nns, seq = e.outputs_wait(pending)
                step, pending = pending.step, None
                if seq is not None:
                    bound = int(seq.sum())
                c.save(step, ids, nns, cfg.save_ms)
            e.host(cfg.inserts_at(n) * cfg.insert_ms)
        e.host(before)  # the worker loop (and with prep_first the count-free prepare): before any wait
        if exact and not at_launch and pending is not None:  # the exact count: the one wait, before prepare N
            waited = (pending.step, *e.outputs_wait(pending))
            pending = None
            bound = int(waited[3].sum())  # N-1's snapshot: N's exact count
        e.host(cfg.prepare_ms - before)  # prepare N (bound: the pinned snapshot of N-2 at most is known here; fd25: N-1's)
        tn = e.token_num_async() if fd25 else None
        e.prepare_kernels(_host_count(c, bound, tn))
        if at_launch and pending is not None:  # the exact count: the one wait, on N-1's event, before forward N
            waited = (pending.step, *e.outputs_wait(pending))
            pending = None
            bound = int(waited[3].sum())
            e.host(TRIM_MS)  # trim ids/batch ids to the exact count, step_use_cudagraph, real_token_num
        e.forward(n)
        if waited is not None:  # save N-1 under forward N (its event was waited on before prepare)
            step, ids, nns, _ = waited
            c.save(step, ids, nns, cfg.save_ms)
        elif pending is not None:  # save N-1: the one wait, on N-1's event (recorded before forward N)
            ids, nns, seq = e.outputs_wait(pending)
            step, pending = pending.step, None
            if seq is not None:
                bound = int(seq.sum())
            c.save(step, ids, nns, cfg.save_ms)
        e.host(cfg.between_ms)
        if tn is not None and (keep_t or bound is None):  # _postprocess N: token_num_event (signalled),
            seq, block = e.token_num_wait(tn, "tn2", read=True)  # last_token_num for N+1; with the
            bound = int(seq.sum()) + int(block.sum())  # plugin, the shadow (N-1's snapshot) answers it
        _seed(e, keep_t)
        e.sampler(n)
        e.post(n)
        pending = e.outputs_async(n, snapshot=not (fd25 and keep_t))
    e.measuring = False  # the flush waits for the whole queue: not a step's wait
    if pending is not None:  # flush the last step
        ids, nns, _ = e.outputs_wait(pending)
        step, pending = pending.step, None
        c.save(step, ids, nns, cfg.save_ms)


def run_overlap(c, cfg, total):
    _run_overlap(c, cfg, total, keep_t=False)


def run_overlap_t(c, cfg, total):
    _run_overlap(c, cfg, total, keep_t=True)


def run_overlap_prepare(c, cfg, total):
    _run_overlap(c, cfg, total, keep_t=False, exact=True)


def run_overlap_prepare_prep_first(c, cfg, total):
    _run_overlap(c, cfg, total, keep_t=False, exact=True, prep_first=True)


#: host ms between the wait and the forward launch in ``exact, at launch``: the snapshot read,
#: the count replay and the trim. The prototype (benchmarks/overlap_launch_wait.py) took 36-42 us for
#: them on FD 2.4's own runner on CPU (B=8/64, median); the forward's launch is the model's own.
TRIM_MS = 0.04


def run_overlap_exact_at_launch(c, cfg, total):
    _run_overlap(c, cfg, total, keep_t=False, exact=True, at_launch=True)


def run_fd25(c, cfg, total):
    _run_fd25(c, cfg, total, keep_t=True)


def run_fd25_overlap(c, cfg, total):
    _run_overlap(c, cfg, total, keep_t=True, fd25=True)


def run_fd25_plugin(c, cfg, total):
    _run_fd25(c, cfg, total, keep_t=False)


def run_fd25_plugin_overlap(c, cfg, total):
    _run_overlap(c, cfg, total, keep_t=False, fd25=True)


def run_gpu_only(c: Ctx, cfg: StepConfig, total: int) -> None:
    e = c.e
    queue: collections.deque = collections.deque()
    for n in range(total):
        c.begin(n)
        e.prepare_kernels(e.B)
        e.forward(n)
        e.seed_on_device()
        e.sampler(n)
        e.post(n)
        queue.append(e.outputs_async(n, snapshot=True))
        if len(queue) > 2:  # the host stays two steps ahead: the GPU never waits for it
            p = queue.popleft()
            ids, nns, _ = e.outputs_wait(p)
            step = p.step
            del p
            c.save(step, ids, nns, 0.0)
    e.measuring = False  # the flush waits for the whole queue: not a step's wait
    while queue:
        p = queue.popleft()
        ids, nns, _ = e.outputs_wait(p)
        step = p.step
        del p
        c.save(step, ids, nns, 0.0)


VARIANTS = {
    "fd24": run_fd24,
    "fd24+backport": run_backport,
    "fd24+one-wait": run_one_wait,
    "fd24+overlap": run_overlap,
    "overlap, T kept": run_overlap_t,
    "overlap, prepare": run_overlap_prepare,  # FD_ASYNC_COPY_OVERLAP_COUNT=prepare: the wait before the prepare
    "prepare, prep first": run_overlap_prepare_prep_first,  # with a measured split only (what direction 1 could give)
    "exact, at launch": run_overlap_exact_at_launch,  # the default exact: prepare by the bound, wait and trim before the forward
    "gpu-only": run_gpu_only,
    "fd25": run_fd25,
    "fd25-overlap": run_fd25_overlap,
    "fd25+plugin": run_fd25_plugin,
    "fd25+plugin-overlap": run_fd25_plugin_overlap,
}
SITE_ORDER = ["S7", "S1", "tn", "S2", "S3", "tn2", "T", "T.h2d", "S5.h2d", "S5.d2h", "S6", "event"]


def run_variant(e: EngineBase, name: str, warmup: int, steps: int) -> dict:
    e.begin_variant()
    c = Ctx(e, warmup)
    gc.collect()
    gc.disable()  # no collector pauses inside a measured loop (FD's loop has them; they are noise here)
    try:
        VARIANTS[name](c, e.cfg, warmup + steps)
    finally:
        gc.enable()
    e.drain()
    marks = np.array(e.marks)
    diffs = np.diff(marks[warmup:]) * 1e3  # ms between consecutive saves, after warm-up
    in_order = c.saved == list(range(warmup + steps))
    measured_steps = max(1, steps)
    wait_ms = {s: (1e3 * sum(v) / measured_steps, 1e3 * statistics.median(v), len(v) / measured_steps)
               for s, v in e.sites.items() if v}
    return {"diffs": diffs, "mismatches": c.mismatches, "bad_tok": c.bad_token_counts,
            "fallbacks": c.sync_fallbacks, "in_order": in_order, "waits": wait_ms, "ring": e.ring.size,
            "grown": e.ring.grow_events}


def measure(e: EngineBase, warmup: int, steps: int, rounds: int) -> dict:
    names = [n for n in VARIANTS if n != "prepare, prep first" or e.cfg.movable_ms > 0]
    per = {n: {"diffs": [], "round_medians": [], "mismatches": 0, "bad_tok": 0, "fallbacks": 0, "in_order": True,
               "waits": collections.defaultdict(list), "ring": 0, "grown": 0} for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate: no variant always first
        for name in order:
            res = run_variant(e, name, warmup, steps)
            agg = per[name]
            agg["diffs"].extend(res["diffs"].tolist())
            agg["round_medians"].append(float(np.median(res["diffs"])))
            for key in ("mismatches", "bad_tok", "fallbacks"):
                agg[key] += res[key]
            agg["in_order"] &= res["in_order"]
            agg["ring"] = max(agg["ring"], res["ring"])
            agg["grown"] = res["grown"]
            for site, v in res["waits"].items():
                agg["waits"][site].append(v)
    out = {}
    for name, agg in per.items():
        d = np.array(agg["diffs"])
        waits = {s: tuple(float(np.median([x[i] for x in v])) for i in range(3)) for s, v in agg["waits"].items()}
        out[name] = {"median": float(np.median(d)), "p10": float(np.percentile(d, 10)), "p90": float(np.percentile(d, 90)),
                     "mean": float(d.mean()), "round_medians": agg["round_medians"], "mismatches": agg["mismatches"],
                     "bad_tok": agg["bad_tok"], "fallbacks": agg["fallbacks"], "in_order": agg["in_order"],
                     "waits": waits, "wait_total": sum(w[0] for w in waits.values()), "ring": agg["ring"],
                     "grown": agg["grown"]}
    return out


def _table(res: dict, model: dict | None, names: list[str], bases: dict[str, str], label: str) -> None:
    """The rows of ``names``: ms/step, the ratio over each of ``bases`` (variant -> column head), the
    model's ms/step and ratio over the first base, the waits; then their per-round medians."""
    first = next(iter(bases))
    head = f"  {'variant':19s} {'ms/step':>8s} {'p10':>7s} {'p90':>7s}" + "".join(f" {h:>8s}" for h in bases.values())
    if model is not None:
        head += f" {'model':>7s} {'m.ratio':>7s}"
    head += f" {'waited':>7s} {'host':>6s}  waits per step: site count x median us"
    say(head + f"   [{label}]")
    for name in names:
        r = res[name]
        line = (f"  {name:19s} {r['median']:8.3f} {r['p10']:7.3f} {r['p90']:7.3f}"
                + "".join(f" {r['median'] / res[b]['median']:7.3f}x" for b in bases))
        if model is not None:
            m = model[name]["median"]
            line += f" {m:7.3f} {m / model[first]['median']:6.3f}x"
        sites = ", ".join(f"{s} {r['waits'][s][2]:.0f}x{r['waits'][s][1] * 1e3:.0f}" for s in SITE_ORDER if s in r["waits"])
        line += f" {r['wait_total']:7.3f} {r['median'] - r['wait_total']:6.3f}  {sites}"
        say(line)
    rounds = ", ".join(f"{n} " + "/".join(f"{x:.2f}" for x in res[n]["round_medians"]) for n in names)
    say(f"  per-round medians (ms): {rounds}")


def report(cfg: StepConfig, res: dict, model: dict | None, label: str) -> list[str]:
    """Prints the tables (FD 2.4's, then FD 2.5's block); returns failure strings of the correctness checks."""
    failures = []
    base = res["fd24"]["median"]
    say(f"config {cfg.name}: {cfg.describe()}")
    _table(res, model, [n for n in res if n not in FD25], {"fd24": "vs fd24"}, label)
    for name, r in res.items():
        if r["mismatches"] or not r["in_order"] or r["bad_tok"]:
            failures.append(f"{cfg.name}/{name}: {r['mismatches']} mismatched saves, in order {r['in_order']}, "
                            f"{r['bad_tok']} wrong token counts")
    checks = sum(r["mismatches"] for r in res.values())
    say(f"  outputs: every saved step's ids and not_need_stop checked against the expected values: "
        f"{checks} mismatches; saves in step order: {all(r['in_order'] for r in res.values())}; token counts: "
        f"{sum(r['bad_tok'] for r in res.values())} wrong, synchronous fallbacks (first step, no snapshot yet): "
        + ", ".join(f"{n} {r['fallbacks']}" for n, r in res.items() if r["fallbacks"]) + f"; pinned ring: {max(r['ring'] for r in res.values())} slots (3 preallocated), "
        f"{max(r['grown'] for r in res.values())} grown (no pinned allocation in the loop when 0)")
    ov, gpu, ovt, ow = res["fd24+overlap"], res["gpu-only"], res["overlap, T kept"], res["fd24+one-wait"]
    host_active = ov["median"] - ov["wait_total"]
    gap = ov["median"] - gpu["median"]
    say(f"  overlap vs gpu-only: {ov['median']:.3f} vs {gpu['median']:.3f} ms/step, gap {gap:+.3f} ms "
        f"({100 * gap / gpu['median']:+.1f}%). In overlap the host is active {host_active:.3f} ms/step "
        f"(host phases {cfg.host_ms:.2f} ms + {host_active - cfg.host_ms:.3f} ms of launches, copies, ring and checks) "
        f"and waits {ov['wait_total']:.3f} ms/step, all on the previous step's event.")
    if host_active < 0.97 * gpu["median"]:
        say(f"  -> GPU-bound: the host phases (prepare, between, save) are hidden under the forward; what remains "
            f"({gap:+.3f} ms) is per-step overhead: the event wake-up and the gap before the sampler/forward "
            f"launches land, not host work. The overlap ceiling here is gpu-only ({gpu['median']:.3f} ms).")
    else:
        say(f"  -> host-bound: the host's own time per step ({host_active:.3f} ms) exceeds the GPU's; what remains "
            f"is host work, mostly the next step's prepare ({cfg.prepare_ms:.2f} ms) and save ({cfg.save_ms:.2f} ms).")
    exposed = ovt["median"] - gpu["median"]
    say(f"  with T kept (FD 2.5's overlap, T not removed): {ovt['median']:.3f} ms/step ({ovt['median'] / base:.3f}x fd24), "
        f"{exposed:+.3f} ms over gpu-only: T makes the sampler launch wait for the forward, so the next step's "
        f"prepare ({cfg.prepare_ms:.2f} ms) runs while only the sampler ({cfg.sampler_ms:.2f} ms) is queued "
        f"(expected exposure ~{max(0.0, cfg.prepare_ms - cfg.sampler_ms):.2f} ms + overhead). "
        f"one-wait without overlap: {ow['median']:.3f} ms ({ow['median'] / base:.3f}x): prepare and save are serial "
        f"with the GPU there.")
    ox = res["overlap, prepare"]
    say(f"  the wait before the prepare (FD_ASYNC_COPY_OVERLAP_COUNT=prepare, the default's fallback): {ox['median']:.3f} ms/step "
        f"({ox['median'] / base:.3f}x fd24, {ox['median'] / ow['median']:.3f}x one-wait): the wait comes before "
        f"prepare, so the save ({cfg.save_ms:.2f} ms) hides under the forward and the prepare "
        f"({cfg.prepare_ms:.2f} ms) does not; bound (FD 2.5's padded count) {ov['median'] / base:.3f}x.")
    if "prepare, prep first" in res:
        pf = res["prepare, prep first"]
        say(f"  prepare, prep first (the count-independent and mixed prepare, {cfg.movable_ms:.2f} ms: an upper estimate, before the wait; "
            f"{cfg.prepare_ms - cfg.worker_ms - cfg.movable_ms:.2f} ms count-dependent after it): {pf['median']:.3f} "
            f"ms/step ({pf['median'] / base:.3f}x fd24); prepare / bound {ox['median'] / ov['median']:.3f}x, "
            f"prep first / bound {pf['median'] / ov['median']:.3f}x (target <= 1.03x).")
    if "exact, at launch" in res:
        al = res["exact, at launch"]
        say(f"  exact, at launch (prepare sized by the bound, the wait and {TRIM_MS:.2f} ms of trimming to the exact "
            f"count right before the forward: FD_ASYNC_COPY_OVERLAP_COUNT=exact, the default): {al['median']:.3f} ms/step "
            f"({al['median'] / base:.3f}x fd24); at launch / bound {al['median'] / ov['median']:.3f}x (target <= 1.03x).")
    say("  FD 2.5 (its own step: tn = token_num_event.synchronize() in _prepare_inputs, tn2 = the same event in "
        "_postprocess, T = the CPU infer_seed, event = post_process_event at save; no S1-S3/S5-S7):")
    _table(res, model, [n for n in res if n in FD25], {"fd25": "vs fd25", "gpu-only": "vs gpu"}, label)
    f25, f25o, f25p, f25po = (res[n] for n in FD25)
    say(f"  fd25+plugin-overlap vs gpu-only: {f25po['median']:.3f} vs {gpu['median']:.3f} ms/step "
        f"({100 * (f25po['median'] / gpu['median'] - 1):+.1f}%, target <= {100 * (FD25_TARGET - 1):+.0f}%; "
        f"{f25po['median'] / f25['median']:.3f}x fd25): with the seed on the device FD 2.5's own overlap hides "
        f"prepare and save under the forward; the shadow answers tn2, the save event stays. fd25-overlap (T kept): "
        f"{f25o['median']:.3f} ms ({100 * (f25o['median'] / gpu['median'] - 1):+.1f}% over gpu-only, "
        f"{f25o['median'] / f25['median']:.3f}x fd25): T makes the sampler launch wait for the forward. "
        f"Overlap off: fd25 {f25['median']:.3f}, fd25+plugin {f25p['median']:.3f} ms "
        f"({f25p['median'] / f25['median']:.3f}x): prepare and save stay serial with the GPU.")
    return failures


# --- the plugin's own host work per step (issue 24) ----------------------------------------------

HOST_OVERHEAD_TARGET_US = 80.0


def plugin_host_overhead(e: EngineBase, steps: int = 300, warmup: int = 20) -> dict:
    """The plugin's own host work per decode step, apart from FastDeploy's launches (issue 24): the
    output copies (``outputs_async``: ring acquire, 3 copies, their event) and the save's host reads
    (``outputs_wait`` without its event wait, timed apart and taken out), one step behind as at a save,
    nothing else queued; real host time (``perf_counter``) on either engine. Median and p90 in us."""
    backend, waited, per_step = e.backend, [], []
    real_wait = backend.wait

    def timed_wait(event, reason):
        t0 = time.perf_counter()
        real_wait(event, reason)
        waited.append(time.perf_counter() - t0)

    e.begin_variant()
    backend.wait = timed_wait  # this instance only, for this loop
    gc.collect()
    gc.disable()  # as ``run_variant``: no collector pauses inside the measured loop
    try:
        pending = None
        for n in range(warmup + steps):
            t0 = time.perf_counter()
            issued = e.outputs_async(n, snapshot=True)
            if pending is not None:
                waited.clear()
                e.outputs_wait(pending)
            spent = time.perf_counter() - t0 - sum(waited)
            pending = issued
            if n >= warmup:
                per_step.append(spent * 1e6)
        e.outputs_wait(pending)
    finally:
        gc.enable()
        del backend.wait
    per_step.sort()
    return {"median_us": statistics.median(per_step), "p90_us": per_step[int(0.9 * (len(per_step) - 1))],
            "steps": len(per_step)}


def host_overhead_line(name: str, r: dict) -> str:
    met = r["median_us"] <= HOST_OVERHEAD_TARGET_US
    return (f"  plugin host overhead per step ({name}): {r['median_us']:.1f} us median (p90 {r['p90_us']:.1f}) over "
            f"{r['steps']} steps: ring acquire + 3 copies + event, and the save's 3 reads (its event wait excluded); "
            f"target <= {HOST_OVERHEAD_TARGET_US:.0f} us: {'met' if met else 'MISSED'}")


# --- PyTorch set-up (GPU only) ------------------------------------------------------------------


def torch_setup(no_batch: bool = False):
    from fd_async_copy_plugin.runtime.cuda import CudaBackend
    from fd_async_copy_plugin.runtime.cudart import CudaRuntime

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _torch_glue import TorchGlue, TorchProbeOps  # benchmarks/_torch_glue.py (imports torch)

    torch.cuda.init()
    stream = torch.cuda.Stream()  # a non-default current stream: every copy must follow it
    torch.cuda.set_stream(stream)
    rt = CudaRuntime()

    def time_sleep(cycles, reps=3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(reps):
            start.record()
            torch.cuda._sleep(int(cycles))
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return statistics.median(out)

    torch.cuda._sleep(1000)
    time_sleep(50_000_000, reps=2)  # ~25 ms warm-up: clocks up
    per_ms = 20_000_000 / time_sleep(20_000_000)
    cache: dict[float, int] = {}

    def cycles_for(ms: float) -> int:
        if ms not in cache:
            c = ms * per_ms
            for _ in range(2):  # refine at the target length
                c *= ms / time_sleep(c)
            cache[ms] = int(c)
        return cache[ms]

    from host_cost_breakdown import build_batch_library  # what CudaBackend loads from the built custom ops

    batch_lib, why = build_batch_library() if not no_batch else (None, "--no-batch")
    if batch_lib is not None:
        rt.use_batch(ctypes.CDLL(batch_lib))
    rt.batch_origin = batch_lib or why
    backend = CudaBackend(glue=TorchGlue(), rt=rt, probe_ops=TorchProbeOps(int(per_ms)))
    probe = backend.ensure_probed(0)
    return torch, backend, rt, per_ms, cycles_for, time_sleep, probe


# --- Issue 40: can the CUDA graph's captured size be decided before prepare's wait? ---------------


def captured_sizes(max_num_seqs: int) -> list[int]:
    """FD 2.4's decode capture sizes for ``max_num_seqs`` (no speculative decoding): 1, 2, 4, 8..128 by
    8, 144..256 by 16, 288..1024 by 32, capped at min(512, max_num_seqs), which is captured too
    (``config.py:928-943`` builds the list, ``:1647-1667`` caps it, ``:898-926`` dedups and sorts)."""
    cap = min(512, max_num_seqs)
    sizes = {1, 2, 4, *range(8, 129, 8), *range(144, 257, 16), *range(288, 1025, 32), cap}
    return sorted(x for x in sizes if x <= cap)


def captured_size(sizes: list[int], count: int) -> int:
    """``real_shape_to_captured_size[count]`` (``config.py:918-926``): the smallest captured size >= the
    count (0 for 0: no tokens, no graph)."""
    return next(x for x in [0, *sizes] if x >= count)


def graph_size_decisions(batch: int, finishes: tuple, eos_share: float, known_share: float,
                         batches: int = 200, seed: int = 40) -> dict:
    """Draining batches of ``batch`` requests, no insert (an insert flushes the last step first, so
    its count has landed in either mode); ``finishes`` = (A, B): A..B requests finish per step
    (uniform), drawn from the running ones. A request can end by EOS or a stop sequence with
    probability ``eos_share`` (else it runs to its ``max_tokens``: ignore_eos, a fixed length); an
    EOS-capable request's finish is its known limit with probability ``known_share``, else EOS/stop.
    For each step N+1 prepared while N runs, the host knows before prepare's wait the slots that ran in
    N (the bound K), N's finishes by a known limit (k) and the EOS-capable slots among the rest (U).
    The exact count is M = K - k - (N's EOS/stop finishes). Fractions of those steps (M > 0):

    - ``decided``: every count in [K - k - U, K - k] has M's captured size (no wait needed);
    - ``exact_known``: U == 0, the host has M without the wait;
    - ``bound_same``: the bound K lands in M's captured size (FD 2.5's sizing keeps FD 2.4's graph);
    - ``guess_same``: K - k (no EOS/stop finish assumed) lands in M's size: a launch at that size is
      FD 2.4's graph; on the other steps (``1 - guess_same``) it would need a redo at M.
    """
    rng = np.random.default_rng(seed)
    sizes = captured_sizes(batch)
    size = {c: captured_size(sizes, c) for c in range(batch + 1)}
    lo, hi = finishes
    n = decided = exact_known = bound_same = guess_same = 0
    for _ in range(batches):
        eos = rng.random(batch) < eos_share  # per running request: can it end by EOS/stop
        while len(eos):
            running = len(eos)
            ending = rng.choice(running, size=min(running, int(rng.integers(lo, hi + 1))), replace=False)
            by_eos = eos[ending] & (rng.random(len(ending)) >= known_share)
            known = len(ending) - int(by_eos.sum())
            count = running - len(ending)  # M: step N+1's exact token count (one row per decode slot)
            if count > 0:
                n += 1
                guess = running - known
                can_end = int(eos.sum()) - int((eos[ending] & ~by_eos).sum())  # U: EOS-capable, no known end
                decided += size[max(guess - can_end, 0)] == size[guess]
                exact_known += can_end == 0
                bound_same += size[running] == size[count]
                guess_same += size[guess] == size[count]
            eos = np.delete(eos, ending)
    return {"steps": n, "sizes": sizes, "decided": decided / n, "exact_known": exact_known / n,
            "bound_same": bound_same / n, "guess_same": guess_same / n}


#: (eos_share, known_share) rows of ``--graph-sizes``
GRAPH_CASES = ((1.0, 0.0), (1.0, 0.5), (0.5, 0.0), (0.1, 0.0), (0.0, 0.0))


def graph_size_report(batch: int, finishes: tuple, cases=GRAPH_CASES) -> dict:
    say(f"captured size of step N+1 before the wait at the prepare: B={batch} draining (no inserts), {finishes[0]}-"
        f"{finishes[1]} finishes per step")
    sizes = captured_sizes(batch)
    say(f"FD 2.4 capture sizes at max_num_seqs={batch}: {', '.join(map(str, sizes))}")
    say(f"{'EOS-capable':>12s}{'known end':>10s}{'steps':>7s}{'decided':>9s}{'exact known':>13s}"
        f"{'bound same':>12s}{'guess same':>12s}")
    out = {}
    for eos_share, known_share in cases:
        r = out[(eos_share, known_share)] = graph_size_decisions(batch, finishes, eos_share, known_share)
        say(f"{eos_share:12.2f}{known_share:10.2f}{r['steps']:7d}{r['decided']:9.3f}{r['exact_known']:13.3f}"
            f"{r['bound_same']:12.3f}{r['guess_same']:12.3f}")
    say("EOS-capable: share of requests that can end by EOS/stop; known end: share of their finishes at a "
        "known limit. decided: every count the EOS-capable slots leave possible has one captured size (no "
        "wait); exact known: no EOS-capable slot left (the host has the count); bound same / guess same: "
        "the bound / the bound less the known finishes lands in the exact count's captured size (a launch "
        "there is FD 2.4's graph; otherwise a redo). A simulation of counts, not a measurement.")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, one round")
    parser.add_argument("--output", help="also write the report here")
    parser.add_argument("--no-batch", action="store_true", help="each copy its own ctypes call (no fdac_d2h_batch)")
    parser.add_argument("--dry-run", action="store_true", help="fake clock, no GPU and no torch (logic check + model)")
    parser.add_argument("--config", action="append", default=[],
                        help="extra NAME:forward:sampler:prepare:between:save (ms); repeatable")
    parser.add_argument("--only", help="comma list of configs to run (default: tpot11,hostheavy and --config ones)")
    parser.add_argument("--steps", type=int, help="measured steps per variant and round (default 200, quick 60)")
    parser.add_argument("--warmup", type=int, help="warm-up steps (default 30, quick 10)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, quick 1)")
    parser.add_argument("--batch", type=int, default=64, help="running slots B (default 64)")
    parser.add_argument("--max-seqs", type=int, default=256, help="max_num_seqs M (default 256)")
    parser.add_argument("--host-split", metavar="JSON[:B]",
                        help="divide each config's host time as the measured split does (benchmarks/"
                             "overlap_exact_phases.py --json), at batch B (default: --batch's, else the largest)")
    parser.add_argument("--finishes", metavar="A-B", help="A..B requests finish per step (cycling), each refilled "
                        "by an insert at the next step's start (e.g. 1-3)")
    parser.add_argument("--insert-ms", type=float, default=0.05,
                        help="host ms per inserted request with --finishes (default 0.05, an assumption)")
    parser.add_argument("--graph-sizes", action="store_true",
                        help="only simulate whether step N+1's CUDA-graph captured size is known before exact's "
                             "wait (--batch, --finishes, default 1-3); no GPU, no schedule")
    args = parser.parse_args(argv)
    steps = args.steps or (60 if args.quick else 200)
    warmup = args.warmup or (10 if args.quick else 30)
    rounds = args.rounds or (1 if args.quick else 3)
    configs = dict(CONFIGS)
    for spec in args.config:
        name, *vals = spec.split(":")
        configs[name] = StepConfig(name, *(float(v) for v in vals))
    if args.only:
        configs = {k: configs[k] for k in args.only.split(",")}
    try:
        finishes = tuple(int(x) for x in args.finishes.split("-")) if args.finishes else ()
        if finishes and (len(finishes) != 2 or not 0 < finishes[0] <= finishes[1] <= args.batch):
            raise ValueError
    except ValueError:
        parser.error(f"--finishes {args.finishes}: expected A-B with 1 <= A <= B <= --batch, e.g. 1-3")
    if args.graph_sizes:
        say(f"$ python3 benchmarks/step_model.py {' '.join(argv if argv is not None else sys.argv[1:])}")
        graph_size_report(args.batch, finishes or (1, 3))
        if args.output:
            Path(args.output).write_text(OUT.getvalue())
        return 0
    if finishes:
        configs = {k: replace(c, finishes=finishes, insert_ms=args.insert_ms) for k, c in configs.items()}
    if args.host_split:
        path, _, batch = args.host_split.partition(":")
        try:
            split = json.loads(Path(path).read_text())
            batches = split["batches"]
            batch = batch or (str(args.batch) if str(args.batch) in batches else max(batches, key=int))
            configs = {k: split_config(c, split, batch, path) for k, c in configs.items()}
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"--host-split {args.host_split}: {type(exc).__name__}: {exc} (expected the JSON of "
                         "benchmarks/overlap_exact_phases.py --json, and a batch it measured)")
    logging.getLogger("fd_async_copy").setLevel(logging.ERROR)
    say(f"$ python3 benchmarks/step_model.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    say(f"B={args.batch} running slots, M={args.max_seqs}; {warmup} warm-up + {steps} measured steps per variant, "
        f"{rounds} interleaved round(s); ms/step = median time between consecutive saves; 'waited' = host time "
        f"in the listed waits per step, 'host' = ms/step minus that")
    failures: list[str] = []
    models = {}
    for name, cfg in configs.items():
        fake = FakeEngine(cfg, args.batch, args.max_seqs)
        models[name] = measure(fake, min(warmup, 10), min(steps, 60), 1)
        if fake.stale_reads:
            failures.append(f"{name}: dry run read {fake.stale_reads} outputs before their event")
    ratios, ratios25 = {}, {}
    if args.dry_run:
        say(f"DRY RUN: fake clock (assumed costs: launch {FakeEngine.LAUNCH * 1e3:.0f} us, blocking round trip "
            f"{FakeEngine.ROUND_TRIP * 1e3:.0f} us, event wake-up {FakeEngine.WAKE * 1e3:.0f} us); plugin HostBackend + "
            "PinnedRing over host memory; no torch, no GPU")
        for name, cfg in configs.items():
            say()
            failures += report(cfg, models[name], None, "model")
            say(host_overhead_line(f"{name}, host backend, real time", plugin_host_overhead(
                FakeEngine(cfg, args.batch, args.max_seqs))))
            ratios[name] = mode_ratios(models[name])
            ratios25[name] = fd25_ratio(models[name])
    else:
        torch, backend, rt, per_ms, cycles_for, time_sleep, probe = torch_setup(args.no_batch)
        say(f"framework (GPU work and the stream only): PyTorch {torch.__version__}, {torch.cuda.get_device_name(0)}; "
            f"Paddle imported: {'paddle' in sys.modules}")
        say(f"CUDA layer: {rt.versions()}; accessor probe: {'ok' if probe['ok'] else 'FAILED ' + probe['reason']}")
        say(f"a step's copies and event: {'one C call, fdac_d2h_batch ' if rt.batch else 'one ctypes call each: '}"
            f"{rt.batch_origin}")
        say(f"spin kernel: {per_ms / 1e3:.0f} cycles/us; copies/events/stream syncs through runtime.cudart + CudaBackend + "
            "PinnedRing (blocking-sync events, GIL released); blocking copies = backend.blocking_d2h (torch .cpu()); "
            "pageable H2D = torch copy_ from CPU")
        for name, cfg in configs.items():
            say()
            t0 = time.perf_counter()
            engine = TorchEngine(cfg, args.batch, args.max_seqs, backend, torch, cycles_for)
            fwd = time_sleep(engine.c_fwd) * engine.forward_kernels
            samp = time_sleep(engine.c_samp)
            say(f"calibrated: forward {engine.forward_kernels} x {fwd / engine.forward_kernels:.3f} = {fwd:.3f} ms, "
                f"sampler {samp:.3f} ms (CUDA events)")
            res = measure(engine, warmup, steps, rounds)
            failures += report(cfg, res, models[name], "measured on the GPU; model = fake clock")
            say(host_overhead_line(name, plugin_host_overhead(engine)))
            ratios[name] = mode_ratios(res)
            ratios25[name] = fd25_ratio(res)
            say(f"  ({time.perf_counter() - t0:.1f} s)")
            engine = None
    say()
    for judge, judged in ((verdicts, ratios), (fd25_verdicts, ratios25)):
        lines, missed = judge(judged)
        for line in lines:
            say(line)
        failures += missed
    say("The numbers are modelled (spin kernels and busy-waits placed at FD 2.4's and FD 2.5's sites), "
        "not FastDeploy measurements.")
    say(f"RESULT: {'PASS' if not failures else 'FAIL'}" + (f" ({'; '.join(failures)})" if failures else "")
        + (" [dry run: fake clock, not a measurement]" if args.dry_run else ""))
    if args.output:
        Path(args.output).write_text(OUT.getvalue())
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
