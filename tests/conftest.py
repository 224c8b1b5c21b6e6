"""Fixtures shared by every test folder."""

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime


@pytest.fixture
def plugin_off():
    """The plugin disabled and the default copy backend current, before and after the test."""
    fd_async_copy_plugin.disable()
    previous = runtime.use(None)
    yield
    fd_async_copy_plugin.disable()
    runtime.use(previous)
