"""Feature ``step_syncs``: one host wait per FastDeploy 2.4 decode step (the save event); no wait for
the forward at FastDeploy 2.5's sampler.

Why:    With the stop-flag and logprob backports, a plain FastDeploy 2.4 decode step still blocks the
        host at five points (fd24-step-syncs.md): **T** ``top_p_sampling`` gets the CPU tensor
        ``infer_seed`` as ``topp_seed``, so Paddle synchronizes the stream (forward, logits,
        penalties) before copying it; **S1** ``get_padding_offset`` copies the token count to the
        host; **S2** ``np.max(bad_tokens_len.numpy())``; **S3/S7** ``exist_prefill()`` reads
        ``seq_lens_encoder``; **I1** ``insert_tasks_v1`` reads ``is_block_step[idx]`` for a DECODE
        task, and every insert writes block-table rows with a synchronous pageable H2D. As long as
        T drains the stream the host stays serialized with the GPU.
How:    A host shadow of the step state the host needs (``seq_lens_this_time`` buffer,
        ``seq_lens_encoder``, ``is_block_step``, ``step_seq_lens_decoder``, ``bad_tokens_len``,
        ``block_tables``), kept exact without reproducing FastDeploy's insert code:
        - the host's own writes are observed where FastDeploy makes them (``_tensor_watch``: during
          the insert functions ``share_inputs`` hands out a stand-in for each watched tensor, whose
          ``__setitem__`` is applied to the shadow too, with the same key and value; a write made
          past it loses that shadow until reloaded);
        - what the device changes in a step is copied into pinned buffers right after the update op,
          under the stop flag's event (the one the save waits on), and read at the next insert;
        - ``recover_decode_task`` (run at the start of ``_prepare_inputs``) is replayed on the
          shadow (recover_decode_task.cu: a block-step slot whose next block exists resumes).
        With it: T - ``infer_seed`` and its increment live on the device (as develop's #6765), so
        ``top_p_sampling`` gets a device input and insert-time seed writes are device fills;
        S1 - ``get_padding_offset`` gets the count as a host tensor (the 2.4 op then copies host to
        host), and the device count is copied under the step's event and compared at the next
        step (a mismatch stands S1 down for the runner, logged); S2 - ``bad_tokens_len.numpy()``
        inside ``_prepare_inputs`` answers from the shadow (as #5548); S3/S7 - ``exist_prefill()``
        answers ``any(seq_lens_encoder > 0)`` from the shadow (as #6172's host flag); I1 - the
        block-step flag read answers from the shadow, and block-table rows are written into a
        pinned mirror and copied to the device asynchronously on the stream (as #6356).
        Whenever the host cannot know (the shadow lost track, dummy/profile runs, non-V1 scheduler,
        speculative decoding, a block column outside the table), FastDeploy's own synchronous path
        runs; every such step is counted by cause (``status()``: the runner's ``fallbacks``).
Mirrors: FastDeploy #6765/#6668 (T), #5440/#6170 (S1), #5548 (S2), #6172 (S3/S7), #6356 (I1).
FD:     2.4, with ``stop_flag`` active on the runner (its event covers the snapshot). 2.5 has
        S1/S2/S3 fixed itself; there T is removed (the seed and its increment moved to the device
        after ``GPUModelRunner.__init__``) and its two short ``token_num_event`` waits
        (``_prepare_inputs`` :1332-1341, ``_postprocess`` :2365-2371): ``TokenShadow`` keeps the
        same kind of exact host shadow, its snapshot copied right after ``update_inputs_v1`` and
        taken after the save's own wait on post_process_event (no wait of its own); FD's
        ``create_event()`` made inside ``_prepare_inputs`` is a ``DeferredEvent`` whose wait is
        owed and runs only before a read of the pinned counts the shadow does not answer (counted
        by cause). No other feature needed. I1 stays on 2.5. develop has all of them fixed.
Delete: the 2.4 part when FastDeploy 2.4 is no longer served; the 2.5 part with 2.5.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import threading
import weakref

import numpy as np
import paddle

from fd_async_copy_plugin.registry.patch import IncompatibleError, Junction, Patch, Target, wraps

from .runner import FeatureRunners, RunnerFeature, is_cuda_runner, part, per_runner, runner_state
from ._tensor_watch import (CREATE_EVENT, DeferredEvent, ServedRead, Watched, basic_key, deferred_events, host_value,
                            rows_of, watching, _UNKNOWN)

log = logging.getLogger("fd_async_copy")

RUNNER = "worker.gpu_model_runner"
POSTPROC = "model_executor.pre_and_post_process"
INPUT_BATCH = "worker.input_batch"
FD24, FD25 = ("fastdeploy-2.4",), ("fastdeploy-2.5",)

#: shadow name -> share_inputs key (None: the runner's ``seq_lens_this_time_buffer``)
SHADOWED = {
    "this_time": None,
    "enc": "seq_lens_encoder",
    "block_step": "is_block_step",
    "step_dec": "step_seq_lens_decoder",
    "bad_len": "bad_tokens_len",
    "tables": "block_tables",
}
#: what the device changes during a step: copied to pinned after the update op, every step
SNAPSHOT = ("this_time", "enc", "block_step", "step_dec")
SNAPSHOT_LABELS = tuple((name, f"step_syncs.{name}") for name in SNAPSHOT)

_armed = threading.local()  # the count _prepare_inputs computed, for get_padding_offset


class _Mirror(Watched):
    """A watched tensor whose host writes are applied to the shadow too (``shadow.host_write``; FD
    2.4's ``StepShadow`` and FD 2.5's ``TokenShadow``); a write it cannot follow loses that shadow."""

    def __init__(self, shadow, name: str, tensor) -> None:
        super().__init__(tensor)
        self.shadow, self.name = shadow, name

    def setitem(self, original, key, value) -> None:
        original(self.tensor, key, value)
        v = host_value(value, self.tensor)
        if v is _UNKNOWN or not basic_key(key):
            self.shadow.lose(self.name, f"a write FastDeploy made to {self.name} with a device value or a mask")
        else:
            self.shadow.host_write(self.name, key, v)

    def unseen(self) -> None:
        self.shadow.fallback(f"a write to {self.name} past the watch (an earlier reference or another thread)")
        self.shadow.lose(self.name, "a write FastDeploy made past the watch")


class _Mirror24(_Mirror):
    """FD 2.4: also the host reads the shadow answers (I1, S2)."""

    def getitem(self, original, key):
        # I1: ``if share_inputs["is_block_step"][idx]:`` - answered on the host when known.
        if self.name == "block_step" and basic_key(key) and self.shadow.known(self.name):
            self.shadow.served["I1 is_block_step read"] += 1
            return paddle.to_tensor(np.array(self.shadow.arrays[self.name][key]), place=paddle.CPUPlace())
        if self.name == "block_step":
            self.shadow.fallback("I1: shadow of is_block_step not known")
        return NotImplemented

    def numpy(self, original):
        # S2: ``np.max(share_inputs["bad_tokens_len"].numpy())`` in _prepare_inputs.
        if self.name == "bad_len" and self.shadow.known(self.name):
            self.shadow.served["S2 bad_tokens_len"] += 1
            return self.shadow.arrays[self.name].copy()
        if self.name == "bad_len":
            self.shadow.fallback("S2: shadow of bad_tokens_len not known")
        return NotImplemented


class _BadTokensRead(_Mirror24):
    """``_prepare_inputs``' one read of ``bad_tokens_len`` (S2); the view goes after it."""

    once = True


