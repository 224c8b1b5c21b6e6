"""FD 2.4's part of ``step_syncs`` (why: ``patches/step_syncs.py``): ``StepShadow`` and its parts of
the runner's methods (called from ``methods.py``)."""

from __future__ import annotations

import collections
import contextlib
import logging

import numpy as np
import paddle

from ..runner import part, runner_state
from ..step_syncs import (POSTPROC, RUNNER, SNAPSHOT, RunnerSyncs, Shadow, _Mirror, _device_copy,
                          replay_recover, shadow_not_exact)
from .. import step_syncs as feature  # own_path_reason looked up there (a probe may plant it)
from .._tensor_watch import basic_key, watching

log = logging.getLogger("fd_async_copy")

#: shadow name -> share_inputs key (None: the runner's ``seq_lens_this_time_buffer``)
SHADOWED = {"this_time": None, "enc": "seq_lens_encoder", "block_step": "is_block_step",
            "step_dec": "step_seq_lens_decoder", "bad_len": "bad_tokens_len", "tables": "block_tables"}
SNAPSHOT_LABELS = tuple((name, f"step_syncs.{name}") for name in SNAPSHOT)


class _BlockStepRead(_Mirror):
    """I1: ``if share_inputs["is_block_step"][idx]:`` in an insert, answered from the shadow when it
    is known (an if-test: the host value is all it needs, no framework tensor is built)."""

    def getitem(self, key):
        shadow = self.shadow
        if shadow._known["block_step"] and (type(key) is int or basic_key(key)):
            shadow.served["I1 is_block_step read"] += 1
            return np.array(shadow.arrays["block_step"][key])
        shadow.fallback("I1: shadow of is_block_step not known")
        return NotImplemented


class _BadTokensRead(_Mirror):
    """S2: ``_prepare_inputs``' one ``np.max(share_inputs["bad_tokens_len"].numpy())``, answered
    from the shadow when it is known; the view goes after it. Where S1 serves the count, the view
    comes after ``get_padding_offset`` (``padding_offset``), which FastDeploy calls before the read:
    the call's item accesses before it go to FastDeploy's dict."""

    once = True

    def numpy(self):
        if self.shadow._known["bad_len"]:
            self.shadow.served["S2 bad_tokens_len"] += 1
            return self.shadow.arrays["bad_len"].copy()
        self.shadow.fallback("S2: shadow of bad_tokens_len not known")
        return NotImplemented


class _StagedTable(_Mirror):
    """``block_tables``: the watched call gets the pinned mirror itself (a numpy array over it) in
    place of the tensor, so FastDeploy's writes - ``X[basic key] = host value``, the only use the
    real-FD check (a) allows there - land in it as they are made; the rows that changed are copied
    to the device asynchronously when the call returns (``StepShadow.flush``). While the table is
    not known, the call gets the tensor (FastDeploy's own writes)."""

    def hand_out(self, scope):
        shadow = self.shadow
        if not shadow.known("tables"):
            return None
        backend = shadow.backend
        if backend.h2d_in_flight(shadow.tables):
            # rows staged at an insert before a step that never reached the update op (an idle
            # step: no event covers their copy): wait for that copy before rewriting the mirror
            shadow.fallback("I1: the last staged rows had no step event; their copy was waited for")
            backend.wait(backend.record("step_syncs.block_tables"), "insert.block_tables")
        backend.before_host_write(shadow.tables, "insert.block_tables")
        return shadow.arrays["tables"]

    def unseen(self) -> None:
        if self.shadow.known("tables"):  # (else the call had the tensor: FastDeploy's own writes)
            self.shadow.fallback("a write to tables past the watch (an earlier reference or another thread)")
        self.shadow.flush()
        self.shadow.lose("tables", "a block-table write made past the watch")


