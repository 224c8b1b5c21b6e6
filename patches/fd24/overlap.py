"""Feature ``overlap`` (opt-in): FastDeploy 2.5's overlap schedule (#6259) backported to FastDeploy 2.4.

Why:    With ``step_syncs`` an FD 2.4 decode step has one host wait, the save event - but the host
        still waits for step N's save before it prepares step N+1, so the GPU idles while the host
        prepares, saves and inserts. #6259 hides that in 2.5 (about 10% end to end upstream); FD 2.4
        users can have it only by upgrading.
How:    ``execute_model`` keeps FastDeploy's own body; the plugin moves the save one step later:
        - the save ops FastDeploy calls inside ``post_process`` (``save_output``/``save_output_topk``)
          are captured, not run, during an overlap step (with the stop flag of that step copied into
          a pinned slot of its own under the step's event);
        - the next step runs them right after its forward is launched (FastDeploy's
          ``not_need_stop()`` check after the forward is the hook), so the save's host work hides
          under the next forward;
        - the next step's token count (``FD_ASYNC_COPY_OVERLAP_COUNT``): ``bound`` - FD 2.5's upper
          bound (the slots that ran) while the snapshot is in flight, the padded tail of
          ``get_padding_offset``'s outputs filled as 2.5's op does: no wait before the forward, but a
          padded GEMM can change the real rows' bits after a finish (docs/overlap-token-count.md);
          ``exact`` (default) - ``bound``'s prepare, then the step's one wait, a trim to the exact
          count and FD 2.4's padding rows in ``padding_cudagraph_inputs``, right before the forward:
          every forward on FD 2.4's rows; ``prepare`` - ``step_syncs`` waits at ``_prepare_inputs``,
          as ``exact`` does where a count may be read before the launch (chunked MoE, an unchecked
          attention backend) or the restore's Paddle calls fail their self-check;
        - ``not_need_stop()`` reports True while a step's output is still to be saved, so the worker
          loop flushes it when the batch drains; with nothing pending it is FastDeploy's flag (the
          loop sleeps when idle, no spinning). The flush step's forward runs on padding only and
          FastDeploy returns before sampling (its own idle-step return).
        - **The stop-flag race is closed by construction**: the worker loop's ``get_tasks`` (and
          every insert) first finishes the pending save (its event waited, which is the wait the insert's synchronous H2D makes anyway), so
          no older flag copy is in flight when the insert writes the flag; the engine also sees a
          step's output before any slot changes hands (preemption, reuse), as without overlap.
        Off per step (the pending save is finished first, FastDeploy's own step runs, counted by
        cause): guided decoding, prompt logprobs, Keep-Sampling-Mask, early stop, entropy,
        speculative decoding, pooling, the ZMQ output path (``FD_USE_GET_SAVE_OUTPUT_V1``), V0
        scheduler, expert parallelism, multimodal, a splitwise (prefill/decode) role, a non-CUDA
        platform. A runner without ``stop_flag`` and
        ``step_syncs`` keeps FastDeploy's path (``passthrough``); under tensor parallelism then every
        rank does (``ranks_agree``: overlap changes the loop's steps, so all ranks or none).
Mirrors: FastDeploy PR #6259 (overlap schedule), with #6668's seed fix (via ``step_syncs``).
FD:     2.4 only, opt-in (``FD_ASYNC_COPY_FEATURES=all,overlap``); ``native`` on 2.5+
        (``--enable-overlap-schedule``).
Delete: when FastDeploy 2.4 is no longer served.
"""

from __future__ import annotations

import collections
import threading

import paddle

from fd_async_copy_plugin.registry.patch import Junction, Patch, Target, wraps

from ..runner import FeatureRunners, RunnerFeature, is_cuda_runner, line, part, runner_state
from ..step_syncs import own_path_reason as step_syncs_own_path

RUNNER = "worker.gpu_model_runner"
POSTPROC = "model_executor.pre_and_post_process"

#: save op -> position of its ``not_need_stop`` argument (FastDeploy 2.4's signatures)
SAVE_OPS = {"save_output": 1, "save_output_topk": 4}

