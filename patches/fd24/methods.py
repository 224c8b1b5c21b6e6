"""FastDeploy 2.4: what runs around each FastDeploy method the plugin touches, one function each
(``runner.line``): ``fd`` is FastDeploy's original, ``on`` the applied features naming it; a
runner's parts (``state.stop``, ``.syncs``, ``.overlap``) are None where their feature does not run
for it. docs/architecture.md shows this file (a test keeps them equal)."""

from __future__ import annotations

import contextlib
import functools

from .._tensor_watch import watching
from ..common import _get_prompt_logprobs_list, consume  # noqa: F401 - the line's function
from ..runner import parts_of
from ..step import current, opened
from . import overlap, step_syncs, stop_flag

NO_PART = contextlib.nullcontext()  # what a part that does not run for the runner puts around FD's call


def __init__(fd, on, self, *args, **kwargs):
    fd(self, *args, **kwargs)
    if "logprobs" in on:
        on["logprobs"].state.note_runner(self)  # logprobs: whether its sampler gathers


def _init_share_inputs(fd, on, self, max_num_seqs):
    fd(self, max_num_seqs)
    if "stop_flag" in on:
        stop_flag.set_up(on["stop_flag"], self, max_num_seqs)  # device/pinned flags, tokens
    if "step_syncs" in on:
        step_syncs.set_up(on["step_syncs"], self)  # device seed, host shadow (needs stop)
    if "overlap" in on:
        overlap.set_up(on["overlap"], self)  # the overlap schedule (needs stop and syncs)


def reset_share_inputs(fd, on, self, *args, **kwargs):
    state = parts_of(self)
    if state.overlap is not None:
        state.overlap.flush("reset_share_inputs")  # overlap: the pending save first
    if state.stop is None:
        result = fd(self, *args, **kwargs)
    else:
        hidden = state.stop.hide_pinned()  # stop_flag: FD's fill_() must not touch pinned keys
        try:
            state.stop.sync("reset_share_inputs")
            result = fd(self, *args, **kwargs)
        finally:
            self.share_inputs.update(hidden)
            state.stop.reset()
    if state.syncs is not None:
        state.syncs.shadow.load("reset_share_inputs")  # step_syncs: the shadow reloaded
    return result


def _insert(site, fd, on, self, *args, **kwargs):
    state = parts_of(self)
    if state.overlap is not None:
        state.overlap.flush(site)  # overlap: the pending save first
    if state.stop is not None:
        state.stop.sync(site)  # stop_flag: the flag current, so the insert's write is the last
    # step_syncs: shadow refreshed, FD's writes followed, block-table rows staged
    with step_syncs.inserting(state.syncs.shadow, self, site) if state.syncs is not None else NO_PART:
        result = fd(self, *args, **kwargs)
    if state.stop is not None:
        state.stop.after_insert()  # stop_flag: the pinned flag follows the legacy one
    return result


insert_tasks_v1 = functools.partial(_insert, "insert_tasks_v1")
insert_prefill_inputs = functools.partial(_insert, "insert_prefill_inputs")


def _dummy_prefill_inputs(fd, on, self, *args, **kwargs):
    syncs = parts_of(self).syncs
    with step_syncs.inserting(syncs.shadow, self, "_dummy_prefill_inputs") if syncs is not None else NO_PART:
        return fd(self, *args, **kwargs)


def execute_model(fd, on, self, *args, **kwargs):
    # stop_flag: nothing but the step gate (no enable()/disable() inside a step)
    state = parts_of(self).overlap
    if state is None:
        return fd(self, *args, **kwargs)
    if why := overlap.off_reason(self, state.runner_module):  # overlap off: the pending save first, then FD's step
        state.flush("overlap off")
        state.fallbacks[why] += 1
        return fd(self, *args, **kwargs)
    state.begin_step(self)  # overlap: this step is sized by the bound, or waits for the exact count
    try:
        with opened(self, saves=state):  # overlap: this step's saves are captured
            return fd(self, *args, **kwargs)
    finally:
        state.in_step = False
        state.flush("step end")  # FD returned before its not_need_stop() check
        state.end_step()


def padding_cudagraph_inputs(fd, on, self):
    state = parts_of(self)
    if state.overlap is not None and state.syncs is not None:
        state.overlap.launch_wait(self, state.syncs.shadow)  # overlap exact: the exact count, trimmed
    return fd(self)


