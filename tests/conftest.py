"""Fixtures shared by every test folder."""

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend


@pytest.fixture(autouse=True, scope="session")
def _bounded_backend_waits():
    """Every copy-backend wait of the suite is bounded: a hang fails fast (testing/watchdog.py)."""
    from fd_async_copy_plugin.testing.watchdog import bounded_waits

    with bounded_waits():
        yield


@pytest.fixture
def sync_check_off():
    """The sync check off and its step and op hooks removed, before and after the test."""
    from fd_async_copy_plugin import sync_check

    sync_check.stop()
    sync_check.uninstall_step_hooks()
    yield
    sync_check.stop()
    sync_check.uninstall_step_hooks()


@pytest.fixture
def benchmark_script():
    """Loads ``benchmarks/<name>.py`` as a module (the scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


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


@pytest.fixture(scope="session")
def checkout_wheel(tmp_path_factory):
    """The wheel of this checkout, built once from a copy of its tracked files (links kept as links:
    ``fd_async_copy_plugin/patches``), so no build output is left in the checkout."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    names = subprocess.run(["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard"], capture_output=True,
                           text=True, check=True).stdout.split()
    for name in names:
        path, copy = repo / name, source / name
        if path.is_symlink() or path.is_file():
            copy.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink():
                os.symlink(os.readlink(path), copy)
            else:
                shutil.copy2(path, copy)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = root.glob("fd_async_copy_plugin-*.whl")
    return wheel