class OverlapState:
    """One runner's overlap schedule: the saves of the last step, still to run."""

    def __init__(self, runner_state, backend, count_mode: str = "exact", runner_module=None) -> None:
        # runner: runner.RunnerState (step_saved()); runner_module: FastDeploy's (``off_reason``);
        # count_mode "prepare" (and "exact" where launch_off says so): the next step is sized after the last
        # one's snapshot landed (step_syncs waits at _prepare_inputs); "bound": FD 2.5's padded upper bound
        self.backend, self.runner = backend, runner_state
        self.runner_module, self.count_mode = runner_module, count_mode
        # one pinned flag per step in flight: a slot is rewritten two steps later, after its save ran
        self.flags = [backend.new_pinned([1], "bool", f"overlap.not_need_stop[{i}]") for i in range(2)]
        self.flag_turn = 0
        # (save op, args, flag index, flag buffer) of the last overlap step / of the step running
        self.pending, self.captured = [], []
        #: in a step, after its forward's launch, prepared sized by the bound (``bound``, or ``exact``
        #: where it waits at the launch): set by ``begin_step``
        self.in_step = self.after_forward = self.by_bound = False
        self.fallbacks, self.served = collections.Counter(), collections.Counter()
        # decode steps by whether the last step's event was waited before this step's forward (``exact``,
        # ``prepare``), after it (``bound``), or had landed before (the first step, or an insert flushed it)
        self.count_waits, self.sized = collections.Counter(), "landed before"
        #: ``exact``: why this runner waits at ``_prepare_inputs`` instead (None: not checked yet);
        #: its steps trimmed to the exact count at the forward's launch, and those left as they were;
        #: ``kept``: this step's device copy of the ``ids_remove_padding`` rows the bound overwrites
        self.launch_off, self.launch, self.kept = None, collections.Counter(), None
        self.saving = threading.RLock()  # one flush at a time; the captured saves move under it
        self.detached = False  # disable() took the part off its runner

    def begin_step(self, runner) -> None:
        """``execute_model`` of an overlap step: whether this step is prepared sized by the bound."""
        self.in_step, self.after_forward, self.sized, self.kept = True, False, "landed before", None
        if self.count_mode == "exact" and self.launch_off is None:
            self.launch_off = launch_off_reason(runner, self.runner_module) or restore_check(runner, self.backend.glue)
        self.by_bound = self.count_mode == "bound" or (self.count_mode == "exact" and not self.launch_off)

    def keep_padding(self, runner, shadow, rows: int) -> None:
        """``exact``, before ``_prepare_inputs`` of a step sized by the bound B: a device copy
        (stream-ordered, no host wait) of the B rows of ``share_inputs["ids_remove_padding"]`` (1-D)
        that FastDeploy's copy of the packed ids (``gpu_model_runner.py:1604``) will overwrite, read
        past the buffer's shape. ``launch_wait`` puts rows M..B back once the count M is known and
        leaves that buffer and ``batch_id_per_token`` M rows long, as FD 2.4's copies do. Rows M..B
        of the batch ids are -1 in FD 2.4 too: it fills its last step's rows, B or more, with -1
        (:1606). A CUDA graph replayed at a size above M then reads FD 2.4's padding rows."""
        if self.count_mode == "exact" and shadow.count_is_bound:
            self.kept = paddle.as_strided(runner.share_inputs["ids_remove_padding"], [rows], [1]).clone()

    def launch_wait(self, runner, shadow) -> None:
        """``exact``, in ``padding_cudagraph_inputs`` (FastDeploy 2.4's last call before the model)
        of a step sized by the bound: wait for the last step's snapshot (the wait ``prepare`` makes
        at ``_prepare_inputs``), take the exact count M and trim the step's token-indexed inputs to
        their first M rows (views). Positions and values of the real rows come from the device's
        lengths, so the forward runs on FastDeploy 2.4's rows (docs/overlap-token-count.md)."""
        if not (self.in_step and self.count_mode == "exact" and shadow.count_is_bound):
            return
        shadow.refresh("overlap.launch wait")
        count = shadow.recover_and_count(int(runner.share_inputs["seq_lens_this_time"].shape[0]))
        if count is None and shadow.count_src is not None:  # FastDeploy's device count (a stream sync)
            self.launch["count read on the device"] += 1
            count = int(shadow.count_src.numpy().reshape(-1)[0])
        if count is None:
            self.launch["no count: left at the bound"] += 1
            return
        meta = runner.forward_meta
        rows = int(meta.ids_remove_padding.shape[0])
        if count < rows:
            for name in TOKEN_FIELDS:
                if getattr(meta, name, None) is not None:
                    setattr(meta, name, getattr(meta, name)[:count])
            meta.step_use_cudagraph = bool(meta.step_use_cudagraph) and count > 0
            if self.kept is not None:  # the buffers as FD 2.4 leaves them (keep_padding)
                si = runner.share_inputs
                paddle.as_strided(si["ids_remove_padding"], self.kept.shape, [1])[count:] = self.kept[count:]
                for name in ("ids_remove_padding", "batch_id_per_token"):
                    self.backend.glue.set_shape(si[name], [count, *si[name].shape[1:]])
                self.launch["padding restored"] += 1
        self.launch["steps trimmed" if count < rows else "steps at the bound"] += 1
        shadow.count_used, shadow.count_is_bound = count, False  # the device count must equal it

    def step_flag_copies(self, device_flag) -> list:
        """Right after the update op (``RunnerState.step_copies``): the copy of this step's flag
        (``device_flag``, the stop part's), for its save."""
        return [(self.flags[self.flag_turn], device_flag, "overlap.not_need_stop")] if self.in_step else []

    def holds_step(self) -> bool:
        """A step's save is still to run (captured in this step, or pending from the last)."""
        return bool(self.pending or self.in_step)

    def flag_check(self) -> bool:
        """``not_need_stop()``: right after the forward launch (FastDeploy 2.4 asks then) the last
        step's save runs, while the GPU computes this one. True while a step's output is still to
        be saved outside a step (the loop must call execute_model to flush it)."""
        if self.in_step and not self.after_forward:
            self.after_forward = True
            if self.pending:  # the last step's event: waited before this forward (the exact count) or not yet
                self.sized = "waited for the count" if self.backend.copy_waited(self.pending[-1][3]) else "not waited"
            self.flush("after forward")
            return False
        return bool(self.pending and not self.in_step)

    def capture(self, op, args: tuple, flag_index: int) -> None:
        """A save op's call; its ``not_need_stop`` is this step's pinned flag, read when it runs."""
        self.captured.append((op, list(args), flag_index, self.flags[self.flag_turn]))

    def report(self) -> dict:
        waited, free = self.count_waits["waited for the count"], self.count_waits["not waited"]
        return {"token_count": self.count_mode, "fallbacks": dict(self.fallbacks), "served": dict(self.served),
                "count_waits": dict(self.count_waits), "waited_fraction": waited / (waited + free) if waited + free else None,
                **({"launch": {"fallback": self.launch_off or "", **self.launch}} if self.count_mode == "exact" else {})}

    def detach(self) -> None:
        with self.saving:
            self.detached = True
        self.flush("disable")

    def flush(self, why: str) -> None:
        """Run the last step's saves now: wait on its event, then FastDeploy's save ops, in order.
        One flush at a time (``disable()`` may flush from another thread while a step ends)."""
        with self.saving:
            pending, self.pending = self.pending, []
            for op, args, flag_index, flag in pending:
                args[flag_index] = self.backend.to_host(flag, f"overlap.{why}")  # after the step's event
                op(*args)
            if pending:
                self.served[f"save one step later ({why})"] += 1
                self.runner.step_saved(f"overlap.{why}")  # the saved step's snapshot landed with its event

    def end_step(self) -> None:
        """The step's captured saves become pending; once the part was detached (``disable()`` on
        another thread mid-step) nobody would flush them: they run now."""
        with self.saving:
            if self.captured:
                self.pending, self.captured = self.pending + self.captured, []
                self.flag_turn ^= 1
                self.served["overlap steps"] += 1
                self.count_waits[self.sized] += 1  # (a flush step, below, is no decode step)
            else:  # the batch had drained: this step only saved the last one (FD returned before sampling)
                self.served["flush step (batch drained)"] += 1
            detached = self.detached
        if detached:
            self.flush("disabled during the step")


