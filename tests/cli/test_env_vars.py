"""Every environment variable the plugin reads is listed by ``doctor`` and documented; the build
variables are checked before anything compiles."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from fd_async_copy_plugin.cli import doctor

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fd_async_copy_plugin"


def read_by_the_plugin() -> set[str]:
    """Every FD_ASYNC_COPY* name the shipped code spells out (tests, the replica and the A/B launcher's
    children aside: the launcher sets FD_ASYNC_COPY for the servers it starts)."""
    names = set()
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "patches").glob("*.py")]:
        if "testing" in path.parts:
            continue
        names |= set(re.findall(r"\bFD_ASYNC_COPY(?:_[A-Z]+)*\b", path.read_text()))
    return names


def test_doctor_lists_every_variable_the_plugin_reads():
    names = read_by_the_plugin()
    assert {"FD_ASYNC_COPY_CUDA_ARCHS", "FD_ASYNC_COPY_CUDART", "FD_ASYNC_COPY_OPS_DIR",
            "FD_ASYNC_COPY_TRACE", "FD_ASYNC_COPY_TRACE_STEPS"} <= names
    assert names - set(doctor.all_vars()) == set()
    report = doctor.diagnose(environ={})
    assert set(doctor.all_vars()) <= set(report["env"])


def test_every_variable_is_documented_in_the_features_page():
    page = (REPO / "docs" / "features.md").read_text()
    missing = [name for name in doctor.all_vars() if f"`{name}`" not in page]
    assert missing == []


def test_doctor_flags_a_bad_build_variable_and_names_a_typo(tmp_path):
    report = doctor.diagnose(environ={"FD_ASYNC_COPY_CUDA_ARCHS": "sm_90", "FD_ASYNC_COPY_CUDART": str(tmp_path / "no.so"),
                                      "FD_ASYNC_COPY_TRCE": "x"})
    assert len(report["env_errors"]) == 2
    assert report["env_errors"][0].startswith("FD_ASYNC_COPY_CUDA_ARCHS='sm_90': expected compute capabilities")
    assert "FD_ASYNC_COPY_CUDART=" in report["env_errors"][1] and "no such file" in report["env_errors"][1]
    assert report["env_unknown"] == ["FD_ASYNC_COPY_TRCE"]
    text = doctor.format_report(report)
    assert "CONFIG ERROR      FD_ASYNC_COPY_CUDA_ARCHS='sm_90'" in text and "a typo?" in text
    good = doctor.diagnose(environ={"FD_ASYNC_COPY_CUDA_ARCHS": "80;90", "FD_ASYNC_COPY_CUDART": "libcudart.so.12"})
    assert good["env_errors"] == [] and good["env_unknown"] == []


def test_doctor_exits_1_on_a_bad_build_variable():
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "FD_ASYNC_COPY_CUDA_ARCHS": "90a;"}
    done = subprocess.run([sys.executable, "-m", "fd_async_copy_plugin.cli", "doctor"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 1 and "FD_ASYNC_COPY_CUDA_ARCHS='90a;'" in done.stdout, done.stdout[-2000:]


def test_build_ops_refuses_a_bad_cuda_archs_before_compiling_anything(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "FD_ASYNC_COPY_CUDA_ARCHS": "sm_90",
           "FD_ASYNC_COPY_OPS_DIR": str(tmp_path / "ops")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fd_async_copy_plugin.cli", "build-ops", "--force"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [
        "fd-async-copy build-ops: error: FD_ASYNC_COPY_CUDA_ARCHS='sm_90': expected compute capabilities as numbers "
        "separated by ';', e.g. '80;90' (this GPU's: nvidia-smi --query-gpu=compute_cap); or unset it (default 80;90)"]
    assert not (tmp_path / "ops").exists() and time.perf_counter() - started < 30  # nothing compiled


def test_cuda_archs_are_checked_against_what_nvcc_lists(tmp_path):
    from fd_async_copy_plugin.ops.build import cuda_archs_problem

    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\nprintf 'compute_75\\ncompute_80\\ncompute_90\\n'\n")
    nvcc.chmod(0o755)
    assert cuda_archs_problem("80;90", str(nvcc)) == ""
    problem = cuda_archs_problem("80;61", str(nvcc))
    assert "does not support 61 (it supports 75, 80, 90)" in problem
    assert cuda_archs_problem(None, str(nvcc)) == ""
    assert cuda_archs_problem("80", str(tmp_path / "missing-nvcc")) == ""  # the query failed: the compiler says
