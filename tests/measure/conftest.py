"""Fixtures for the measuring tools: the sync check starts and ends off, its hooks removed."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin import runtime, sync_check


@pytest.fixture(autouse=True)
def sync_check_off():
    sync_check.stop()
    sync_check.uninstall_step_hooks()
    yield
    sync_check.stop()
    sync_check.uninstall_step_hooks()


@pytest.fixture
def host_backend():
    previous = runtime.use(runtime.HostBackend())
    yield runtime.current()
    runtime.use(previous)