class _StagedTable(Watched):
    """``block_tables``: host writes go into a pinned mirror; the rows written are copied to the
    device asynchronously when the FastDeploy call returns (``StepShadow.flush``)."""

    name = "tables"

    def __init__(self, shadow: "StepShadow", tensor) -> None:
        super().__init__(tensor)
        self.shadow = shadow

    def setitem(self, original, key, value):
        shadow = self.shadow
        v = host_value(value, self.tensor)
        if v is _UNKNOWN or not basic_key(key) or not shadow.known("tables"):
            shadow.flush()  # staged rows land first, in stream order, then FastDeploy's own write
            shadow.lose("tables", "a block-table write with a device value or mask")
            return NotImplemented
        if not shadow.dirty:
            backend = shadow.backend
            if backend.h2d_in_flight(shadow.tables):
                # rows staged at an insert before a step that never reached the update op (an idle
                # step: no event covers their copy): wait for that copy before rewriting the mirror
                shadow.fallback("I1: the last staged rows had no step event; their copy was waited for")
                backend.wait(backend.record("step_syncs.block_tables"), "insert.block_tables")
            backend.before_host_write(shadow.tables, "insert.block_tables")
        rows = rows_of(key, shadow.arrays["tables"].shape[0])
        try:
            shadow.arrays["tables"][key] = v
        except Exception as exc:  # the mirror cannot take it: FastDeploy's own write, shadow reloads
            shadow.dirty.update(rows)  # the rows already staged keep their order before FD's write
            shadow.flush()
            shadow.lose("tables", f"a block-table write it cannot follow ({exc})")
            return NotImplemented
        shadow.dirty.update(rows)
        return None

    def unseen(self) -> None:
        self.shadow.fallback("a write to tables past the watch (an earlier reference or another thread)")
        self.shadow.flush()
        self.shadow.lose("tables", "a block-table write made past the watch")


