"""Routes ``paddle.device.synchronize()`` and ``paddle.device.cuda.create_event()`` through the copy
backend on the CPU build of Paddle.

FastDeploy 2.5 calls ``paddle.device.synchronize()`` in ``_get_prompt_logprobs_list``, and the
plugin's ``sync_scope`` feature swaps that attribute for the duration of the call, so the replica
must spell the call the same way. On the CPU build the real function raises ("device should be
gpu, xpu"); installing this routes it to ``replica_backend.current().device_synchronize(...)``, which the
census counts and which lands every pending copy in the simulator - what a device-wide sync does.

FastDeploy 2.5's ``token_num_event`` is ``paddle.device.cuda.create_event()`` with ``record()`` and
``synchronize()`` (gpu_model_runner.py:1332-1340, :2365); on the CPU build the real one raises
("CUDAEvent can only be initialized on the GPU platform"). The routed one records and waits through
the backend (the census counts the wait at the caller's line). When the plugin has a junction on
``create_event`` (``step_syncs``' scoped event), the routing goes beneath its links (``set_bottom``).

``paddle.device.current_stream()`` on the CPU build returns a ``ReplicaStream`` whose
``wait_event`` reaches the backend's ``stream_wait_event`` where it has one (``sim``: the fake CUDA
runtime's ``cudaStreamWaitEvent``), and does nothing on ``host`` (every copy lands when issued).

Installed only while asked for - ``routed()``, which ``driver.run_decode`` enters for every run -
and only on a CPU build: on a CUDA build Paddle's own function is left alone. Importing the
replica changes nothing in Paddle.
"""

from __future__ import annotations

import contextlib
import sys

import paddle

from fd_async_copy_plugin.registry.patch import Junction
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend


def _device_synchronize(device=None):
    replica_backend.current().device_synchronize("paddle.device.synchronize")


_device_synchronize.fd_async_copy_replica = True


class ReplicaEvent:
    """``paddle.device.cuda.Event`` on the CPU build: ``record()`` -> ``backend.record``,
    ``synchronize()`` -> ``backend.wait`` (named by the calling function), ``query()``."""

    def __init__(self) -> None:
        self.event = None

    def record(self, stream=None) -> None:
        self.event = replica_backend.current().record(f"{sys._getframe(1).f_code.co_name}.event")

    def synchronize(self) -> None:
        if self.event is not None:
            replica_backend.current().wait(self.event, f"{sys._getframe(1).f_code.co_name}.token_num_event")

    def query(self) -> bool:
        return self.event is None or replica_backend.current().query(self.event)


class RecordedEvent:
    """FastDeploy's ``post_process_event`` (``paddle.device.cuda.create_event()`` + ``record()``,
    FD 2.5 gpu_model_runner.py:2606-2610) over the copy backend's event: ``synchronize()`` waits for it
    (the wait named by the calling function), as FastDeploy's event object does on a GPU."""

    def __init__(self) -> None:
        self.event = None

    def record(self) -> None:
        self.event = replica_backend.current().record("post_process_event")

    def synchronize(self) -> None:
        caller = sys._getframe(1).f_code.co_name  # FastDeploy's own wait keeps its census name
        replica_backend.current().wait(self.event, caller if caller == "_save_model_output" else f"{caller}.post_process_event")


class ReplicaStream:
    """``paddle.device.current_stream()`` on the CPU build: ``wait_event(event)`` (what the stream
    issues from now on runs after ``event``) goes to the backend's ``stream_wait_event`` where it
    has one (``sim``); elsewhere it is a no-op."""

    def wait_event(self, event) -> None:
        backend = replica_backend.current()
        order = getattr(backend, "stream_wait_event", None)
        native = getattr(event, "event", event)  # a ReplicaEvent's backend event
        if order is not None and native is not None:
            order(native)


def _current_stream(device=None):
    return ReplicaStream()


_current_stream.fd_async_copy_replica = True


def _create_event(enable_timing=False, blocking=False, interprocess=False):
    return ReplicaEvent()


_create_event.fd_async_copy_replica = True


def _install_create_event() -> None:
    cuda = paddle.device.cuda
    junction = Junction.at(cuda, "create_event")
    if junction is not None:  # beneath the plugin's links
        if not getattr(junction.bottom, "fd_async_copy_replica", False):
            junction.set_bottom(_create_event)
        return
    current = cuda.create_event
    if getattr(current, "fd_async_copy_replica", False):
        return
    _create_event.__wrapped__ = current
    cuda.create_event = _create_event


def _uninstall_create_event() -> None:
    cuda = paddle.device.cuda
    junction = Junction.at(cuda, "create_event")
    if junction is not None:
        if junction.bottom is _create_event and junction.original is not _create_event:
            junction.set_bottom(junction.original)
        return
    current = cuda.create_event
    if getattr(current, "fd_async_copy_replica", False):
        cuda.create_event = current.__wrapped__


def install() -> bool:
    """Route ``paddle.device.synchronize``; returns whether the routing is in place.

    Only Paddle's own function is replaced: when something wraps it already (the plugin's
    ``sync_scope``), the routing would sit above that wrapper and bypass it, so it is left alone.
    """
    if paddle.is_compiled_with_cuda():
        return False
    _install_create_event()
    if not getattr(paddle.device.current_stream, "fd_async_copy_replica", False):
        _current_stream.__wrapped__ = paddle.device.current_stream
        paddle.device.current_stream = _current_stream
    current = paddle.device.synchronize
    if getattr(current, "fd_async_copy_replica", False):
        return True
    if getattr(current, "__wrapped__", None) is not None:
        return False
    _device_synchronize.__wrapped__ = current
    paddle.device.synchronize = _device_synchronize
    return True


def uninstall() -> None:
    if not paddle.is_compiled_with_cuda():
        _uninstall_create_event()
        if getattr(paddle.device.current_stream, "fd_async_copy_replica", False):
            paddle.device.current_stream = paddle.device.current_stream.__wrapped__
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
