"""Fixtures for the replica tests: which copy backend is current."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin import runtime


@pytest.fixture(autouse=True)
def host_backend():
    """Every replica test starts on the synchronous host backend."""
    previous = runtime.use(runtime.HostBackend())
    yield runtime.current()
    runtime.use(previous)


@pytest.fixture
def sim_backend(host_backend):
    previous = runtime.use(runtime.SimulatedBackend())
    yield runtime.current()
    runtime.use(previous)
