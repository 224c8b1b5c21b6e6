"""Backend ``host``: the patched code paths with synchronous host copies.

Used on CPU-only Paddle, in the tests and in the selftest. It is the ``cuda`` backend's code
(``RuntimeBackend``) on ``HostRuntime``: buffers are host allocations wrapped exactly like the
pinned ones, copies go by address (``memmove``) and have landed when ``copy_d2h`` returns, so
events are complete when recorded. Sources that cannot be copied by address (non-contiguous, or on
a GPU) are copied through the framework instead.
"""

from __future__ import annotations

from .cuda import RuntimeBackend
from .cudart import HostRuntime


class HostBackend(RuntimeBackend):
    name = "host"
    device_sources = False

    def __init__(self, glue=None, rt=None) -> None:
        super().__init__(HostRuntime() if rt is None else rt, glue=glue, probe=False)

    def blocking_d2h(self, src, label):
        # On CPU Paddle ``.cpu()`` returns the tensor itself; FastDeploy's result is a copy.
        out = super().blocking_d2h(src, label)
        return self.glue.from_numpy(self.glue.snapshot(out)) if out is src else out

    def _plan_other(self, src, device):
        data = self.glue.snapshot(src)  # through the framework, as the source is now (stream order)
        return None, data.ctypes.data, self.glue.shape(src), self.glue.dtype(src), True, data

    def copy_in_flight(self, buf) -> bool:
        return False  # every host copy has landed when copy_d2h returns