class StepShadow(Shadow):
    """FD 2.4: the host's exact copy of the step state it needs, for one runner."""

    host_written = ("tables", "bad_len")
    lost_until = "reloaded"

    def __init__(self, runner, backend, block_size: int, runner_module=None, postproc=None) -> None:
        tensors = {name: runner.seq_lens_this_time_buffer if key is None else runner.share_inputs[key]
                   for name, key in SHADOWED.items()}
        super().__init__(runner, backend, block_size, tensors, collections.Counter(), collections.Counter(),
                         (runner_module, postproc))
        #: S2: ``bad_tokens_len.numpy()`` inside ``_prepare_inputs``, answered from the shadow
        self.prepare_watch = [_BadTokensRead(self, "bad_len", self.tensors["bad_len"])]
        self.s1_off = ""  # why S1 stood down for good (a count mismatch), "" while it runs
        #: ``shadow_not_exact`` as this step's ``_prepare_inputs`` (or the last insert) found it:
        #: ``exist_prefill()`` in the same step asks it, twice a step, without asking again
        self.not_exact = ""
        self.tables = self.snap["tables"]  # the pinned mirror FastDeploy's block-table writes go to
        #: what an insert's watch hands out: the block-step read, the mirror, the other writes
        self.insert_watch = [(_BlockStepRead if name == "block_step" else _StagedTable if name == "tables"
                              else _Mirror)(self, name, t) for name, t in self.tensors.items()]
        # this step's device token count (get_padding_offset's input) and the count used, whether that
        # is an upper bound (overlap), not exact; the count's pinned copy, made at the first armed step
        self.count_src = self.count_used = self.snap_count = None
        self.count_is_bound = self.snap_pending = False
        self.snap_expect: tuple[int, bool] | None = None  # (count used, it was an upper bound)
        self.snap_nr = 0  # the running slots when the snapshot was issued
        self.load("construction")

    def load(self, why: str) -> None:
        """Every shadow from the device: at construction and after a reset or a dummy run."""
        from fd_async_copy_plugin.runtime.backend import host_view

        self.backend.before_host_write(self.tables, "step_syncs.load")
        super().load(why)
        self.arrays["tables"] = host_view(self.tables, self.glue)  # written in place, copied from
        self.on_device, self.snap_pending = self.arrays["tables"].copy(), False

    # -- the step's device changes --------------------------------------------------------------
    def snapshot_copies(self) -> list:
        """Right after the update op: the snapshot's copies, issued in the stop flag's batch before
        its event is recorded (``RunnerState.step_copies``)."""
        copies = [(self.snap[name], self.tensors[name], label) for name, label in SNAPSHOT_LABELS]
        self.snap_expect = None
        if self.count_src is not None and self.count_used is not None:
            if self.snap_count is None:
                self.snap_count = self.backend.new_pinned(
                    self.glue.shape(self.count_src), self.glue.dtype(self.count_src), "step_syncs.token_num", True)
            copies.append((self.snap_count, self.count_src, "step_syncs.token_num"))
            self.snap_expect = (self.count_used, self.count_is_bound)
        self.count_src, self.count_used, self.count_is_bound = None, None, False
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
            if (device_count > used if bound else device_count != used) and not self.s1_off:
                what = "upper bound" if bound else "token count"
                self.s1_off = (f"the host {what} {used} did not hold for the device's count {device_count}; "
                               "S1 uses FastDeploy's synchronous count from now on")
                log.error("fd_async_copy step_syncs: %s", self.s1_off)
        self.snap_expect = None

    def flush(self) -> None:
        """Copy the block-table rows the host changed (the mirror against ``on_device``, what the
        device holds) to the device, on the stream: one copy from the first to the last."""
        mirror, on_device = self.arrays["tables"], self.on_device
        changed = (mirror != on_device).reshape(len(mirror), -1).any(axis=1).nonzero()[0]
        if not len(changed):
            return
        first, last = int(changed[0]), int(changed[-1]) + 1
        on_device[first:last] = mirror[first:last]
        self.served["I1 block-table rows staged"] += len(changed)
        table, row_bytes = self.tensors["tables"], mirror.strides[0]
        self.backend.copy_h2d(self.glue.address(table) + first * row_bytes, self.glue.gpu_device(table),
                              self.tables, first * row_bytes, (last - first) * row_bytes, "step_syncs.block_tables")

    # -- answers --------------------------------------------------------------------------------
    def recover_and_count(self, num_running: int) -> int | None:
        """Replay ``recover_decode_task`` on the shadow and return the step's token count, or None
        when the host cannot know it."""
        if not self.known("this_time", "block_step", "step_dec", "tables", "enc") or not replay_recover(
                self.arrays, num_running, self.block_size):
            return None
        return int(self.arrays["this_time"].reshape(-1)[:num_running].astype(np.int64).sum())

    def upper_bound(self, num_running: int) -> int | None:
        """Overlap, no insert since the last step: the snapshot of that step is still in flight.
        Its update op leaves every running slot at 0 or 1 token and recovers nothing without a new
        block (no insert gave one), so the slots that ran bound the next step's count."""
        if not (self.known("this_time") and self.snap_nr == num_running):
            return None
        return int((self.arrays["this_time"].reshape(-1)[:num_running] > 0).sum())


