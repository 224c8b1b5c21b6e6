"""Building, loading and reporting the custom ops: status shape, actionable errors, staleness,
the build lock, nvcc-less machines, and the C entry points' status codes."""

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fd_async_copy_plugin.cli.build_ops import main_build_ops
from fd_async_copy_plugin.ops import OpsUnavailable, build, cache, load_ops, ops_status
from fd_async_copy_plugin.testing.slot_states import V1_ARRAYS, random_v1_batch
from fd_async_copy_plugin.ops.stop_flag_library import StopFlagLibrary


@pytest.fixture(scope="module")
def built():
    load_ops(build=True)
    return cache.ops_dir()


def test_status_shape_of_a_built_ops_dir(built):
    status = ops_status()
    json.dumps(status)  # JSON-serialisable
    assert set(status) >= {"ops_dir", "sources", "built", "stale", "loadable", "path", "error", "cuda_kernels"}
    assert status["built"] and status["loadable"] and status["stale"] is None and status["error"] is None
    assert status["path"].endswith("fd_async_copy_ops.so")
    assert set(status["cuda_kernels"]) == {"built", "loadable", "available", "path", "why"}
    assert status["cuda_kernels"]["why"]


def test_unbuilt_ops_dir_reports_and_raises_with_the_command_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.OPS_DIR_ENV, str(tmp_path))
    status = ops_status()
    assert status["built"] is False and status["loadable"] is False
    assert "fd-async-copy build-ops" in status["error"]
    with pytest.raises(OpsUnavailable, match="fd-async-copy build-ops"):
        load_ops()


def test_a_build_from_other_sources_is_stale(built, tmp_path, monkeypatch):
    for name in (cache.PYBIND_FILE, cache.PYBIND_FILE + ".build.json"):
        shutil.copy(built / name, tmp_path / name)
    manifest = json.loads((tmp_path / (cache.PYBIND_FILE + ".build.json")).read_text())
    manifest["fingerprint"]["sources_sha256"] = "0" * 64
    (tmp_path / (cache.PYBIND_FILE + ".build.json")).write_text(json.dumps(manifest))
    monkeypatch.setenv(cache.OPS_DIR_ENV, str(tmp_path))
    with pytest.raises(OpsUnavailable, match="stale"):
        load_ops()
    assert "stale" in ops_status()["stale"]


def test_status_never_raises(monkeypatch):
    def broken():
        raise RuntimeError("no cache dir")

    monkeypatch.setattr(cache, "ops_dir", broken)
    status = ops_status()
    assert "no cache dir" in status["error"] and status["loadable"] is False


def test_build_lock_excludes_other_processes(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, sys, time
            f = open({str(tmp_path / '.build.lock')!r}, 'a+')
            fcntl.flock(f, fcntl.LOCK_EX)
            print('locked', flush=True)
            time.sleep(30)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(build.BuildError, match="another build"):
            with build.build_lock(tmp_path, timeout=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()
    with build.build_lock(tmp_path, timeout=5):  # released when its holder died
        pass


def test_no_nvcc_skips_the_cuda_kernels_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "find_nvcc", lambda: (None, "nvcc not found: set CUDA_HOME"))
    result = build._build_cuda(cache.sources_dir(), tmp_path, verbose=False, force=False)
    assert result == {"status": "skipped", "reason": "nvcc not found: set CUDA_HOME"}
    assert not (tmp_path / cache.CUDA_LIB_FILE).exists()


def test_cuda_home_names_the_nvcc(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert build.find_nvcc() == (str(nvcc), "$CUDA_HOME")


def test_cuda_arch_list_is_validated(monkeypatch):
    assert build.cuda_arch_flags("90")[-1] == "arch=compute_90,code=compute_90"
    with pytest.raises(ValueError, match="FD_ASYNC_COPY_CUDA_ARCHS"):
        build.cuda_arch_flags("sm_90")


def test_concurrent_builds_publish_one_library(built, tmp_path):
    if build.find_nvcc()[0] is None:
        pytest.skip("needs nvcc")
    # A current pybind module, no CUDA library: both workers race to build the latter.
    for name in (cache.PYBIND_FILE, cache.PYBIND_FILE + ".build.json"):
        shutil.copy(built / name, tmp_path / name)
    code = "import json; from fd_async_copy_plugin.ops import build_ops; print(json.dumps(build_ops()))"
    env = {**__import__("os").environ, cache.OPS_DIR_ENV: str(tmp_path)}
    workers = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    reports = [json.loads(w.communicate(timeout=300)[0].strip().splitlines()[-1]) for w in workers]
    assert sorted(r["cuda"]["status"] for r in reports) == ["built", "up to date"]
    assert all(r["pybind"]["status"] == "up to date" for r in reports)
    assert not list(tmp_path.glob(".staging-*"))
    StopFlagLibrary(tmp_path / cache.CUDA_LIB_FILE, "cuda")  # loads


def c_args(batch, **overrides):
    """Addresses of numpy arrays for the C entry points."""
    def address(a):
        return None if a is None else a.ctypes.data

    arrays = [address(batch[n]) for n in V1_ARRAYS]
    shape = {
        "bsz": len(batch["seq_lens_this_time"]), "max_bsz": len(batch["stop_flags"]),
        "input_ids_stride": batch["input_ids"].shape[1], "block_tables_stride": batch["block_tables"].shape[1],
        "block_tables_numel": batch["block_tables"].size, "block_size": batch["block_size"],
        "prefill_one_step_stop": False,
    }
    shape.update(overrides)
    return arrays, shape


@pytest.mark.parametrize(
    "overrides, status, message",
    [
        ({"max_bsz": 1025}, 1, "exceeds 1024"),
        ({"bsz": 9}, 2, "bsz"),
        ({"block_size": 0}, 3, "block_size"),
        ({"input_ids_stride": 0}, 5, "stride"),
    ],
)
def test_c_entry_points_refuse_bad_arguments_with_a_status(built, overrides, status, message):
    batch = random_v1_batch(np.random.default_rng(0), max_bsz=8, bsz=8)
    arrays, shape = c_args(batch, **overrides)
    before = batch["seq_lens_decoder"].copy()
    libraries = [StopFlagLibrary(built / cache.PYBIND_FILE, "host")]
    if (built / cache.CUDA_LIB_FILE).exists():  # checks run before any launch: no GPU needed
        libraries.append(StopFlagLibrary(built / cache.CUDA_LIB_FILE, "cuda"))
    for lib in libraries:
        assert lib.update_inputs_v1(*arrays, **shape) == status, lib.flavor
        assert message in lib.message(status)
    np.testing.assert_array_equal(batch["seq_lens_decoder"], before)


def test_c_entry_points_refuse_null_slot_pointers(built):
    batch = random_v1_batch(np.random.default_rng(0), max_bsz=8, bsz=8)
    arrays, shape = c_args(batch)
    arrays[V1_ARRAYS.index("topk_ids")] = None
    lib = StopFlagLibrary(built / cache.PYBIND_FILE, "host")
    assert lib.update_inputs_v1(*arrays, **shape) == 4


def test_build_ops_command_reports_json(built, capsys):
    assert main_build_ops(["--json", "--no-cuda"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pybind"]["status"] == "up to date"
    assert report["status"]["loadable"] is True
