"""Where a replica tensor "lives", and the host<->device interactions FastDeploy performs on it.

On CPU Paddle every tensor is a CPU tensor, so the replica marks the tensors that live on the GPU
in real FastDeploy (``share_inputs`` buffers allocated with ``paddle.full``, sampler and model
outputs). Anything unmarked is host memory: pageable (``.cpu()`` results, ``empty_cpu``) or pinned
(allocated through the copy backend, which knows its pinned buffers).

Each helper is named after what FastDeploy does at the call site and reports it to the sync
census through the active copy backend, so a census of the replica counts what the same code
makes a GPU host wait for.
"""

from __future__ import annotations

import numpy as np
import paddle

from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from ...runtime import census
from . import device_tracking
from .device_tracking import device_code, device_op, heavy, phi_op  # noqa: F401  (tracking hooks)

_DEVICE_ATTR = "_fd_reference_on_device"


def as_device(t: paddle.Tensor) -> paddle.Tensor:
    """Mark ``t`` as a GPU tensor of real FastDeploy; returns ``t``."""
    setattr(t, _DEVICE_ATTR, True)
    return t


def is_device(t) -> bool:
    return isinstance(t, paddle.Tensor) and getattr(t, _DEVICE_ATTR, False)


def is_pinned(t) -> bool:
    return isinstance(t, paddle.Tensor) and replica_backend.current().is_pinned(t)


def blocking_d2h(t: paddle.Tensor, site: str) -> paddle.Tensor:
    """FastDeploy's ``.cpu()`` of a device tensor: a counted blocking copy to pageable memory.

    A plain Paddle ``.cpu()`` (not the plugin's copy backend), run as host code so that device
    tracking records it at the caller's site, also inside a stand-in op's body. Always returns a
    new, unmarked tensor: on CPU Paddle ``.cpu()`` returns the same object, and the result must
    not alias (or look like) the device tensor.
    """
    census.record("blocking_d2h", site)
    with device_tracking.host_code():
        out = t.cpu()
    if out is t:
        out = t.clone()
    if is_device(out):
        setattr(out, _DEVICE_ATTR, False)
    return out


def paddle_op_inputs(site: str, *tensors) -> None:
    """A Paddle op (slicing, arithmetic, a ``PD_BUILD_OP`` custom op) is about to read ``tensors``.

    On a GPU build Paddle's data transform moves a pinned input to the GPU with a blocking copy
    and re-points the tensor there (platform-facts.md); the census counts every such input.
    """
    for t in tensors:
        if is_pinned(t):
            census.record("op_on_pinned", site)


def host_view(t: paddle.Tensor, site: str) -> np.ndarray:
    """What host code of an op sees after ``t.copy_to(CPUPlace, false)`` / a host pointer read.

    - device tensor: a counted blocking D2H copy;
    - pinned buffer: a host read with no stream wait (through the backend, which in the
      simulator raises if a copy into the buffer has not landed);
    - pageable host tensor: a plain host read.
    """
    if is_pinned(t):
        return replica_backend.current().read(t, site)
    if is_device(t):
        host = blocking_d2h(t, site)
        census.record("host_read", site)
        return host.numpy()
    census.record("host_read", site)
    return t.numpy()


def count_d2h(site: str) -> None:
    """The replica's own counters for a FastDeploy read of a device value spelled as in FastDeploy
    (``.numpy()``, ``if t[idx]:``) at the call site: a blocking D2H and a host read. Device
    tracking records the read itself, where it happens."""
    census.record("blocking_d2h", site)
    census.record("host_read", site)


def write_back(t: paddle.Tensor, values: np.ndarray) -> None:
    """Store ``values`` into ``t`` in place, as a kernel writing its in-place outputs does.

    ``t`` may be a view (``seq_lens_this_time`` is a view of a buffer): the write goes through it.
    """
    t.copy_(paddle.to_tensor(np.ascontiguousarray(values), dtype=t.dtype, place=paddle.CPUPlace()), True)


def device_array(t) -> np.ndarray | None:
    """The values a device kernel would read from ``t`` (no host<->device interaction counted)."""
    if t is None:
        return None
    return t.numpy()


def pin_memory(t: paddle.Tensor, site: str) -> paddle.Tensor:
    """``t.pin_memory()``: a **new** pinned buffer of ``t``'s shape and dtype (counted)."""
    return replica_backend.current().new_pinned(t.shape, _dtype_name(t), site)


def copy_async(dst: paddle.Tensor, src: paddle.Tensor, site: str) -> None:
    """``dst.copy_(src, False)`` of a device tensor into a pinned buffer: a non-blocking D2H (on the
    simulator, Paddle's copy: no ordering after another stream's copy, ``framework_copy_d2h``)."""
    # FastDeploy calls ``copy_`` on what ``share_inputs`` gave it: a watched tensor's stand-in
    # (step_syncs, inside a watched call) forwards the method to its tensor
    dst = dst if isinstance(dst, paddle.Tensor) else dst.tensor
    backend = replica_backend.current()
    getattr(backend, "framework_copy_d2h", backend.copy_d2h)(dst, src, site)


#: FastDeploy's names, for replica code the plugin reads (``gather_logprobs``' copies: the plugin
#: only replaces a tail that calls ``.cpu()``, ``.pin_memory()``, ``.copy_()`` and the like).
cpu, copy_ = blocking_d2h, copy_async


def _dtype_name(t: paddle.Tensor) -> str:
    return str(t.dtype).replace("paddle.", "")


def device_ops(namespace: dict) -> None:
    """Wrap every public function defined in a replica ops module (``globals()``) as device code."""
    import inspect

    for name, fn in list(namespace.items()):
        if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != namespace["__name__"]:
            continue
        namespace[name] = device_op(fn)
