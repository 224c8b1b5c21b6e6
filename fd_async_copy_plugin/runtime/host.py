"""Backend ``host``: the patched code paths with synchronous host copies.

Used on CPU-only Paddle, in the tests and in the selftest. Buffers are ordinary CPU tensors and
every copy has landed when ``copy_d2h`` returns, so events are complete when recorded.
"""

from __future__ import annotations

import paddle

from .backend import CopyBackend
from .census import record as census_record


class HostBackend(CopyBackend):
    name = "host"

    def _alloc(self, shape, dtype):
        # Host memory directly: ``paddle.empty(shape).cpu()`` would be a device allocation and a
        # blocking D2H on a GPU build (device tracking reports it).
        return paddle.empty(shape, dtype=dtype, device="cpu")

    def blocking_d2h(self, src, label):
        # On CPU Paddle ``.cpu()`` returns the tensor itself; FastDeploy's result is a copy.
        census_record("blocking_d2h", label)
        out = src.cpu()
        return out.clone() if out is src else out

    def _copy(self, dst, src, seq, label):
        # Positional ``blocking``: Paddle 3.3 ignores it as a keyword (platform-facts.md).
        dst.copy_(src, True)

    def copy_in_flight(self, buf) -> bool:
        return False  # every host copy has landed when copy_d2h returns