def off_reason(runner, runner_module) -> str:
    """Why this step runs FastDeploy 2.4's own schedule ("" when it can overlap). Where step_syncs
    cannot know the step (V0 scheduler, speculative decoding, EP), overlap cannot either."""
    if why := step_syncs_own_path(runner, runner_module):
        return why
    checks = (
        (not is_cuda_runner(runner_module), "non-CUDA platform"),
        (getattr(runner, "is_pooling_model", False), "pooling model"),
        (getattr(runner, "guided_backend", None) is not None, "guided decoding"),
        (bool(getattr(runner, "prompt_logprobs_reqs", None)), "prompt logprobs"),
        (getattr(runner, "enable_keep_sampling_mask", False), "keep-sampling-mask"),
        (getattr(runner, "enable_early_stop", False), "early stop"),
        (getattr(runner, "enable_entropy", False), "entropy"),
        (getattr(getattr(runner_module, "envs", None), "FD_USE_GET_SAVE_OUTPUT_V1", False), "ZMQ output path"),
        (getattr(getattr(runner, "model_config", None), "enable_mm", False), "multimodal"),
        # a splitwise decode node frees a preempted slot at schedule time: a late row of the old
        # owner could reach the new one (FD 2.5 keeps overlap off for split roles by default, #6668)
        (getattr(getattr(runner, "scheduler_config", None), "splitwise_role", "mixed") != "mixed",
         "splitwise (prefill/decode) role"))
    return next((why for bad, why in checks if bad), "")


