"""Fixtures for the replica tests: which copy backend is current."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend


@pytest.fixture(autouse=True)
def host_backend():
    """Every replica test starts on the synchronous host backend."""
    previous = replica_backend.use(runtime.HostBackend())
    yield replica_backend.current()
    replica_backend.use(previous)


@pytest.fixture
def sim_backend(host_backend):
    previous = replica_backend.use(runtime.SimulatedBackend())
    yield replica_backend.current()
    replica_backend.use(previous)
