"""Fixtures for the measuring tools: the sync check starts and ends off, its hooks removed."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin import runtime, sync_check
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend


@pytest.fixture(autouse=True)
def sync_check_off():
    sync_check.stop()
    sync_check.uninstall_step_hooks()
    yield
    sync_check.stop()
    sync_check.uninstall_step_hooks()


@pytest.fixture
def host_backend():
    """The replica's copy backend is the synchronous host backend (``runtime.use`` is gone: the
    replica keeps its own current backend)."""
    previous = replica_backend.use(runtime.HostBackend())
    yield replica_backend.current()
    replica_backend.use(previous)