class StepShadow:
    """The host's exact copy of the step state it needs, for one runner."""

    def __init__(self, runner, backend, block_size: int) -> None:
        self.backend = backend
        self.glue = backend.glue
        self.block_size = int(block_size)
        self.share_inputs = si = runner.share_inputs
        self.tensors = {name: (runner.seq_lens_this_time_buffer if key is None else si[key])
                        for name, key in SHADOWED.items()}
        self.arrays: dict[str, np.ndarray] = {}
        self._known: dict[str, bool] = {}
        self.fallbacks, self.served = collections.Counter(), collections.Counter()
        self.s1_off = ""  # why S1 stood down for good (a count mismatch), "" while it runs
        self.snap = {  # pinned copies of the device state; the step snapshot uses SNAPSHOT's
            name: backend.new_pinned(self.glue.shape(self.tensors[name]), self.glue.dtype(self.tensors[name]),
                                     f"step_syncs.{name}")
            for name in SHADOWED if name != "tables"
        }
        tables = self.tensors["tables"]
        self.tables = backend.new_pinned(self.glue.shape(tables), self.glue.dtype(tables), "step_syncs.block_tables")
        self.snap_count = None  # pinned copy of the device token count, made at the first armed step
        self.count_src = None  # this step's device token count (get_padding_offset's input)
        self.count_used: int | None = None
        self.count_is_bound = False  # this step's count is an upper bound (overlap), not exact
        self.snap_pending = False
        self.snap_expect: tuple[int, bool] | None = None  # (count used, it was an upper bound)
        self.snap_nr = 0  # the running slots when the snapshot was issued
        self.dirty: set[int] = set()
        self.load("construction")

    # -- state --------------------------------------------------------------------------------
    def known(self, name: str) -> bool:
        return self._known.get(name, False)

    def lose(self, name: str, why: str) -> None:
        if self._known.get(name):
            log.info("fd_async_copy step_syncs: lost track of %s (%s); FastDeploy's own path until reloaded", name, why)
        self._known[name] = False

    def host_write(self, name: str, key, value) -> None:
        """FastDeploy's host write to the tensor behind ``name`` (``_Mirror``), on its shadow too."""
        try:
            self.arrays[name][key] = value
        except Exception as exc:  # never fail FastDeploy's write: the shadow reloads instead
            self.lose(name, f"a write FastDeploy made to {name} it cannot follow ({exc})")

    def fallback(self, cause: str) -> None:
        self.fallbacks[cause] += 1

    def load(self, why: str) -> None:
        """Every shadow from the device (copies, one event, one wait): at construction and after a
        reset, never in a decode step."""
        from fd_async_copy_plugin.runtime.backend import host_view

        backend = self.backend
        backend.before_host_write(self.tables, "step_syncs.load")
        for name, t in self.tensors.items():
            backend.copy_d2h(self.tables if name == "tables" else self.snap[name], t, f"step_syncs.load.{name}")
        backend.wait(backend.record("step_syncs.load"), f"step_syncs.load({why})")
        for name in self.tensors:
            if name == "tables":
                self.arrays[name] = host_view(self.tables, self.glue)  # written in place, copied from
            else:
                self.arrays[name] = backend.read(self.snap[name], f"step_syncs.load.{name}")
            self._known[name] = True
        self.snap_pending = False
        self.dirty.clear()
        self.fallbacks[f"shadow loaded ({why})"] += 1

    def ensure_loaded(self) -> None:
        """After a dummy run (or a write the host could not follow) the shadow of a host-written
        tensor is unknown: reload everything before the next real step."""
        if not (self.known("tables") and self.known("bad_len")):
            self.load("after a dummy run or an untracked write")

    # -- the step's device changes --------------------------------------------------------------
    def snapshot_copies(self) -> list:
        """Right after the update op: the snapshot's copies, issued in the stop flag's batch before
        its event is recorded (``RunnerState.step_copies``)."""
        copies = [(self.snap[name], self.tensors[name], label) for name, label in SNAPSHOT_LABELS]
        self.snap_expect = None
        if self.count_src is not None and self.count_used is not None:
            if self.snap_count is None:
                self.snap_count = self.backend.new_pinned(
                    self.glue.shape(self.count_src), self.glue.dtype(self.count_src), "step_syncs.token_num")
            copies.append((self.snap_count, self.count_src, "step_syncs.token_num"))
            self.snap_expect = (self.count_used, self.count_is_bound)
        self.count_src = self.count_used = None
        self.count_is_bound = False
        self.snap_nr = int(self.glue.shape(self.share_inputs["seq_lens_this_time"])[0])
        self.snap_pending = True
        return copies

    def snapshot_in_flight(self) -> bool:
        """The last step's snapshot is issued and no wait has covered it yet (overlap: the save of
        that step comes after the next forward)."""
        return self.snap_pending and not self.backend.copy_waited(self.snap["this_time"])

    def refresh(self, reader: str) -> None:
        """Take the last step's snapshot (its event was waited on by the save: no wait here)."""
        if not self.snap_pending:
            return
        self.snap_pending = False
        for name in SNAPSHOT:
            values = self.backend.host_array(self.snap[name], f"{reader}.{name}")  # (owned)
            self.arrays[name] = values.reshape(self.arrays[name].shape)
            self._known[name] = True
        if self.snap_expect is not None and self.snap_count is not None:
            device_count = int(self.backend.host_array(self.snap_count, f"{reader}.token_num").reshape(-1)[0])
            used, bound = self.snap_expect
            wrong = device_count > used if bound else device_count != used
            if wrong and not self.s1_off:
                what = "upper bound" if bound else "token count"
                self.s1_off = (f"the host {what} {used} did not hold for the device's count {device_count}; "
                               "S1 uses FastDeploy's synchronous count from now on")
                log.error("fd_async_copy step_syncs: %s", self.s1_off)
        self.snap_expect = None

    def flush(self) -> None:
        """Copy the block-table rows written on the host to the device, on the stream."""
        if not self.dirty:
            return
        rows = sorted(self.dirty)
        self.dirty.clear()
        table = self.tensors["tables"]
        row_bytes = self.arrays["tables"].strides[0]
        base, device = self.glue.address(table), self.glue.gpu_device(table)
        start = prev = rows[0]
        for row in rows[1:] + [None]:
            if row is not None and row == prev + 1:
                prev = row
                continue
            n = (prev - start + 1) * row_bytes
            self.backend.copy_h2d(base + start * row_bytes, device, self.tables, start * row_bytes, n,
                                  "step_syncs.block_tables")
            if row is not None:
                start = prev = row
        self.served["I1 block-table rows staged"] += len(rows)

    def handlers(self) -> list:
        out = [_Mirror24(self, name, self.tensors[name]) for name in SHADOWED if name != "tables"]
        out.append(_StagedTable(self, self.tensors["tables"]))
        return out

    # -- answers --------------------------------------------------------------------------------
    def recover_and_count(self, num_running: int) -> int | None:
        """Replay ``recover_decode_task`` on the shadow and return the step's token count, or None
        when the host cannot know it."""
        if not all(self.known(n) for n in ("this_time", "block_step", "step_dec", "tables", "enc")):
            return None
        this_time = self.arrays["this_time"].reshape(-1)
        block_step = self.arrays["block_step"].reshape(-1)
        step_dec = self.arrays["step_dec"].reshape(-1)
        enc = self.arrays["enc"].reshape(-1)
        tables = self.arrays["tables"]
        for i in np.flatnonzero(block_step[:num_running]):
            col = int(step_dec[i]) // self.block_size
            if col < 0 or col >= tables.shape[1]:
                return None
            if tables[i, col] != -1:
                block_step[i] = False
                this_time[i] = 1
                enc[i] = 0
        return int(this_time[:num_running].astype(np.int64).sum())

    def upper_bound(self, num_running: int) -> int | None:
        """Overlap, no insert since the last step: the snapshot of that step is still in flight.
        Its update op leaves every running slot at 0 or 1 token and recovers nothing without a new
        block (no insert gave one), so the slots that ran bound the next step's count."""
        if not (self.known("this_time") and self.snap_nr == num_running):
            return None
        return int((self.arrays["this_time"].reshape(-1)[:num_running] > 0).sum())

    def exist_prefill(self) -> bool | None:
        if not self.known("enc"):
            return None
        enc = self.arrays["enc"].reshape(-1)
        if self.snapshot_in_flight():
            # right after a step whose snapshot has not landed: its update op zeroed
            # seq_lens_encoder of every running slot (update_inputs_v1.cu), the others are as known
            return bool(np.any(enc[self.snap_nr:] > 0))
        return bool(np.any(enc > 0))


class RunnerSyncs:
    """One runner's step_syncs part: the device seed, and on FastDeploy 2.4 the shadow."""

    def __init__(self, shadow: StepShadow | None = None) -> None:
        self.shadow = shadow  # None on FastDeploy 2.5: the seed is all it moves
        self.increment = None  # the device copy of runner.infer_seed_increment
        self.seed = None  # FastDeploy 2.5: the device infer_seed made at construction
        # what was answered on the host, and why FastDeploy's own path ran (the shadow's counters on 2.4)
        self.served = shadow.served if shadow is not None else collections.Counter()
        self.fallbacks = shadow.fallbacks if shadow is not None else collections.Counter()
        self.token_off = ""  # FastDeploy 2.5: why this runner has no token-count shadow ("" when it has)
        #: FastDeploy 2.5: the last step's token_num_event(s) whose wait the plugin skipped
        self.unwaited: list = []

    def report(self) -> dict:
        return {"reason": getattr(self.shadow, "s1_off", "") or self.token_off, "fallbacks": dict(self.fallbacks),
                "served": dict(self.served)}


