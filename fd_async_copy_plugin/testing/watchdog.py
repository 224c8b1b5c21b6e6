"""A watchdog on every host wait of the copy backends in test runs: a hang fails fast.

On ``host`` and ``sim`` a wait never blocks on a device, so a wait that lasts is a hang: a thread
holding the backend's lock forever, an event that never completes on a runtime stand-in. Test runs
bound every wait (``CopyBackend.wait_timeout``), which then raises ``WaitTimeout`` naming the wait,
instead of stalling CI. ``tests/conftest.py`` applies it to the whole suite.
"""

from __future__ import annotations

import contextlib

from ..runtime.backend import CopyBackend

#: Far above any wait of the CPU test suite (they take microseconds), far below a CI job's limit.
TEST_WAIT_TIMEOUT_S = 30.0


@contextlib.contextmanager
def bounded_waits(seconds: float = TEST_WAIT_TIMEOUT_S):
    """Every backend's host waits raise ``WaitTimeout`` after ``seconds`` inside the block."""
    previous = CopyBackend.wait_timeout
    CopyBackend.wait_timeout = float(seconds)
    try:
        yield
    finally:
        CopyBackend.wait_timeout = previous
