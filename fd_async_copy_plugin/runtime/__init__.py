"""The pinned-buffer/event core: copy backends, pinned rings, the sync census.

The race-detecting simulator (``SimulatedBackend``, backend ``sim``) is for tests and the selftest:
it is imported only when asked for, never by ``enable()`` with a real backend.
"""

from __future__ import annotations

from ..config import BACKENDS  # the one list of backend names
from .backend import AsyncCopyError, BufferInUseError, CopyBackend, CopyEvent, PendingCopyError, WaitTimeout
from .census import SyncCensus, collecting
from .host import HostBackend
from .ring import PinnedRing, PinnedSlot, RingFull


def make_backend(name: str) -> CopyBackend:
    """Build a backend by name (``auto`` resolves to ``cuda`` or raises with the reason)."""
    if name in ("auto", "cuda"):
        from .cuda import CudaBackend

        return CudaBackend()  # (raises saying why where CUDA is not usable)
    if name == "host":
        return HostBackend()
    if name == "sim":
        from .simulated import SimulatedBackend

        return SimulatedBackend()
    raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")


def __getattr__(name: str):
    if name == "SimulatedBackend":  # imported on first use only
        from .simulated import SimulatedBackend

        return SimulatedBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AsyncCopyError", "BACKENDS", "BufferInUseError", "CopyBackend", "CopyEvent", "HostBackend",
           "PendingCopyError", "PinnedRing", "PinnedSlot", "RingFull", "SimulatedBackend", "SyncCensus",
           "WaitTimeout", "collecting", "make_backend"]