def _device_copy(t, like):
    """``t`` as a tensor on FastDeploy's device (made as FastDeploy makes its buffers: no place)."""
    out = paddle.to_tensor(np.array(t.numpy()))
    if str(out.place) != str(like.place):
        raise ValueError(f"a new tensor lands on {out.place}, FastDeploy's buffers on {like.place}")
    return out


def own_path_reason(runner, runner_module) -> str:
    """Why this runner's step cannot use the shadow ("" when it can)."""
    envs = getattr(runner_module, "envs", None) or sys.modules.get(runner_module.__name__.split(".worker.")[0] + ".envs")
    if envs is not None and not getattr(envs, "ENABLE_V1_KVCACHE_SCHEDULER", True):
        return "non-V1 scheduler (step_cuda rewrites the step state on the device)"
    if getattr(runner, "speculative_decoding", False):
        return "speculative decoding"
    if getattr(getattr(runner, "parallel_config", None), "use_ep", False):
        return "expert parallelism (an idle step returns before the update op: no snapshot)"
    return ""


def shadow_not_exact(runner, runner_module, postproc) -> str:
    """Why no shadow answer may be served for ``runner`` now ("" when they may): the runner's own
    path (``own_path_reason``), or the update op is no longer the plugin's (a reloaded FastDeploy
    module): then no snapshot follows the device's changes."""
    why = own_path_reason(runner, runner_module)
    if why:
        return why
    if Junction.at(postproc, "update_inputs_v1") is None:
        return "update_inputs_v1 is FastDeploy's own again (module reloaded?): no snapshot of the step"
    return ""


# --- runner patches ------------------------------------------------------------------------------


def build_init_share_inputs(original, ctx):
    registry: FeatureRunners = ctx.state
    runner_module = ctx.module(RUNNER)

    @wraps(original)
    def _init_share_inputs(self, max_num_seqs: int):
        original(self, max_num_seqs)
        why = own_path_reason(self, runner_module)  # first: the runner's own reason, not stop_flag's
        if why:  # the shadow could never be exact for this runner: touch nothing
            registry.stand_down(self, f"{why}: the host cannot know this runner's step state", logging.INFO)
            return
        if part(self, "stop") is None:
            registry.stand_down(self, "needs stop_flag on this runner (its event covers the step snapshot), "
                                      "which does not run here")
            return
        si = self.share_inputs
        try:
            si["infer_seed"] = _device_copy(si["infer_seed"], si["stop_flags"])  # T
            state = RunnerSyncs(StepShadow(self, ctx.backend, self.cache_config.block_size))
        except Exception as exc:  # never stop FastDeploy: this runner keeps its own path
            registry.stand_down(self, f"cannot set up ({type(exc).__name__}: {exc})")
            return
        registry.add(self, state)

    return _init_share_inputs


