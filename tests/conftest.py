"""Fixtures shared by every test folder."""

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend


@pytest.fixture(autouse=True, scope="session")
def _bounded_backend_waits():
    """Every copy-backend wait of the suite is bounded: a hang fails fast (testing/watchdog.py)."""
    from fd_async_copy_plugin.testing.watchdog import bounded_waits

    with bounded_waits():
        yield


@pytest.fixture
def plugin_off():
    """The plugin disabled and the default copy backend current, before and after the test."""
    fd_async_copy_plugin.disable()
    previous = replica_backend.use(None)
    yield
    fd_async_copy_plugin.disable()
    replica_backend.use(previous)


@pytest.fixture(scope="session")
def host_stop_flag_library(tmp_path_factory):
    """The stop-flag host library compiled with plain g++ from ``custom_ops/`` (no Paddle build)."""
    import shutil
    import subprocess
    from pathlib import Path

    from fd_async_copy_plugin.ops.stop_flag_library import StopFlagLibrary

    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found")
    sources = Path(__file__).resolve().parents[1] / "custom_ops"
    out = tmp_path_factory.mktemp("hostlib") / "libfd_async_copy_host.so"
    subprocess.run(
        [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{sources}", "-o", str(out), str(sources / "stop_flag_host.cc")],
        check=True,
    )
    return StopFlagLibrary(out, flavor="host")
