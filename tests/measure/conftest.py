"""Fixtures for the measuring tools: the sync check starts and ends off, its hooks removed."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend


@pytest.fixture(autouse=True)
def _sync_check_off(sync_check_off):
    """Every test here starts and ends with the check off (``tests/conftest.py``)."""
    yield


@pytest.fixture
def host_backend():
    """The replica's copy backend is the synchronous host backend (``runtime.use`` is gone: the
    replica keeps its own current backend)."""
    previous = replica_backend.use(runtime.HostBackend())
    yield replica_backend.current()
    replica_backend.use(previous)
