"""The real-steps check installs the sync check's step and op hooks (``check.counts``): every test
here starts and ends with the check off and its hooks removed."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin import sync_check


@pytest.fixture(autouse=True)
def sync_check_off():
    sync_check.stop()
    sync_check.uninstall_step_hooks()
    yield
    sync_check.stop()
    sync_check.uninstall_step_hooks()