def not_need_stop(fd, on, self):
    state = parts_of(self)
    if state.overlap is not None and state.overlap.flag_check():
        return True  # overlap: a step's output is still to be saved
    return fd(self) if state.stop is None else state.stop.flag("not_need_stop")  # stop_flag: the legacy flag


def _dummy_run(fd, on, self, *args, **kwargs):
    if (state := parts_of(self).overlap) is not None:
        state.flush("_dummy_run")  # overlap: the pending save first
    return fd(self, *args, **kwargs)


def _prepare_inputs(fd, on, self, *args, **kwargs):
    state = parts_of(self)
    syncs = state.syncs
    if syncs is None:
        return fd(self, *args, **kwargs)
    dummy = bool(kwargs.get("is_dummy_or_profile_run", args[0] if args else False))
    count = step_syncs.step_count(syncs, self, dummy)  # step_syncs: T, and S1's count
    armed = (syncs.shadow, count) if count is not None else None
    if state.overlap is not None:
        state.overlap.keep_padding(self, syncs.shadow, count)  # overlap exact: the ids rows the bound overwrites
    with opened(self, count=armed), watching(syncs.shadow.prepare_watch, runner=self):
        return fd(self, *args, **kwargs)  # S1 in get_padding_offset, S2 from the shadow


def exist_prefill(fd, on, self):
    syncs = parts_of(self).syncs
    answer = None if syncs is None else step_syncs.exist_prefill(syncs.shadow, self)  # S3/S7
    return fd(self) if answer is None else answer


# --- pre_and_post_process: FastDeploy's functions the runner calls --------------------------------


def get_padding_offset(fd, on, input_ids, token_num, *args, **kwargs):
    armed = getattr(current(), "count", None)  # step_syncs: the count _prepare_inputs knew (or no step)
    if armed is None:
        return fd(input_ids, token_num, *args, **kwargs)
    return step_syncs.padding_offset(fd, *armed, input_ids, token_num, args, kwargs)


def _update(name, fd, on, *args, **kwargs):
    registry = on["stop_flag"].state  # (None once a disable() tore it down: no runner has a part)
    state = registry.for_flag(args[1]) if registry is not None and len(args) > 7 and not kwargs else None
    if state is None:
        return fd(*args, **kwargs)
    # stop_flag: the plugin's op writes the device flag (no host copy) ...
    registry.device_ops[name](args[0], state.device, *args[2:])
    # ... then the step's copies in one batch: the flag, the final sampled tokens (argument 7),
    # step_syncs' snapshot, overlap's flag of the step
    state.after_update(args[7])


update_inputs_v1 = functools.partial(_update, "update_inputs_v1")
update_inputs = functools.partial(_update, "update_inputs")


def post_process(fd, on, *args, **kwargs):
    try:
        return fd(*args, **kwargs)
    finally:  # stop_flag: the calling runner's flag made current (unless overlap defers the save)
        if (registry := on["stop_flag"].state) is not None:
            registry.after_post_process(kwargs.get("share_inputs"))


def post_process_normal(fd, on, sampler_output, *args, **kwargs):
    tensors = getattr(sampler_output, "logprobs_tensors", None)
    if isinstance(tensors, on["logprobs"].state.AsyncLogprobsTensors) and \
            getattr(sampler_output, "logz_per_batch", None) is not None:
        # logprobs: Keep-Sampling-Mask renormalises the logprobs with Paddle ops before the save:
        # it gets host-owned tensors, read after the copy event
        sampler_output.logprobs_tensors = tensors.materialize("ksm_renormalize")
    return fd(sampler_output, *args, **kwargs)


def _save(name, fd, on, *args, **kwargs):
    saves = getattr(current(), "saves", None)  # (no step open: None)
    flag_index = overlap.SAVE_OPS[name]
    if saves is not None and not kwargs and len(args) > flag_index:
        # overlap: captured, it runs after the next forward launch (with this step's flag)
        saves.capture(functools.partial(consume, fd, on, name), args, flag_index)
        return None
    return consume(fd, on, name, *args, **kwargs)  # stop_flag, logprobs: read after the event


save_output = functools.partial(_save, "save_output")
save_output_topk = functools.partial(_save, "save_output_topk")


def _build_stream_transfer_data(fd, on, *args, **kwargs):
    return consume(fd, on, "_build_stream_transfer_data", *args, **kwargs)  # stop_flag
