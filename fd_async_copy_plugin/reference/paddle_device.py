"""Routes ``paddle.device.synchronize()`` through the copy backend on the CPU build of Paddle.

FastDeploy 2.5 calls ``paddle.device.synchronize()`` in ``_get_prompt_logprobs_list``, and the
plugin's ``sync_scope`` feature swaps that attribute for the duration of the call, so the replica
must spell the call the same way. On the CPU build the real function raises ("device should be
gpu, xpu"); installing this routes it to ``runtime.current().device_synchronize(...)``, which the
census counts and which lands every pending copy in the simulator - what a device-wide sync does.

Installed by the 2.5 replica's runner module, once per process, and only on a CPU build: on a
CUDA build Paddle's own function is left alone. ``uninstall()`` restores the original.
"""

from __future__ import annotations

import paddle

from .. import runtime


def _device_synchronize(device=None):
    runtime.current().device_synchronize("paddle.device.synchronize")


_device_synchronize.fd_async_copy_replica = True


def install() -> bool:
    """Route ``paddle.device.synchronize``; returns whether the routing is in place."""
    if paddle.is_compiled_with_cuda():
        return False
    current = paddle.device.synchronize
    if getattr(current, "fd_async_copy_replica", False):
        return True
    _device_synchronize.__wrapped__ = current
    paddle.device.synchronize = _device_synchronize
    return True


def uninstall() -> None:
    current = paddle.device.synchronize
    if getattr(current, "fd_async_copy_replica", False):
        paddle.device.synchronize = current.__wrapped__
