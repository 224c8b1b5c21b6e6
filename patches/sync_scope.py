"""Feature ``sync_scope``: no device-wide synchronize for prompt logprobs; O(rows) ``slice_rows``.

Why:    FastDeploy PR #6362 (2.5+) added ``paddle.device.synchronize()`` in
        ``GPUModelRunner._get_prompt_logprobs_list``, once per prompt-logprob request per prefill
        chunk: it waits for every stream on the device, not only for the copies it needs. Its
        ``LogprobsTensors.slice_rows`` copies the *whole* tensor (``.cpu()``) for every row, and
        ``_build_stream_transfer_data`` calls it once per batch row: O(B) full copies per step on
        the ZMQ output path (``FD_USE_GET_SAVE_OUTPUT_V1``).
How:    During ``_get_prompt_logprobs_list`` the device-wide synchronize is scoped to an event
        recorded on the current stream (which covers the copies issued there). ``slice_rows``
        reads only the rows asked for; pinned fields are read through their pointer after their
        copy event, so no Paddle op touches pinned memory.
Mirrors: fixes flaws of FastDeploy PR #6362.
FD:     2.5 and 2.6+/develop. FastDeploy 2.4 has neither flaw (``native``).
Delete: when FastDeploy's ``_get_prompt_logprobs_list`` waits on an event and ``slice_rows`` slices
        before copying.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import threading

import paddle

from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.registry.patch import Feature, IncompatibleError, Patch, Target

OUTPUT = "worker.output"
RUNNER = "worker.gpu_model_runner"

_swap_lock = threading.Lock()


def _calls_device_synchronize(fn) -> bool:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "synchronize":
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "device":
                return True
    return False


def check_prompt_logprobs(original, ctx) -> None:
    try:
        found = _calls_device_synchronize(original)
    except (OSError, TypeError, SyntaxError) as exc:
        raise IncompatibleError(f"cannot read _get_prompt_logprobs_list source: {exc}") from exc
    if not found:
        raise IncompatibleError("_get_prompt_logprobs_list has no paddle.device.synchronize() to scope")


def build_prompt_logprobs(original, ctx):
    def event_scoped_synchronize(device=None):
        backend = runtime.current()
        backend.wait(backend.record("prompt_logprobs"), "prompt_logprobs")

    def _get_prompt_logprobs_list(self, hidden_states):
        # paddle.device.synchronize is looked up at call time inside FastDeploy's method: scope it
        # to an event on the current stream for the duration of this call only.
        with _swap_lock:
            saved = paddle.device.synchronize
            paddle.device.synchronize = event_scoped_synchronize
            try:
                return original(self, hidden_states)
            finally:
                paddle.device.synchronize = saved

    _get_prompt_logprobs_list.__wrapped__ = original
    return _get_prompt_logprobs_list


def build_slice_rows(original, ctx):
    def slice_rows(self, start: int, end: int):
        backend = runtime.current()
        rows = []
        for field in self:
            if backend.is_pinned(field):
                rows.append(backend.to_host(field, "slice_rows", start, end))
            else:
                part = field[start:end]
                rows.append(paddle.to_tensor(part.numpy(), place=paddle.CPUPlace()))
        return type(self)(*rows)

    slice_rows.__doc__ = original.__doc__
    slice_rows.__wrapped__ = original
    return slice_rows


class SyncScopeFeature(Feature):
    name = "sync_scope"
    mirrors = "fixes FastDeploy PR #6362's device-wide synchronize and whole-tensor slice_rows"
    profiles = {
        "fastdeploy-2.4": "native: FastDeploy 2.4 has no device-wide synchronize here and slices before copying",
        "fastdeploy-2.5": "apply",
        "fastdeploy-2.6+": "apply",
    }

    def patches(self, ctx):
        return [
            Patch(Target(RUNNER, "GPUModelRunner._get_prompt_logprobs_list"), build_prompt_logprobs, check_prompt_logprobs),
            Patch(Target(OUTPUT, "LogprobsTensors.slice_rows"), build_slice_rows),
        ]


FEATURES = [SyncScopeFeature()]
