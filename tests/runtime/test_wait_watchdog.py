"""Issue 25: a watchdog on every event wait in tests - a hang fails fast, never stalls CI.

In test runs (``tests/conftest.py``, ``testing/watchdog.py``) every host wait of a copy backend is
bounded: a wait that cannot finish (here: another thread holds the backend's lock for good, as a
stuck producer would) raises ``WaitTimeout`` naming the wait instead of hanging the suite."""

from __future__ import annotations

import threading

import paddle
import pytest

from fd_async_copy_plugin.runtime import CopyBackend, HostBackend, SimulatedBackend, WaitTimeout
from fd_async_copy_plugin.testing.watchdog import TEST_WAIT_TIMEOUT_S, bounded_waits


def test_the_suite_runs_with_bounded_waits():
    assert CopyBackend.wait_timeout == TEST_WAIT_TIMEOUT_S


def _run_bounded(fn, limit: float):
    """Run ``fn`` on a daemon thread; (finished, exception). A hang is reported, never waited out."""
    outcome = {}

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome["exc"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    return not thread.is_alive(), outcome.get("exc")


@pytest.mark.parametrize("make", [HostBackend, SimulatedBackend], ids=["host", "sim"])
@pytest.mark.parametrize("wait", ["event", "stream_synchronize", "read_after_copy"])
def test_a_wait_that_cannot_finish_raises_a_clear_error_fast(make, wait):
    backend = make()
    buf = backend.new_pinned([4], "int64", "b")
    backend.copy_d2h(buf, paddle.arange(4, dtype="int64"), "copy")
    event = backend.record("copy")
    waits = {
        "event": lambda: backend.wait(event, "reader"),
        "stream_synchronize": lambda: backend.stream_synchronize("reader"),
        "read_after_copy": lambda: backend.to_host(buf, "reader"),
    }
    held = threading.Event()
    release = threading.Event()

    def stuck_producer():  # holds the backend lock and never lets go (until the test ends)
        with backend._lock:
            held.set()
            release.wait(30)

    producer = threading.Thread(target=stuck_producer, daemon=True)
    producer.start()
    held.wait(5)
    try:
        with bounded_waits(0.5):
            finished, exc = _run_bounded(waits[wait], limit=10)
    finally:
        release.set()
        producer.join(5)
    assert finished, f"{wait} on {backend.name} hung instead of failing fast"
    assert isinstance(exc, WaitTimeout), exc
    assert "0.5 s" in str(exc) and "hang" in str(exc)