def set_up(ctx, runner) -> None:
    """After FastDeploy's ``_init_share_inputs`` and the stop part: the seed on the device and the
    shadow, or why this runner keeps FastDeploy's own path."""
    registry = ctx.state
    # first the runner's own reason, not stop_flag's: the shadow could never be exact for this runner (touch nothing)
    if why := feature.own_path_reason(runner, ctx.module(RUNNER)):
        registry.stand_down(runner, f"{why}: the host cannot know this runner's step state", logging.INFO)
        return
    if part(runner, "stop") is None:
        registry.stand_down(runner, "needs stop_flag on this runner (its event covers the step snapshot), "
                                    "which does not run here")
        return
    si = runner.share_inputs
    try:
        si["infer_seed"] = _device_copy(si["infer_seed"], si["stop_flags"])  # T
        state = RunnerSyncs(StepShadow(runner, ctx.backend, runner.cache_config.block_size, ctx.module(RUNNER),
                                       ctx.module(POSTPROC)))
    except Exception as exc:  # never stop FastDeploy: this runner keeps its own path
        registry.stand_down(runner, f"cannot set up ({type(exc).__name__}: {exc})")
        return
    registry.add(runner, state)


@contextlib.contextmanager
def inserting(shadow: StepShadow, runner, site: str):
    """Around FastDeploy's insert ``site``: the shadow refreshed, FastDeploy's host writes to the
    shadowed tensors followed (block-table rows staged), the staged rows copied after it."""
    why = shadow.not_exact = shadow_not_exact(runner, *shadow.modules)
    if why:
        shadow.fallback(why)
        shadow.lose_all(why)
        yield
        return
    if site != "_dummy_prefill_inputs":
        shadow.ensure_loaded()
    shadow.refresh(site)
    with watching(shadow.insert_watch, runner=runner):
        try:
            yield
        finally:
            shadow.flush()


def step_count(syncs: RunnerSyncs, runner, dummy: bool) -> int | None:
    """Before FastDeploy's ``_prepare_inputs``: the seed increment on the device (T), the shadow
    refreshed, and the step's token count the host knows (S1), or None."""
    shadow = syncs.shadow
    si, increment = runner.share_inputs, runner.infer_seed_increment
    # T: the increment FastDeploy made with .cpu() in __init__ (after _init_share_inputs).
    if increment is not syncs.increment:
        runner.infer_seed_increment = syncs.increment = _device_copy(increment, si["stop_flags"])
    if not dummy:
        shadow.ensure_loaded()
        shadow.not_exact = shadow_not_exact(runner, *shadow.modules)
    steps = runner_state(runner)
    bound = not dummy and steps.bound_count_step() and shadow.snapshot_in_flight()
    if not bound:  # free unless the overlap schedule's exact count waits here for the last step
        shadow.refresh("overlap.exact count" if steps.holds_unsaved_step() else "_prepare_inputs")
    why = "dummy/profile run" if dummy else shadow.not_exact or shadow.s1_off and "S1 stood down"
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
    shadow.prepare_watch[0].later = count is not None  # S2's view from padding_offset on
    return count


def exist_prefill(shadow: StepShadow, runner) -> bool | None:
    """S3/S7: ``exist_prefill()`` from the shadow, or None (FastDeploy's own then)."""
    if why := shadow.not_exact:
        shadow.fallback(f"S3/S7: {why}")
        return None
    if shadow.snap_pending and not (runner_state(runner).holds_unsaved_step() and shadow.snapshot_in_flight()):
        shadow.refresh("exist_prefill")
    if not shadow.known("enc"):
        shadow.fallback("S3/S7: shadow of seq_lens_encoder not known")
        return None
    # right after a step whose snapshot has not landed (overlap): its update op zeroed
    # seq_lens_encoder of every running slot (update_inputs_v1.cu), the others are as known
    first = shadow.snap_nr if shadow.snapshot_in_flight() else 0
    shadow.served["S3/S7 exist_prefill"] += 1
    return bool((shadow.arrays["enc"].reshape(-1)[first:] > 0).any())


def padding_offset(fd, shadow: StepShadow, count: int, input_ids, token_num, args, kwargs):
    """S1: the 2.4 op copies token_num to the host to size its outputs; a host tensor makes that a
    host-to-host memcpy. The device count is copied under the step's event and compared."""
    glue = shadow.glue  # (``from_numpy``: ``paddle.to_tensor(array, place=CPUPlace())`` without its argument handling)
    host = glue.from_numpy(np.array(count).reshape(tuple(token_num.shape)).astype(glue.dtype(token_num)))
    shadow.count_src, shadow.count_used = token_num, count
    shadow.served["S1 token count"] += 1
    outputs = fd(input_ids, host, *args, **kwargs)
    s2 = shadow.prepare_watch[0]
    if s2.later and s2.scope is not None:  # S2's view, once (FastDeploy's read comes after this op)
        s2.later = False
        s2.scope.install()
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