#: the ``ForwardMeta`` fields indexed by packed token that ``exact`` trims (``position_ids``: the
#: replica's only)
TOKEN_FIELDS = ("ids_remove_padding", "batch_id_per_token", "position_ids")
#: attention backends whose metadata reads no host token count (FD 2.4 ``append_attn_backend.py``)
COUNT_FREE_ATTENTION = ("AppendAttentionBackend",)


def launch_off_reason(runner, runner_module) -> str:
    """Why ``exact`` waits at ``_prepare_inputs`` for this runner, as ``prepare`` does ("" when it
    can wait at the forward's launch): a count read on the host between the prepare and the
    launch, or no launch hook of the plugin's."""
    if getattr(getattr(runner, "parallel_config", None), "enable_chunked_moe", False):
        return "chunked MoE (its chunks are sized by the host token count in the prepare)"
    if others := sorted({type(b).__name__ for b in getattr(runner, "attn_backends", ())
                         if type(b).__name__ not in COUNT_FREE_ATTENTION and not getattr(b, "count_free_metadata", False)}):
        return f"attention backend {', '.join(others)} (its metadata is not checked count-free)"
    cls = getattr(runner_module, "GPUModelRunner", None)
    if cls is None or Junction.at(cls, "padding_cudagraph_inputs") is None or \
            getattr(type(runner), "padding_cudagraph_inputs", None) is not getattr(cls, "padding_cudagraph_inputs"):
        return "padding_cudagraph_inputs is not the plugin's (no hook at the forward's launch)"
    return ""


def restore_check(runner, glue) -> str:
    """Once per runner, on its buffers' place (the restore's Paddle calls are checked on CPU only): ""
    if ``glue.set_shape`` keeps the data and ``as_strided`` reads and writes past the shape, else why not."""
    try:
        glue.set_shape(t := paddle.to_tensor(list(range(6)), place=runner.share_inputs["ids_remove_padding"].place), [3])
        paddle.as_strided(t, [6], [1])[4:] = t[:2]
        seen = (list(t.shape), paddle.as_strided(t, [6], [1]).clone().numpy().tolist())
    except Exception as exc:  # noqa: BLE001 - a Paddle without these calls, or one refusing them here
        seen = f"{type(exc).__name__}: {exc}"
    return "" if seen == ([3], [0, 1, 2, 3, 0, 1]) else f"the padding rows' restore failed its self-check ({seen})"


# --- patches ---------------------------------------------------------------------------------------


ANOTHER_RANK = ("tensor parallel: another rank's runner keeps FastDeploy's path, so no rank overlaps (overlap "
                "changes the worker loop's steps: the ranks would part at a collective)")