def build_reset_share_inputs(original, ctx):
    @per_runner(original, "syncs")
    def reset_share_inputs(state, self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state.shadow.load("reset_share_inputs")
        return result

    return reset_share_inputs


def build_insert(original, ctx):
    runner_module, postproc = ctx.module(RUNNER), ctx.module(POSTPROC)

    @per_runner(original, "syncs")
    def insert(state, self, *args, **kwargs):
        shadow = state.shadow
        why = shadow_not_exact(self, runner_module, postproc)
        if why:
            shadow.fallback(why)
            for name in SHADOWED:
                shadow.lose(name, why)
            return original(self, *args, **kwargs)
        if original.__name__ != "_dummy_prefill_inputs":
            shadow.ensure_loaded()
        shadow.refresh(original.__name__)
        with watching(shadow.handlers(), runner=self):
            try:
                return original(self, *args, **kwargs)
            finally:
                shadow.flush()

    return insert


def build_prepare_inputs(original, ctx):
    runner_module, postproc = ctx.module(RUNNER), ctx.module(POSTPROC)

    @per_runner(original, "syncs")
    def _prepare_inputs(state, self, *args, **kwargs):
        shadow = state.shadow
        si = self.share_inputs
        # T: the increment FastDeploy made with .cpu() in __init__ (after _init_share_inputs).
        if self.infer_seed_increment is not state.increment:
            state.increment = _device_copy(self.infer_seed_increment, si["stop_flags"])
            self.infer_seed_increment = state.increment
        dummy = bool(kwargs.get("is_dummy_or_profile_run", args[0] if args else False))
        if not dummy:
            shadow.ensure_loaded()
        steps = runner_state(self)
        bound = not dummy and steps.bound_count_step() and shadow.snapshot_in_flight()
        if not bound:  # free unless the overlap schedule's exact count waits here for the last step
            shadow.refresh("overlap.exact count" if steps.holds_unsaved_step() else "_prepare_inputs")
        why = "dummy/profile run" if dummy else (shadow_not_exact(self, runner_module, postproc)
                                                 or shadow.s1_off and "S1 stood down")
        count = None
        if not why:
            num_running = int(si["seq_lens_this_time"].shape[0])
            count = shadow.upper_bound(num_running) if bound else shadow.recover_and_count(num_running)
            if count is None:
                if bound:  # FastDeploy's synchronous count needs the last step: wait for it
                    shadow.refresh("_prepare_inputs")
                    count = shadow.recover_and_count(num_running)
                    shadow.fallback("overlap: no upper bound, the last step's snapshot was waited for")
                if count is None:
                    why = "S1: the shadow cannot tell the count"
        if why:
            shadow.fallback(why)
            # recover_decode_task runs on the device: the shadow no longer matches until the snapshot.
            # A dummy run's step_cuda (also under V1) rewrites block tables and slots on the device:
            # everything is reloaded before the next real step.
            for name in (SHADOWED if dummy else ("this_time", "block_step", "enc")):
                shadow.lose(name, why)
        shadow.count_is_bound = bool(bound and count is not None and not why and shadow.snapshot_in_flight())
        _armed.shadow, _armed.count = (shadow, count) if count is not None else (None, None)
        try:
            with watching([_BadTokensRead(shadow, "bad_len", shadow.tensors["bad_len"])], runner=self):
                return original(self, *args, **kwargs)
        finally:
            _armed.shadow = _armed.count = None

    return _prepare_inputs


def build_exist_prefill(original, ctx):
    runner_module, postproc = ctx.module(RUNNER), ctx.module(POSTPROC)

    @per_runner(original, "syncs")
    def exist_prefill(state, self):
        why = shadow_not_exact(self, runner_module, postproc)
        if why:
            state.shadow.fallback(f"S3/S7: {why}")
            return original(self)
        if not (runner_state(self).holds_unsaved_step() and state.shadow.snapshot_in_flight()):
            state.shadow.refresh("exist_prefill")
        answer = state.shadow.exist_prefill()
        if answer is None:
            state.shadow.fallback("S3/S7: shadow of seq_lens_encoder not known")
            return original(self)
        state.shadow.served["S3/S7 exist_prefill"] += 1
        return answer

    return exist_prefill


def check_get_padding_offset(original, ctx) -> None:
    if original is None:
        raise IncompatibleError("get_padding_offset is not available (FastDeploy's ops are not compiled)")


def build_get_padding_offset(original, ctx):
    @wraps(original)
    def get_padding_offset(input_ids, token_num, *args, **kwargs):
        shadow, count = getattr(_armed, "shadow", None), getattr(_armed, "count", None)
        if shadow is None:
            return original(input_ids, token_num, *args, **kwargs)
        # S1: the 2.4 op copies token_num to the host to size its outputs; a host tensor makes that
        # a host-to-host memcpy. The device count is copied under the step's event and compared.
        host = paddle.to_tensor(np.array(count).reshape(tuple(token_num.shape)).astype(
            np.dtype(str(token_num.dtype).replace("paddle.", ""))), place=paddle.CPUPlace())
        shadow.count_src, shadow.count_used = token_num, count
        shadow.served["S1 token count"] += 1
        outputs = original(input_ids, host, *args, **kwargs)
        if not shadow.count_is_bound:
            return outputs
        # Overlap: the count is an upper bound. FastDeploy 2.4's op leaves the outputs' tail past the
        # real count uninitialised; fill it as 2.5's op does (ids 2, batch id -1), on the device.
        shadow.served["S1 upper bound (tail filled)"] += 1
        ids, batch_ids, cu_q = outputs[0], outputs[1], outputs[2]
        real = cu_q.reshape([-1])[-1:].astype("int64")
        tail = paddle.arange(count, dtype="int64") >= real
        ids = paddle.where(tail, paddle.full_like(ids, 2), ids)
        batch_ids = paddle.where(tail.reshape(batch_ids.shape), paddle.full_like(batch_ids, -1), batch_ids)
        return (ids, batch_ids, *outputs[2:])

    return get_padding_offset


# --- FastDeploy 2.5: the sampling seed (T) ------------------------------------------------------
# 2.5 keeps ``infer_seed`` (InputBatch.init_share_inputs, input_batch.py:170) and the runner's
# ``infer_seed_increment`` (gpu_model_runner.py:207-211) on the host: ``top_p_sampling`` gets a host
# ``topp_seed`` and Paddle's data transform synchronizes the stream before copying it - the one long
# wait of a 2.5 step, and under 2.5's overlap schedule the wait for the forward being prepared. Its
# writers (insert :897-898 / :1126-1127 setitem of a Python int, ``add_``/``%=`` :2573-2574,
# ``fill_`` in reset_share_inputs, ``swap_data`` in swap_states) all work in place on a device tensor.


def _move_seed(runner, state: RunnerSyncs, place=None) -> None:
    """``infer_seed`` and its increment as copies of FastDeploy's (same values) on FastDeploy's
    device, or at ``place``; both always move together (a host seed with a device increment, or
    the reverse, breaks FastDeploy's ``add_``)."""
    si = runner.share_inputs
    pair = (si["infer_seed"], runner.infer_seed_increment)
    if place is None:
        seed, increment = (_device_copy(t, si["stop_flags"]) for t in pair)
    else:
        seed, increment = (paddle.to_tensor(np.array(t.numpy()), place=place) for t in pair)
    si["infer_seed"], runner.infer_seed_increment = state.seed, state.increment = seed, increment


def build_init_25(original, ctx):
    registry: FeatureRunners = ctx.state
    runner_module = ctx.module(RUNNER)

    @wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not is_cuda_runner(runner_module):
            registry.stand_down(self, "not a CUDA platform (a DCU/Iluvatar runner): FastDeploy's seed stays",
                                logging.INFO)
            return
        if getattr(self, "speculative_decoding", False):
            registry.stand_down(self, "speculative decoding (the proposer's input batch shares the seed): the "
                                      "seed stays on the host", logging.INFO)
            return
        state = RunnerSyncs()
        try:
            _move_seed(self, state)
        except Exception as exc:  # never stop FastDeploy: this runner keeps its host seed
            registry.stand_down(self, f"cannot move the seed to the device ({type(exc).__name__}: {exc})")
            return
        why = own_path_reason(self, runner_module)
        if why:  # the seed only: FastDeploy's token_num waits stay
            state.token_off = f"{why}: FastDeploy's token_num waits stay"
            log.info("fd_async_copy step_syncs: %s", state.token_off)
        else:
            try:
                state.shadow = TokenShadow(self, ctx.backend, self.cache_config.block_size, state.served,
                                           state.fallbacks)
            except Exception as exc:  # never stop FastDeploy: its token_num waits stay
                state.shadow = None
                state.token_off = f"cannot set up the token-count shadow ({type(exc).__name__}: {exc})"
                log.error("fd_async_copy step_syncs: %s; FastDeploy's token_num waits stay", state.token_off)
        registry.add(self, state)

    return __init__


def build_prepare_inputs_25(original, ctx):
    registry: FeatureRunners = ctx.state
    tokens = build_prepare_inputs_tokens_25(original, ctx)

    @per_runner(original, "syncs")
    def _prepare_inputs(state, self, *args, **kwargs):
        if self.share_inputs["infer_seed"] is not state.seed or self.infer_seed_increment is not state.increment:
            try:  # FastDeploy made a new seed or increment (a path the plugin does not know): move again
                _move_seed(self, state)
                state.fallbacks["T: FastDeploy re-created the seed; moved to the device again"] += 1
            except Exception as exc:  # both back on the host: FastDeploy's own path for this runner
                _move_seed(self, state, paddle.CPUPlace())
                runner_state(self).syncs = None
                registry.stand_down(self, f"a re-created seed cannot move to the device ({type(exc).__name__}: {exc})")
                return original(self, *args, **kwargs)
        state.served["T device seed"] += 1
        return tokens(self, *args, **kwargs)

    return _prepare_inputs


# --- FastDeploy 2.5: the token-count waits (token_num_event) ------------------------------------
# 2.5's _prepare_inputs (gpu_model_runner.py:1330-1341) copies ``seq_lens_this_time`` and
# ``is_block_step`` into pinned ``seq_lens_this_time_cpu`` / ``is_block_step_cpu``, records
# ``token_num_event`` (``paddle.device.cuda.create_event()``), waits on it and sums the pinned count
# (plain schedule, a prefill, or no count from the last step); ``_postprocess`` (:2365-2371) waits on
# the same event again and, under the overlap schedule without a prefill, sums both pinned buffers.
# The host shadow answers both reads: the step's device changes come from a snapshot copied right
# after ``update_inputs_v1`` (before FastDeploy's post_process_event, which the save waits on), the
# inserts' host writes are followed as they are made, and recover_decode_task is replayed on it.

#: FD 2.5: shadow name -> InputBatch key
SHADOWED_25 = {
    "this_time": "seq_lens_this_time_buffer",
    "enc": "seq_lens_encoder",
    "block_step": "is_block_step",
    "step_dec": "step_seq_lens_decoder",
    "tables": "block_tables",
}
SNAPSHOT_25 = ("this_time", "enc", "block_step", "step_dec")  # what update_inputs_v1 changes
RECOVERED = ("this_time", "block_step", "enc")  # what recover_decode_task writes that the shadow keeps

_posting = threading.local()  # the runner whose _postprocess runs on this thread (for update_inputs_v1)
_SHADOWS_25: "weakref.WeakValueDictionary[int, TokenShadow]" = weakref.WeakValueDictionary()  # id(share_inputs)


def replay_recover(arrays: dict, num_running: int, block_size: int) -> bool:
    """recover_decode_task.cu (2.5) on host arrays, in place: a block-step slot whose next block
    exists resumes decoding. False (nothing changed) when a block column is outside the table."""
    this_time, block_step = arrays["this_time"].reshape(-1), arrays["block_step"].reshape(-1)
    step_dec, enc, tables = arrays["step_dec"].reshape(-1), arrays["enc"].reshape(-1), arrays["tables"]
    slots = np.flatnonzero(block_step[:num_running])
    cols = [int(step_dec[i]) // block_size for i in slots]
    if any(c < 0 or c >= tables.shape[1] for c in cols):
        return False
    for i, col in zip(slots, cols):
        if tables[i, col] != -1:
            block_step[i] = False
            this_time[i] = 1
            enc[i] = 0
    return True


class TokenShadow:
    """FD 2.5: the host's exact copy of the state behind the step's token count, for one runner."""

    def __init__(self, runner, backend, block_size: int, served, fallbacks) -> None:
        self.backend, self.glue = backend, backend.glue
        self.block_size = int(block_size)
        self.share_inputs = si = runner.share_inputs
        self.tensors = {name: si[key] for name, key in SHADOWED_25.items()}
        self.snap = {name: backend.new_pinned(self.glue.shape(t), self.glue.dtype(t), f"step_syncs.{name}")
                     for name, t in self.tensors.items()}
        self.arrays: dict[str, np.ndarray] = {}
        self._known: dict[str, bool] = {}
        self.served, self.fallbacks = served, fallbacks
        self.pending = None  # the event of the issued snapshot not taken yet
        self.log: list = []  # host writes and recover replays made since that snapshot was issued
        self.lost_while_pending: set[str] = set()
        self.nr: int | None = None  # running slots at this step's _prepare_inputs
        self.last_answers: dict[str, np.ndarray] = {}  # what was served (tests compare with the device)
        _SHADOWS_25[id(si)] = self
        self.load("construction")

    # -- state --------------------------------------------------------------------------------
    def known(self, name: str) -> bool:
        return self._known.get(name, False)

    def lose(self, name: str, why: str) -> None:
        if self._known.get(name):
            log.info("fd_async_copy step_syncs: lost track of %s (%s); FastDeploy's own wait until the next "
                     "snapshot or reload", name, why)
        self._known[name] = False
        if self.pending is not None:
            self.lost_while_pending.add(name)

    def lose_all(self, why: str) -> None:
        for name in SHADOWED_25:
            self.lose(name, why)

    def fallback(self, cause: str) -> None:
        self.fallbacks[cause] += 1

    def stale(self) -> str:
        """Why the shadowed tensors are no longer FastDeploy's ("" when they are)."""
        for name, key in SHADOWED_25.items():
            if self.share_inputs[key] is not self.tensors[name]:
                return f"share_inputs[{key!r}] was re-created"
        return ""

    def load(self, why: str) -> None:
        """Every shadow from the device (copies, one event, one wait): at construction and after a
        dummy run, a reset or a write the host could not follow - never in a plain decode step."""
        backend = self.backend
        for name, t in self.tensors.items():
            backend.copy_d2h(self.snap[name], t, f"step_syncs.load.{name}")
        backend.wait(backend.record("step_syncs.load"), f"step_syncs.load({why})")
        for name in self.tensors:
            self.arrays[name] = backend.read(self.snap[name], f"step_syncs.load.{name}")
            self._known[name] = True
        self.pending, self.log, self.lost_while_pending = None, [], set()
        self.fallbacks[f"shadow loaded ({why})"] += 1

    def ensure_loaded(self) -> None:
        # the block tables change on the host only (2.5, V1): once lost, only a load brings them back
        if not self.known("tables"):
            self.load("after a dummy run, a reset or an untracked write")

    # -- changes ------------------------------------------------------------------------------
    def host_write(self, name: str, key, value) -> None:
        if self.pending is not None and name in SNAPSHOT_25:
            self.log.append((name, key, np.array(value, copy=True)))
        else:
            self._apply(name, key, value)

    def _apply(self, name: str, key, value) -> None:
        if not self.known(name):
            return
        try:
            self.arrays[name][key] = value
        except Exception as exc:  # never fail FastDeploy's write: the shadow of it is lost instead
            self.lose(name, f"a write to {name} it cannot follow ({exc})")

    def recover(self, num_running: int) -> None:
        """recover_decode_task runs on the device now (the start of _prepare_inputs)."""
        self.nr = num_running
        if self.pending is not None:
            self.log.append(("recover", num_running, None))
        else:
            self._recover(num_running)

    def _recover(self, num_running: int) -> None:
        if not all(self.known(n) for n in SHADOWED_25) or not replay_recover(self.arrays, num_running,
                                                                              self.block_size):
            for name in RECOVERED:
                self.lose(name, "recover_decode_task cannot be replayed (a shadow unknown or a block column "
                                "outside the table)")

    def issue_snapshot(self) -> None:
        """Right after update_inputs_v1, before FastDeploy records post_process_event: its copies
        and their event in one batch."""
        self.pending = self.backend.copy_d2h_many(
            [(self.snap[name], self.tensors[name], f"step_syncs.{name}") for name in SNAPSHOT_25], "step_syncs.snapshot")
        self.log, self.lost_while_pending = [], set()

    def settle(self, reader: str) -> None:
        """Take the issued snapshot once a wait already made covers it (no wait here), then replay
        what happened since it was issued."""
        if self.pending is None or not self.backend.query(self.pending):
            return
        lost, entries = self.lost_while_pending, self.log
        self.pending, self.log, self.lost_while_pending = None, [], set()
        for name in SNAPSHOT_25:
            self.arrays[name] = self.backend.read(self.snap[name], f"{reader}.{name}")
            self._known[name] = name not in lost
        for name, key, value in entries:
            if name == "recover":
                self._recover(key)
            else:
                self._apply(name, key, value)

    # -- answers --------------------------------------------------------------------------------
    def answer(self, name: str, site: str, like) -> np.ndarray | None:
        """What FastDeploy's read of the pinned copy of ``name`` at ``site`` would give (after its
        event wait), or None (counted) when the host does not know it exactly now."""
        why = ("the last step's snapshot has not landed" if self.pending is not None
               else "" if self.known(name) and self.nr is not None else f"the shadow of {name} is not known")
        if why:
            self.fallback(f"token_num {site}: {why}")
            return None
        values = self.arrays[name].reshape(-1)
        if name == "this_time":
            values = values[:self.nr]
        out = values.reshape(tuple(self.glue.shape(like))).astype(np.dtype(self.glue.dtype(like)), copy=True)
        self.last_answers[f"{site}.{name}"] = out.copy()
        self.served[f"token_num {site}"] += 1
        return out


def token_num_off(runner, runner_module, postproc, shadow: TokenShadow) -> str:
    """Why the shadow may not answer for ``runner`` now ("" when it may)."""
    why = shadow_not_exact(runner, runner_module, postproc) or shadow.stale()
    if why:
        return why
    if getattr(runner.share_inputs, "enable_pd_reorder", False) or any(
            getattr(b, "enable_ids_reorder", False) for b in (getattr(runner, "attn_backends", None) or ())):
        return "PD reorder (swap_states moves slots, and the pinned buffers, on the device)"
    return ""


class _ViewWrite(Watched):
    """``share_inputs["seq_lens_this_time"]`` (a view of the buffer, rebound by every insert): a write
    through it (2.5 :834, speculative decoding only) is not followed - the shadow of it is lost."""

    def __init__(self, shadow: "TokenShadow", tensor) -> None:
        super().__init__(tensor)
        self.shadow = shadow

    def setitem(self, original, key, value):
        self.shadow.lose("this_time", "a write through the seq_lens_this_time view")
        return NotImplemented


def _watched_25(shadow: TokenShadow) -> list:
    out = [_Mirror(shadow, name, t) for name, t in shadow.tensors.items()]
    try:  # (none before the first insert)
        view = shadow.share_inputs["seq_lens_this_time"]
    except (KeyError, AttributeError):
        view = None
    if view is not None and view is not shadow.tensors["this_time"]:
        out.append(_ViewWrite(shadow, view))
    return out


def build_prepare_inputs_tokens_25(original, ctx):
    runner_module, postproc = ctx.module(RUNNER), ctx.module(POSTPROC)

    @per_runner(original, "syncs")
    def _prepare_inputs(state, self, *args, **kwargs):
        shadow = state.shadow
        if shadow is None:
            return original(self, *args, **kwargs)
        if state.unwaited:  # before FastDeploy issues this step's copies into the same pinned buffers
            order_after_skipped_waits(state, shadow)
        dummy = bool(kwargs.get("is_dummy_or_profile_run", args[1] if len(args) > 1 else False))
        why = "dummy/profile run" if dummy else token_num_off(self, runner_module, postproc, shadow)
        if why:  # FastDeploy's own waits; the step state is unknown until reloaded
            shadow.fallback(f"token_num: {why}")
            shadow.lose_all(why)
            return original(self, *args, **kwargs)
        shadow.ensure_loaded()
        shadow.settle("_prepare_inputs")
        si = self.share_inputs
        shadow.recover(int(si["seq_lens_this_time"].shape[0]))
        made: list[DeferredEvent] = []

        def make(event):
            made.append(DeferredEvent(event))
            return made[-1]

        pinned = si["seq_lens_this_time_cpu"]
        read = ServedRead(pinned, _Owed(made), lambda: shadow.answer("this_time", "_prepare_inputs", si["seq_lens_this_time"]))
        with deferred_events(make), watching([read], runner=self):
            result = original(self, *args, **kwargs)
        for event in made:
            if event.close():
                shadow.served["token_num _prepare_inputs: wait not needed (no read)"] += 1
        state.unwaited = made  # _postprocess may still wait on them; the next step looks
        return result

    return _prepare_inputs


def order_after_skipped_waits(state: RunnerSyncs, shadow: TokenShadow) -> None:
    """FastDeploy waits on every step's ``token_num_event``; that wait also ordered its copies into
    the pinned ``seq_lens_this_time_cpu``/``is_block_step_cpu`` before the next step's copies into
    the same buffers. Where the plugin skipped it, the stream this step runs on waits for that
    event on the device (``cudaStreamWaitEvent``, no host wait): with the current stream changed
    between steps, the older copy could otherwise land after the newer one and FastDeploy would
    size a step from a stale count (issue 41). On one stream it is a no-op in effect."""
    events, state.unwaited = state.unwaited, []
    for event in events:
        if event.waited:
            continue
        try:
            stream = paddle.device.current_stream()
            getattr(stream, "stream_base", stream).wait_event(getattr(event.event, "event_base", event.event))
            shadow.served["token_num: ordered after the last step's skipped wait (on the device)"] += 1
        except Exception as exc:  # no device-side order here: FastDeploy's own host wait, counted
            shadow.fallback(f"token_num: no stream order ({type(exc).__name__}); FastDeploy's wait")
            event.event.synchronize()


class _Owed:
    """The deferred event(s) made in a _prepare_inputs call, for its read's handler."""

    def __init__(self, events: list) -> None:
        self.events = events

    def settle(self) -> None:
        for event in self.events:
            event.settle()

    def answered(self) -> None:
        for event in self.events:
            event.answered()


def build_postprocess_25(original, ctx):
    @per_runner(original, "syncs")
    def _postprocess(state, self, model_output, p_done_idxs, token_num_event, *args, **kwargs):
        shadow = state.shadow
        if shadow is None or not isinstance(token_num_event, DeferredEvent):
            return original(self, model_output, p_done_idxs, token_num_event, *args, **kwargs)
        shadow.settle("_postprocess")
        si = self.share_inputs
        reads = [
            ServedRead(si["seq_lens_this_time_cpu"], token_num_event,
                       lambda: shadow.answer("this_time", "_postprocess", si["seq_lens_this_time"])),
            ServedRead(si["is_block_step_cpu"], token_num_event,
                       lambda: shadow.answer("block_step", "_postprocess", si["is_block_step"])),
        ]
        previous = getattr(_posting, "runner", None)
        _posting.runner = self
        token_num_event.open()
        try:
            with watching(reads, runner=self):
                return original(self, model_output, p_done_idxs, token_num_event, *args, **kwargs)
        finally:
            _posting.runner = previous
            if token_num_event.close():
                shadow.served["token_num _postprocess: wait not needed (no read)"] += 1

    return _postprocess


def build_save_model_output_25(original, ctx):
    @per_runner(original, "syncs")
    def _save_model_output(state, self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if state.shadow is not None:  # FastDeploy waited on post_process_event: the snapshot is in
            state.shadow.settle("_save_model_output")
        return result

    return _save_model_output


def build_insert_25(original, ctx):
    @per_runner(original, "syncs")
    def insert_tasks_v1(state, self, *args, **kwargs):
        shadow = state.shadow
        if shadow is None or shadow.stale():
            return original(self, *args, **kwargs)
        shadow.settle("insert_tasks_v1")
        with watching(_watched_25(shadow), runner=self):
            return original(self, *args, **kwargs)

    return insert_tasks_v1


def build_update_inputs_v1_25(original, ctx):
    @wraps(original)
    def update_inputs_v1(*args, **kwargs):
        result = original(*args, **kwargs)
        runner = getattr(_posting, "runner", None)
        syncs = part(runner, "syncs") if runner is not None else None
        if syncs is not None and syncs.shadow is not None and not syncs.shadow.stale():
            syncs.shadow.issue_snapshot()
        return result

    return update_inputs_v1


def build_input_batch_lose(original, ctx):
    """``InputBatch.reset_share_inputs`` / ``swap_states``: the shadow of that batch is lost (reloaded
    before the next step)."""

    @wraps(original)
    def method(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        shadow = _SHADOWS_25.get(id(self))
        if shadow is not None and shadow.share_inputs is self:
            shadow.lose_all(f"InputBatch.{original.__name__}")
        return result

    return method


class StepSyncsFeature(RunnerFeature):
    name = "step_syncs"
    mirrors = ("FastDeploy #6765/#6668 (device sampling seed), #5440/#6170 (host token count), #5548 "
               "(bad_tokens_len), #6172 (exist_prefill flag), #6356 (block-step flag, async block tables)")
    profiles = {
        "fastdeploy-2.4": "apply",
        "fastdeploy-2.5": "apply",
        "fastdeploy-2.6+": "native: FastDeploy develop removed T (#6668/#6765), S1, S2, S3/S7 and I1 (#6356)",
    }
    requires = ("stop_flag",)
    patches = (
        *(dataclasses.replace(p, profiles=FD24) for p in (
            Patch(Target(RUNNER, "GPUModelRunner._init_share_inputs"), build_init_share_inputs),
            Patch(Target(RUNNER, "GPUModelRunner.reset_share_inputs"), build_reset_share_inputs),
            Patch(Target(RUNNER, "GPUModelRunner.insert_tasks_v1"), build_insert),
            Patch(Target(RUNNER, "GPUModelRunner.insert_prefill_inputs"), build_insert),
            Patch(Target(RUNNER, "GPUModelRunner._dummy_prefill_inputs"), build_insert),
            Patch(Target(RUNNER, "GPUModelRunner._prepare_inputs"), build_prepare_inputs),
            Patch(Target(RUNNER, "GPUModelRunner.exist_prefill"), build_exist_prefill, step=True),
            Patch(Target(POSTPROC, "get_padding_offset"), build_get_padding_offset, check_get_padding_offset),
        )),
        Patch(Target(RUNNER, "GPUModelRunner.__init__"), build_init_25, profiles=FD25, step=True),
        Patch(Target(RUNNER, "GPUModelRunner._prepare_inputs"), build_prepare_inputs_25, profiles=FD25),
        *(dataclasses.replace(p, profiles=FD25) for p in (
            Patch(Target(RUNNER, "GPUModelRunner._postprocess"), build_postprocess_25),
            Patch(Target(RUNNER, "GPUModelRunner._save_model_output"), build_save_model_output_25),
            Patch(Target(RUNNER, "GPUModelRunner.insert_tasks_v1"), build_insert_25),
            Patch(Target(POSTPROC, "update_inputs_v1"), build_update_inputs_v1_25),
            Patch(Target(INPUT_BATCH, "InputBatch.reset_share_inputs"), build_input_batch_lose),
            Patch(Target(INPUT_BATCH, "InputBatch.swap_states"), build_input_batch_lose),
            CREATE_EVENT,
        )),
    )

    def mirrors_in(self, profile: str) -> str:
        if profile in FD25:
            return ("FastDeploy #6765 (the sampling seed on the device); 2.5's two token_num_event waits "
                    "answered from a host shadow (the block-table waits stay)")
        return self.mirrors

    def required(self, profile: str) -> tuple[str, ...]:
        # 2.4: the shadow's snapshot rides on stop_flag's event; 2.5 moves the seed only
        return self.requires if profile in FD24 else ()

    def prepare(self, ctx) -> FeatureRunners:
        return FeatureRunners(self.name, "syncs")


FEATURES = [StepSyncsFeature()]
