"""Backend ``cuda``: real pinned memory, non-blocking copies and CUDA events.

UNVERIFIED ON GPU: no GPU build of Paddle 3 can be installed on the project's machines. The
calls used here are the ones FastDeploy 2.5 uses (``pin_memory()``, ``copy_(src, False)``,
``paddle.device.cuda.Event``); ``benchmarks/paddle_gpu_check.py`` checks them on a Paddle GPU build.
"""

from __future__ import annotations

import paddle

from .backend import CopyBackend, CopyEvent

_EVENT_POOL = 8


def cuda_available() -> tuple[bool, str]:
    """Whether this Paddle can run the ``cuda`` backend, and why not.

    Checks ``is_compiled_with_cuda()`` before touching any CUDA API: on the CPU build,
    ``paddle.device.cuda.current_stream()`` segfaults the process.
    """
    if not paddle.is_compiled_with_cuda():
        return False, "Paddle is not compiled with CUDA (CPU build)"
    try:
        count = paddle.device.cuda.device_count()
    except Exception as exc:  # pragma: no cover - GPU builds only
        return False, f"cannot query CUDA devices: {exc}"
    if count < 1:
        return False, "Paddle is compiled with CUDA but sees no GPU"
    return True, f"{count} CUDA device(s)"


class CudaBackend(CopyBackend):
    name = "cuda"

    def __init__(self) -> None:
        ok, why = cuda_available()
        if not ok:
            raise RuntimeError(f"backend 'cuda' is unavailable: {why}")
        super().__init__()
        # Events are reused round-robin instead of created per step. Re-recording an event that
        # an older CopyEvent still refers to only makes that waiter wait longer, never shorter.
        # They are created at the first record, per device: the plugin is enabled before FastDeploy's
        # worker selects its GPU, and an event belongs to the device current when it was created.
        self._events: dict[int, list] = {}
        self._next_event = 0

    def _alloc(self, shape, dtype):  # pragma: no cover - GPU builds only
        # Allocated once per buffer; never in the decode loop after warm-up.
        return paddle.empty(shape, dtype=dtype).cpu().pin_memory()

    def _copy(self, dst, src, seq, label):  # pragma: no cover - GPU builds only
        # Positional ``blocking=False``: an async cudaMemcpyAsync on the current stream.
        dst.copy_(src, False)

    def _record_native(self, seq, label):  # pragma: no cover - GPU builds only
        # Blocking (sleeping) events: the host does not spin on the driver lock while waiting.
        device = paddle.device.current_device()
        pool = self._events.get(device)
        if pool is None:
            pool = self._events[device] = [
                paddle.device.cuda.Event(enable_timing=False, blocking=True) for _ in range(_EVENT_POOL)
            ]
        event = pool[self._next_event % _EVENT_POOL]
        self._next_event += 1
        event.record()
        return event

    def _wait_native(self, event: CopyEvent) -> None:  # pragma: no cover - GPU builds only
        event.native.synchronize()

    def _drain_native(self) -> None:  # pragma: no cover - GPU builds only
        paddle.device.cuda.current_stream().synchronize()

    def free_pinned(self, t, label):  # pragma: no cover - GPU builds only
        super().free_pinned(t, label)
        del t
