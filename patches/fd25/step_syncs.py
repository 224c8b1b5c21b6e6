"""FD 2.5's part of ``step_syncs`` (why: ``patches/step_syncs.py``): the seed on the device and
``TokenShadow``, with their parts of the runner's methods (called from ``methods.py``)."""

from __future__ import annotations

import ast
import inspect
import logging
import weakref

import numpy as np
import paddle

from fd_async_copy_plugin.fd_identity import function_node

from ..runner import is_cuda_runner, runner_state
from ..step_syncs import (POSTPROC, RUNNER, SNAPSHOT, RunnerSyncs, Shadow, _Mirror, _device_copy,
                          replay_recover, shadow_not_exact)
from .. import step_syncs as feature  # own_path_reason looked up there (a probe may plant it)
from .._tensor_watch import DeferredEvent, ServedRead, Watched, watching
from ..step import opened

log = logging.getLogger("fd_async_copy")


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
    seed, increment = (_device_copy(t, si["stop_flags"]) if place is None else
                       paddle.to_tensor(np.array(t.numpy()), place=place) for t in pair)
    si["infer_seed"], runner.infer_seed_increment = state.seed, state.increment = seed, increment


def set_up(ctx, runner) -> None:
    """After FastDeploy's ``GPUModelRunner.__init__``: the seed and its increment on the device, and
    the token-count shadow, or why this runner keeps FastDeploy's own path."""
    registry, runner_module = ctx.state, ctx.module(RUNNER)
    if not is_cuda_runner(runner_module):
        registry.stand_down(runner, "not a CUDA platform (a DCU/Iluvatar runner): FastDeploy's seed stays",
                            logging.INFO)
        return
    if getattr(runner, "speculative_decoding", False):
        registry.stand_down(runner, "speculative decoding (the proposer's input batch shares the seed): the "
                                    "seed stays on the host", logging.INFO)
        return
    state = RunnerSyncs(registry=registry)
    try:
        _move_seed(runner, state)
    except Exception as exc:  # never stop FastDeploy: this runner keeps its host seed
        registry.stand_down(runner, f"cannot move the seed to the device ({type(exc).__name__}: {exc})")
        return
    if why := feature.own_path_reason(runner, runner_module):  # the seed only: FD's token_num waits stay
        state.token_off = f"{why}: FastDeploy's token_num waits stay"
        log.info("fd_async_copy step_syncs: %s", state.token_off)
    else:
        try:
            state.shadow = TokenShadow(runner, ctx.backend, runner.cache_config.block_size, state.served,
                                       state.fallbacks, runner_module, ctx.module(POSTPROC))
        except Exception as exc:  # never stop FastDeploy: its token_num waits stay (state.shadow: None)
            state.token_off = f"cannot set up the token-count shadow ({type(exc).__name__}: {exc})"
            log.error("fd_async_copy step_syncs: %s; FastDeploy's token_num waits stay", state.token_off)
    registry.add(runner, state)


def seed_in_place(syncs: RunnerSyncs, runner) -> bool:
    """Before FastDeploy's ``_prepare_inputs`` (T): the sampler still gets the device seed. A seed
    or increment FastDeploy made anew (a path the plugin does not know) is moved again; if it cannot
    move, both go back to the host and the runner keeps FastDeploy's path (False)."""
    if runner.share_inputs["infer_seed"] is not syncs.seed or runner.infer_seed_increment is not syncs.increment:
        try:
            _move_seed(runner, syncs)
            syncs.fallbacks["T: FastDeploy re-created the seed; moved to the device again"] += 1
        except Exception as exc:  # both back on the host: FastDeploy's own path for this runner
            _move_seed(runner, syncs, paddle.CPUPlace())
            runner_state(runner).syncs = None
            syncs.registry.stand_down(runner, f"a re-created seed cannot move to the device "
                                              f"({type(exc).__name__}: {exc})")
            return False
    syncs.served["T device seed"] += 1
    return True


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
SHADOWED_25 = {"this_time": "seq_lens_this_time_buffer", "enc": "seq_lens_encoder",
               "block_step": "is_block_step", "step_dec": "step_seq_lens_decoder", "tables": "block_tables"}
RECOVERED = ("this_time", "block_step", "enc")  # what recover_decode_task writes that the shadow keeps

_SHADOWS_25: "weakref.WeakValueDictionary[int, TokenShadow]" = weakref.WeakValueDictionary()  # id(share_inputs)


