"""FastDeploy 2.5+'s pinned buffers and their non-blocking copies on CPU Paddle.

FastDeploy 2.5 allocates host buffers with ``tensor.pin_memory()`` (``InputBatch``, the runner's
token counts, ``Sampler.gather_logprobs``) and fills them with ``buf.copy_(device_tensor, False)``
before recording an event. CPU Paddle refuses ``CUDAPinnedPlace``, and its ``copy_`` is
synchronous. ``installed()`` routes both, **for calls made from FastDeploy's own files only**, to
the copy backend of the run (``reference/copy_backend.current()``: the simulator for ``sim``):

- ``pin_memory()``: a new pinned buffer of the backend (``new_pinned``) holding the tensor's values;
- ``dst.copy_(src, False)`` into such a buffer: ``backend.copy_d2h`` - on ``sim`` the bytes land
  when an event recorded after it is waited for (FastDeploy's ``create_event`` is routed to the
  backend by ``reference/paddle_device.routed()``), so a read before that sees the old bytes and
  the run's outputs differ from the synchronous reference.

Other callers (Paddle, the plugin, the replica) get Paddle's own methods.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import numpy as np
import paddle

from ..reference import copy_backend as replica_backend

_INSTALLED: dict = {}


#: wrappers between FastDeploy's call and ours (device tracking wraps Tensor methods while active)
_PASS_THROUGH = {os.path.abspath(__file__), os.path.abspath(functools.__file__)}
_TRACKING = importlib.util.find_spec("fd_async_copy_plugin.testing.reference.device_tracking")
if _TRACKING is not None and _TRACKING.origin:
    _PASS_THROUGH.add(os.path.abspath(_TRACKING.origin))


def _from_fastdeploy(fd_dir: str) -> str:
    """``file:line function`` of the caller when it is FastDeploy code, else ''."""
    frame = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _PASS_THROUGH:
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(fd_dir):
        return ""
    name = frame.f_code.co_filename
    return f"{os.path.relpath(name, os.path.dirname(fd_dir))}:{frame.f_lineno} {frame.f_code.co_name}"


def install(fastdeploy_dir: str) -> None:
    """Install the routing for FastDeploy at ``fastdeploy_dir`` (the package folder); idempotent."""
    if _INSTALLED:
        return
    fd_dir = os.path.abspath(fastdeploy_dir) + os.sep
    original_pin = paddle.Tensor.pin_memory
    original_copy = paddle.Tensor.copy_

    def pin_memory(self, *args, **kwargs):
        site = _from_fastdeploy(fd_dir)
        if not site:
            return original_pin(self, *args, **kwargs)
        backend = replica_backend.current()
        buf = backend.new_pinned(self.shape, str(self.dtype).replace("paddle.", ""), site)
        values = np.array(self.numpy()) if int(np.prod(self.shape or [1])) else None
        if values is not None:
            original_copy(buf, paddle.to_tensor(values, dtype=self.dtype, place=paddle.CPUPlace()), True)
        return buf

    def copy_(self, src, blocking=True):
        site = _from_fastdeploy(fd_dir) if not blocking else ""
        if site:
            backend = replica_backend.current()
            if backend.is_pinned(self):
                backend.copy_d2h(self, src, site)
                return self
        return original_copy(self, src, blocking)

    pin_memory.__wrapped__ = original_pin
    copy_.__wrapped__ = original_copy
    paddle.Tensor.pin_memory = pin_memory
    paddle.Tensor.copy_ = copy_
    _INSTALLED.update(pin_memory=original_pin, copy_=original_copy)


def uninstall() -> None:
    """Paddle's own methods back (tests; a real-steps process keeps the routing)."""
    for name, original in _INSTALLED.items():
        setattr(paddle.Tensor, name, original)
    _INSTALLED.clear()
