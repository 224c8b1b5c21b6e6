"""Routes ``paddle.device.synchronize()`` through the copy backend on the CPU build of Paddle.

FastDeploy 2.5 calls ``paddle.device.synchronize()`` in ``_get_prompt_logprobs_list``, and the
plugin's ``sync_scope`` feature swaps that attribute for the duration of the call, so the replica
must spell the call the same way. On the CPU build the real function raises ("device should be
gpu, xpu"); installing this routes it to ``replica_backend.current().device_synchronize(...)``, which the
census counts and which lands every pending copy in the simulator - what a device-wide sync does.

Installed only while asked for - ``routed()``, which ``driver.run_decode`` enters for every run -
and only on a CPU build: on a CUDA build Paddle's own function is left alone. Importing the
replica changes nothing in Paddle.
"""

from __future__ import annotations

import contextlib

import paddle

from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend


def _device_synchronize(device=None):
    replica_backend.current().device_synchronize("paddle.device.synchronize")


_device_synchronize.fd_async_copy_replica = True


def install() -> bool:
    """Route ``paddle.device.synchronize``; returns whether the routing is in place.

    Only Paddle's own function is replaced: when something wraps it already (the plugin's
    ``sync_scope``), the routing would sit above that wrapper and bypass it, so it is left alone.
    """
    if paddle.is_compiled_with_cuda():
        return False
    current = paddle.device.synchronize
    if getattr(current, "fd_async_copy_replica", False):
        return True
    if getattr(current, "__wrapped__", None) is not None:
        return False
    _device_synchronize.__wrapped__ = current
    paddle.device.synchronize = _device_synchronize
    return True


def uninstall() -> None:
    current = paddle.device.synchronize
    if getattr(current, "fd_async_copy_replica", False):
        paddle.device.synchronize = current.__wrapped__


@contextlib.contextmanager
def routed():
    """``paddle.device.synchronize`` routed to the copy backend inside the block (CPU builds) and
    restored afterwards. A plugin patch applied inside the block wraps the routing (the replica's
    runner module is imported there); ``disable()`` hands the routing back, and the next block's
    exit removes it."""
    install()
    try:
        yield
    finally:
        uninstall()