class TokenShadow(Shadow):
    """FD 2.5: the host's exact copy of the state behind the step's token count, for one runner."""

    def __init__(self, runner, backend, block_size: int, served, fallbacks, runner_module=None,
                 postproc=None) -> None:
        si = runner.share_inputs
        super().__init__(runner, backend, block_size, {name: si[key] for name, key in SHADOWED_25.items()},
                         served, fallbacks, (runner_module, postproc))
        self.nr: int | None = None  # running slots at this step's _prepare_inputs
        self.last_answers: dict[str, np.ndarray] = {}  # what was served (tests compare with the device)
        #: FastDeploy's ``_postprocess`` reads the pinned counts only under its overlap schedule
        self.reads_need_overlap = reads_only_with_overlap(type(runner)._postprocess)
        _SHADOWS_25[id(si)] = self
        self.load("construction")

    # -- state --------------------------------------------------------------------------------
    def stale(self) -> str:
        """Why the shadowed tensors are no longer FastDeploy's ("" when they are)."""
        return next((f"share_inputs[{key!r}] was re-created" for name, key in SHADOWED_25.items()
                     if self.share_inputs[key] is not self.tensors[name]), "")

    # -- changes ------------------------------------------------------------------------------
    def recover(self, num_running: int) -> None:
        """recover_decode_task runs on the device now (the start of _prepare_inputs)."""
        self.nr = num_running
        if self.pending is not None:
            self.log.append(("recover", num_running, None))
        else:
            self._recover(num_running)

    def _recover(self, num_running: int) -> None:
        if not all(self._known.values()) or not replay_recover(self.arrays, num_running, self.block_size):
            for name in RECOVERED:
                self.lose(name, "recover_decode_task cannot be replayed (a shadow unknown or a block column "
                                "outside the table)")

    def issue_snapshot(self) -> None:
        """Right after update_inputs_v1, before FastDeploy records post_process_event: its copies
        and their event in one batch."""
        self.pending = self.backend.copy_d2h_many(
            [(self.snap[name], self.tensors[name], f"step_syncs.{name}") for name in SNAPSHOT], "step_syncs.snapshot")
        self.log, self.lost_while_pending = [], set()

    def settle(self, reader: str) -> None:
        """Take the issued snapshot once a wait already made covers it (no wait here), then replay
        what happened since it was issued."""
        if self.pending is None or not self.backend.query(self.pending):
            return
        lost, entries = self.lost_while_pending, self.log
        self.pending, self.log, self.lost_while_pending = None, [], set()
        for name in SNAPSHOT:
            self.arrays[name] = self.backend.read(self.snap[name], f"{reader}.{name}")
            self._known[name] = name not in lost
        for name, key, value in entries:
            if name == "recover":
                self._recover(key)
            else:
                self.host_write(name, key, value)

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


def token_num_off(runner, shadow: TokenShadow) -> str:
    """Why the shadow may not answer for ``runner`` now ("" when it may)."""
    if why := shadow_not_exact(runner, *shadow.modules) or shadow.stale():
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

    def setitem(self, key, value):
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


def prepare_counted(fd, syncs: RunnerSyncs, runner, args, kwargs):
    """FastDeploy's ``_prepare_inputs`` with its token_num_event deferred and its read of the pinned
    count answered from the shadow (the event's wait runs only before a read it does not answer)."""
    shadow = syncs.shadow
    if syncs.unwaited:  # before FastDeploy issues this step's copies into the same pinned buffers
        order_after_skipped_waits(syncs, shadow)
    dummy = bool(kwargs.get("is_dummy_or_profile_run", args[1] if len(args) > 1 else False))
    why = "dummy/profile run" if dummy else token_num_off(runner, shadow)
    if why:  # FastDeploy's own waits; the step state is unknown until reloaded
        shadow.fallback(f"token_num: {why}")
        shadow.lose_all(why)
        return fd(runner, *args, **kwargs)
    shadow.ensure_loaded()
    shadow.settle("_prepare_inputs")
    si = runner.share_inputs
    shadow.recover(int(si["seq_lens_this_time"].shape[0]))
    made: list[DeferredEvent] = []

    def make(event):
        made.append(DeferredEvent(event))
        return made[-1]

    pinned = si["seq_lens_this_time_cpu"]
    read = ServedRead(pinned, made, lambda: shadow.answer("this_time", "_prepare_inputs", si["seq_lens_this_time"]))
    with opened(runner, make_event=make), watching([read], runner=runner):
        result = fd(runner, *args, **kwargs)
    for event in made:
        if event.close():
            shadow.served["token_num _prepare_inputs: wait not needed (no read)"] += 1
    syncs.unwaited = made  # _postprocess may still wait on them; the next step looks
    return result


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


PINNED_COUNTS = ("seq_lens_this_time_cpu", "is_block_step_cpu")
_NO_OVERLAP = ast.dump(ast.parse("not self.enable_overlap_schedule", mode="eval").body)


def reads_only_with_overlap(method) -> bool:
    """FastDeploy's ``_postprocess`` (``method``) names the pinned counts only in the ``else`` of
    ``if (not self.enable_overlap_schedule) or ...:`` (2.5 :2366-2372): with the overlap schedule off
    the call reads neither. False where its source says otherwise or cannot be read."""
    try:
        tree = function_node(inspect.unwrap(method))
    except (OSError, TypeError, SyntaxError):
        return False

    def named(nodes) -> int:
        return sum(isinstance(n, ast.Constant) and n.value in PINNED_COUNTS or isinstance(n, ast.Attribute)
                   and n.attr in PINNED_COUNTS for node in nodes for n in ast.walk(node))

    guarded = sum(named(n.orelse) for n in ast.walk(tree) if isinstance(n, ast.If) and isinstance(n.test, ast.BoolOp)
                  and isinstance(n.test.op, ast.Or) and ast.dump(n.test.values[0]) == _NO_OVERLAP)
    return 0 < guarded == named([tree])


def postprocess_reads(shadow: TokenShadow, runner, token_num_event: DeferredEvent) -> list:
    """``_postprocess``'s reads of the pinned count and block-step flags, answered from the shadow
    (none without FastDeploy's overlap schedule where its reads are only under it: no view then)."""
    if shadow.reads_need_overlap and not runner.enable_overlap_schedule:
        return []
    si = runner.share_inputs
    return [ServedRead(si["seq_lens_this_time_cpu"], [token_num_event],
                       lambda: shadow.answer("this_time", "_postprocess", si["seq_lens_this_time"])),
            ServedRead(si["is_block_step_cpu"], [token_num_event],
                       lambda: shadow.answer("block_step", "_postprocess", si["is_block_step"]))]


def batch_changed(input_batch, what: str) -> None:
    """``InputBatch.reset_share_inputs`` / ``swap_states`` ran: the shadow of that batch is lost
    (reloaded before the next step)."""
    if (shadow := _SHADOWS_25.get(id(input_batch))) is not None and shadow.share_inputs is input_batch:
        shadow.lose_all(f"InputBatch.{what}")