def ranks_agree(runner, why: str) -> str:
    """Tensor parallel: overlap runs on every rank or on none. While a save is pending it answers
    ``not_need_stop()`` True where FastDeploy's flag may say False, so a rank with overlap runs a flush
    step (a forward, with its collectives) while a rank without waits at the idle barrier: a hang.
    Whether a rank can overlap depends on its own device (the stop flag's probe) and set-up, so the
    ranks agree once, at runner construction (every rank builds its runner there): one all-reduce
    (MIN) of 0/1 over the tp group (FD 2.4 ``config.py:629-640``, ``worker_process.py:1015``).
    Returns "" when every rank can, else why not."""
    pc = getattr(runner, "parallel_config", None)
    if int(getattr(pc, "tensor_parallel_size", 1) or 1) <= 1 or getattr(pc, "tp_group", None) is None:
        return why
    try:
        flag = paddle.to_tensor([0 if why else 1], dtype="int32", place=runner.share_inputs["stop_flags"].place)
        paddle.distributed.all_reduce(flag, op=paddle.distributed.ReduceOp.MIN, group=pc.tp_group)
    except Exception as exc:  # noqa: BLE001 - FastDeploy's own collectives would fail the same way
        return why or f"tensor parallel: the ranks could not agree ({type(exc).__name__}: {exc})"
    return why or ("" if int(flag.numpy().reshape(-1)[0]) else ANOTHER_RANK)  # (once per runner)


def set_up(ctx, runner) -> None:
    """After FastDeploy's ``_init_share_inputs`` and the stop and syncs parts: the overlap part, or
    why this runner keeps FastDeploy's schedule."""
    stop, syncs = part(runner, "stop"), part(runner, "syncs")
    missing = " and ".join(n for n, s in (("stop_flag", stop), ("step_syncs", syncs)) if s is None)
    if why := ranks_agree(runner, f"needs {missing} on this runner" if missing else ""):
        ctx.state.stand_down(runner, why)
        return
    ctx.state.add(runner, OverlapState(runner_state(runner), ctx.backend, ctx.settings.overlap_count, ctx.module(RUNNER)))


def build_get_tasks(original, ctx):
    """The worker loop takes the engine's next task batch: finish pending saves first, so the engine
    has a step's output before it sees the batch taken and schedules on (FD 2.4's order)."""
    registry: FeatureRunners = ctx.state

    @wraps(original)
    def get_tasks(self, *args, **kwargs):
        for state in registry.parts():
            state.flush("get_tasks")
        return original(self, *args, **kwargs)

    return get_tasks


class OverlapFeature(RunnerFeature):
    name = "overlap"
    mirrors = "FastDeploy PR #6259 (overlap schedule), on top of step_syncs (#6668/#6765)"
    profiles = {"fastdeploy-2.4": "apply",
                "fastdeploy-2.5": "native: FastDeploy 2.5 has the overlap schedule (--enable-overlap-schedule)",
                "fastdeploy-2.6+": "native: FastDeploy develop has the overlap schedule (on by default)"}
    requires = ("logprobs", "stop_flag", "step_syncs")
    patches = (
        # (``_init_share_inputs`` is a step section through stop_flag's part of it anyway)
        *(Patch(Target(RUNNER, f"GPUModelRunner.{name}"), line(name), step=True) for name in (
            "_init_share_inputs", "execute_model", "not_need_stop", "insert_tasks_v1", "insert_prefill_inputs",
            "reset_share_inputs", "_dummy_run")),
        *(Patch(Target(POSTPROC, name), line(name), producer=True) for name in SAVE_OPS),
        # ``exact``'s wait at the forward's launch (without it, ``exact`` waits as ``prepare``)
        Patch(Target(RUNNER, "GPUModelRunner.padding_cudagraph_inputs", required=False),
              line("padding_cudagraph_inputs")),
        # loaded by the worker before the runner; absent from the replica (then the insert's flush)
        Patch(Target("inter_communicator.engine_worker_queue", "EngineWorkerQueue.get_tasks", required=False),
              build_get_tasks))

    def prepare(self, ctx) -> FeatureRunners:
        return FeatureRunners("overlap", "overlap")

    def quiesce(self, ctx) -> None:
        for state in ctx.state.parts() if isinstance(ctx.state, FeatureRunners) else ():
            state.flush("disable")


FEATURES = [OverlapFeature()]
