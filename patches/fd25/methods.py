"""FastDeploy 2.5 and develop (whose features here, logprobs and sync_scope, are a subset): what
runs around each FastDeploy method the plugin touches, one function each (``runner.line``), as in
``fd24/methods.py``. docs/architecture.md shows this file (a test keeps them equal)."""

from __future__ import annotations

import functools

from ..common import _get_prompt_logprobs_list, consume  # noqa: F401 - the line's function
from ..runner import parts_of
from ..step import current, opened
from . import step_syncs
from .._tensor_watch import DeferredEvent, watching


def __init__(fd, on, self, *args, **kwargs):
    fd(self, *args, **kwargs)
    if "logprobs" in on:
        on["logprobs"].state.note_runner(self)  # logprobs: whether its sampler gathers
    if "step_syncs" in on:
        step_syncs.set_up(on["step_syncs"], self)  # step_syncs: the seed on the device, the shadow


def insert_tasks_v1(fd, on, self, req_dicts, *args, **kwargs):
    event = getattr(self, "last_post_process_event", None)  # FastDeploy's own event object
    if "flag_race" in on and event is not None and req_dicts and getattr(self, "enable_overlap_schedule", True):
        event.synchronize()  # flag_race: the last step's flag copy landed before the insert writes
    shadow = getattr(parts_of(self).syncs, "shadow", None)  # (None: no step_syncs part, or no shadow)
    if shadow is None or shadow.stale():
        return fd(self, req_dicts, *args, **kwargs)
    shadow.settle("insert_tasks_v1")  # step_syncs: the last snapshot taken, FD's writes followed
    with watching(step_syncs._watched_25(shadow), runner=self):
        return fd(self, req_dicts, *args, **kwargs)


def _prepare_inputs(fd, on, self, *args, **kwargs):
    syncs = parts_of(self).syncs
    if syncs is None or not step_syncs.seed_in_place(syncs, self) or syncs.shadow is None:  # step_syncs: T
        return fd(self, *args, **kwargs)
    return step_syncs.prepare_counted(fd, syncs, self, args, kwargs)  # the count from the shadow


def _postprocess(fd, on, self, model_output, p_done_idxs, token_num_event, *args, **kwargs):
    shadow = getattr(parts_of(self).syncs, "shadow", None)
    if shadow is None or not isinstance(token_num_event, DeferredEvent):
        return fd(self, model_output, p_done_idxs, token_num_event, *args, **kwargs)
    shadow.settle("_postprocess")  # step_syncs: its reads of the pinned count from the shadow
    token_num_event.open()
    try:
        reads = step_syncs.postprocess_reads(shadow, self, token_num_event)
        with opened(self, posting=True), watching(reads, runner=self):
            return fd(self, model_output, p_done_idxs, token_num_event, *args, **kwargs)
    finally:
        if token_num_event.close():
            shadow.served["token_num _postprocess: wait not needed (no read)"] += 1


def _save_model_output(fd, on, self, *args, **kwargs):
    result = fd(self, *args, **kwargs)
    if (syncs := parts_of(self).syncs) is not None and syncs.shadow is not None:
        syncs.shadow.settle("_save_model_output")  # FD waited on post_process_event: it landed
    return result


def _input_batch(what, fd, on, self, *args, **kwargs):
    result = fd(self, *args, **kwargs)
    step_syncs.batch_changed(self, what)  # step_syncs: the shadow reloaded before the next step
    return result


input_batch_reset_share_inputs = functools.partial(_input_batch, "reset_share_inputs")
input_batch_swap_states = functools.partial(_input_batch, "swap_states")


# --- pre_and_post_process: FastDeploy's functions the runner calls --------------------------------


def update_inputs_v1(fd, on, *args, **kwargs):
    result = fd(*args, **kwargs)
    step = current()
    syncs = parts_of(step.runner).syncs if step is not None and step.posting else None
    if syncs is not None and syncs.shadow is not None and not syncs.shadow.stale():
        syncs.shadow.issue_snapshot()  # step_syncs: the snapshot, before FD's post_process_event
    return result


def save_output_topk(fd, on, *args, **kwargs):
    return consume(fd, on, "save_output_topk", *args, **kwargs)  # logprobs: read after the event
