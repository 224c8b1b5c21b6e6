"""Issue 13 defects 4 and 10: a truncated or corrupted custom-ops library is refused (never loaded:
loading one kills the process), and ``build-ops`` on a read-only cache with an up-to-date build
succeeds without the lock."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from fd_async_copy_plugin.ops import cache, load_ops
from fd_async_copy_plugin.testing.reference import ROOTS

FILES = (cache.PYBIND_FILE, cache.CUDA_LIB_FILE)
REBUILD = "rebuild with `fd-async-copy build-ops`"


@pytest.fixture(scope="module")
def built():
    load_ops(build=True)
    return cache.ops_dir()


def _copy_built(built, target):
    for name in FILES:
        if (built / name).is_file():
            shutil.copy(built / name, target / name)
            shutil.copy(built / (name + ".build.json"), target / (name + ".build.json"))


def _damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 3]))
    else:  # same size, code and tables overwritten
        start = len(data) // 4
        data[start:start + len(data) // 2] = b"\xcc" * (len(data) // 2)
        path.write_bytes(bytes(data))


def _run(code: str, ops_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, cache.OPS_DIR_ENV: str(ops_dir)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def _assert_clean(done: subprocess.CompletedProcess) -> None:
    assert done.returncode >= 0, f"killed by {signal.Signals(-done.returncode).name}: {done.stderr[-2000:]}"
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
def test_a_damaged_library_is_refused_by_enable_and_doctor(built, tmp_path, how):
    _copy_built(built, tmp_path)
    for name in FILES:
        if (tmp_path / name).is_file():
            _damage(tmp_path / name, how)
    enable = (
        "import json, fd_async_copy_plugin as f\n"
        f"s = f.enable(features=['stop_flag'], backend='host', root={ROOTS['fd24']!r})\n"
        "import importlib; importlib.import_module(" + repr(ROOTS["fd24"] + ".worker.gpu_model_runner") + ")\n"
        "s = f.status()\n"
        "print(json.dumps({'feature': s['features']['stop_flag'], 'ops': s['ops']}))\n"
    )
    done = _run(enable, tmp_path)
    _assert_clean(done)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["feature"]["state"] == "skipped", report
    assert REBUILD in report["feature"]["reason"], report
    assert report["ops"]["loadable"] is not True and REBUILD in (report["ops"]["stale"] or ""), report["ops"]
    doctor = "import sys; from fd_async_copy_plugin.cli import main; main(['doctor', '--json']); sys.exit(0)"
    done = _run(doctor, tmp_path)
    _assert_clean(done)
    status = json.loads(done.stdout[done.stdout.index("{"):])
    ops = status["ops"]
    assert ops["loadable"] is False and REBUILD in ops["error"], ops
    if (tmp_path / cache.CUDA_LIB_FILE).is_file():
        assert REBUILD in ops["cuda_kernels"]["why"], ops["cuda_kernels"]


def test_an_intact_copy_still_loads(built, tmp_path):
    _copy_built(built, tmp_path)
    done = _run("from fd_async_copy_plugin.ops import load_ops; load_ops(); print('ok')", tmp_path)
    _assert_clean(done)
    assert done.stdout.strip().endswith("ok")


def test_build_ops_on_a_read_only_cache_with_a_current_build_succeeds(built, tmp_path, monkeypatch, capsys):
    import errno
    from contextlib import contextmanager

    from fd_async_copy_plugin.cli.build_ops import main_build_ops
    from fd_async_copy_plugin.ops import build

    _copy_built(built, tmp_path)
    monkeypatch.setenv(cache.OPS_DIR_ENV, str(tmp_path))

    @contextmanager
    def read_only_lock(directory, timeout=0):
        # What flock's lock file does on a read-only cache (tests run as root: chmod would not stop us).
        raise OSError(errno.EROFS, "Read-only file system", str(directory / ".build.lock"))
        yield

    monkeypatch.setattr(build, "build_lock", read_only_lock)
    assert main_build_ops(["--json"]) == 0, capsys.readouterr().out
    report = json.loads(capsys.readouterr().out)
    assert report["pybind"]["status"] == "up to date"
    assert report["cuda"]["status"] in ("up to date", "skipped")
    # Something to build: the lock is still taken (and fails here with the reason).
    (tmp_path / (cache.PYBIND_FILE + ".build.json")).unlink()
    assert main_build_ops(["--json", "--no-cuda"]) == 1
    assert "Read-only file system" in capsys.readouterr().out
