"""Feature ``sync_scope``: no device-wide synchronize for prompt logprobs; O(rows) ``slice_rows``.

Why:    FastDeploy PR #6362 (2.5+) added ``paddle.device.synchronize()`` in
        ``GPUModelRunner._get_prompt_logprobs_list``, once per prompt-logprob request per prefill
        chunk: it waits for every stream on the device, not only for the copies it needs. Its
        ``LogprobsTensors.slice_rows`` copies the *whole* tensor (``.cpu()``) for every row, and
        ``_build_stream_transfer_data`` calls it once per batch row: O(B) full copies per step on
        the ZMQ output path (``FD_USE_GET_SAVE_OUTPUT_V1``).
How:    ``paddle.device.synchronize`` is unchanged except inside ``_get_prompt_logprobs_list`` on the
        calling thread: there it waits for the current stream only (the copies FastDeploy issued
        there are on it), or for nothing when the ``logprobs`` feature's gather already handed back
        host-owned data after its own event wait. ``slice_rows`` reads only the rows asked for,
        through the pointer for host memory, so no Paddle op touches a pinned tensor.
Mirrors: fixes flaws of FastDeploy PR #6362.
FD:     2.5 and 2.6+/develop. FastDeploy 2.4 has neither flaw (``native``).
Delete: when FastDeploy's ``_get_prompt_logprobs_list`` waits on an event and ``slice_rows`` slices
        before copying.
Strides: a host field is read with its strides (``host_rows_view``: a column-sliced, transposed or
        step-sliced field gives its own rows, not its logical shape laid over the pointer); strides
        it cannot read leave that call to FastDeploy's ``slice_rows``.
"""

from __future__ import annotations

import ast
import ctypes

import numpy as np
import paddle

from fd_async_copy_plugin import fd_identity
from fd_async_copy_plugin.registry.patch import JUNCTION_MARK, Feature, IncompatibleError, Patch, Target, wraps
from fd_async_copy_plugin.runtime.backend import host_view, np_dtype_of
from fd_async_copy_plugin.runtime.glue import paddle_glue

from .logprobs import RUNNER, check_slice_rows
from .runner import line
from .step import prompt_runner


def check_prompt_logprobs(original, ctx) -> None:
    """FastDeploy's method calls ``<...>.device.synchronize()`` (what this feature scopes)."""
    try:
        tree = fd_identity.function_node(original)
    except (OSError, TypeError, SyntaxError) as exc:
        raise IncompatibleError(f"cannot read _get_prompt_logprobs_list source: {exc}") from exc
    calls = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    if not any(isinstance(f, ast.Attribute) and f.attr == "synchronize" and isinstance(f.value, ast.Attribute)
               and f.value.attr == "device" for f in calls):
        raise IncompatibleError("_get_prompt_logprobs_list has no paddle.device.synchronize() to scope")


def build_device_synchronize(original, ctx):
    """``paddle.device.synchronize`` itself: unchanged everywhere except inside the prompt-logprobs
    method on the calling thread, where it waits for the current stream only (the copies FastDeploy
    issued there are on it) - or for nothing, when the plugin's gather already waited."""

    @wraps(original)
    def synchronize(*args, **kwargs):
        runner = prompt_runner()
        if runner is None:
            return original(*args, **kwargs)
        # The runner's sampler gathers with the plugin's gather_logprobs: in prompt mode it hands back
        # host-owned tensors after its own wait, so FastDeploy's synchronize has nothing to wait for.
        gather = getattr(type(getattr(runner, "sampler", None)), "gather_logprobs", None)
        if "logprobs" not in getattr(getattr(gather, JUNCTION_MARK, None), "links", ()):
            ctx.backend.stream_synchronize("prompt_logprobs")

    return synchronize


def host_rows_view(field):
    """A zero-copy numpy view of a host tensor through its pointer, honouring its strides (Paddle's
    ``strides`` count elements; ``data_ptr()`` already includes the view's offset). None when the
    strides cannot be read or are negative (the caller then keeps FastDeploy's path)."""
    contiguous = getattr(field, "is_contiguous", None)
    try:
        if contiguous is None or contiguous():
            return host_view(field)
        shape, strides = [int(n) for n in field.shape], [int(n) for n in field.strides]
    except Exception:
        return None
    if len(strides) != len(shape) or any(n < 0 for n in strides):
        return None
    dtype = np_dtype_of(paddle_glue().dtype(field))
    if 0 in shape:
        return np.empty(shape, dtype=dtype)
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, strides))  # elements, first to last
    raw = (ctypes.c_byte * (extent * dtype.itemsize)).from_address(paddle_glue().address(field))
    base = np.frombuffer(raw, dtype=dtype, count=extent)
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=[st * dtype.itemsize for st in strides],
                                           writeable=False)


def build_slice_rows(original, ctx):
    backend = ctx.backend

    @wraps(original)
    def slice_rows(self, start: int, end: int):
        rows = []
        for field in self:
            if backend.is_pinned(field):
                rows.append(backend.to_host(field, "slice_rows", start, end))
            elif field.place.is_cpu_place() or field.place.is_cuda_pinned_place():
                # Host memory (FastDeploy's own pinned buffers included): read the rows through the
                # pointer - a Paddle op here would move a pinned tensor to the GPU -, with the
                # field's strides (a column-sliced, transposed or step-sliced field).
                view = host_rows_view(field)
                if view is None:  # strides this cannot read: FastDeploy's own rows for this call
                    return original(self, start, end)
                rows.append(paddle.to_tensor(np.array(view[start:end], copy=True), place=paddle.CPUPlace()))
            else:
                rows.append(paddle.to_tensor(field[start:end].numpy(), place=paddle.CPUPlace()))
        return type(self)(*rows)

    return slice_rows


class SyncScopeFeature(Feature):
    name = "sync_scope"
    mirrors = ("FastDeploy PR #6362's prompt logprobs and slice_rows, without its device-wide synchronize "
               "and whole-tensor copies")
    profiles = {"fastdeploy-2.4": "native: FastDeploy 2.4 has no device-wide synchronize here and slices "
                                  "before copying", "fastdeploy-2.5": "apply", "fastdeploy-2.6+": "apply"}
    patches = (
        Patch(Target("paddle.device", "synchronize", absolute=True), build_device_synchronize),
        Patch(Target(RUNNER, "GPUModelRunner._get_prompt_logprobs_list"), line("_get_prompt_logprobs_list"),
              check_prompt_logprobs),
        Patch(Target("worker.output", "LogprobsTensors.slice_rows"), build_slice_rows, check_slice_rows))


FEATURES = [SyncScopeFeature()]
