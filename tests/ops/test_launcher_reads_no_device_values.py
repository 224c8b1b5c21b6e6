"""The CUDA stop-flag launcher touches Paddle tensors through accessors only.

On a GPU, ``t.numel()`` is a kernel and ``int()`` of its result a blocking D2H; any other Paddle op
on a device tensor would queue work or sync too. This runs the launcher's whole argument path
(checks included) on CPU tensors standing in for GPU ones, records every call into Paddle with a
profiler hook, and allows only ``data_ptr``, ``is_contiguous`` and the dtype/shape/place getters.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.ops import load_ops, stop_flag_ops
from fd_async_copy_plugin.testing.slot_states import V0_ARRAYS, V1_ARRAYS, copy_batch, random_v0_batch, random_v1_batch
from fd_async_copy_plugin.ops.stop_flag_library import StopFlagLibrary
from fd_async_copy_plugin.ops.stop_flag_ops import StopFlagOps
from fd_async_copy_plugin.runtime.glue import paddle_glue

SOURCES = Path(__file__).resolve().parents[2] / "custom_ops"
ALLOWED = {"Tensor.data_ptr", "Tensor.is_contiguous", "monkey_patch_dtype.<locals>.dtype_str"}


@pytest.fixture
def launcher(tmp_path, monkeypatch):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found")
    out = tmp_path / "libfd_async_copy_host.so"
    subprocess.run(
        [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{SOURCES}", "-o", str(out), str(SOURCES / "stop_flag_host.cc")],
        check=True,
    )
    # Only the build flag, the device id and the stream are stood in: CPU tensors play GPU ones.
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(paddle_glue(), "gpu_device", lambda t: 0)
    monkeypatch.setattr(stop_flag_ops, "current_stream_handle", lambda device: None)
    monkeypatch.setattr(stop_flag_ops, "check_current_device", lambda device: None)
    return StopFlagOps(load_ops().module, StopFlagLibrary(out, flavor="host"), "")


def paddle_calls(fn) -> set[str]:
    seen = set()

    def hook(frame, event, arg):
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            if isinstance(owner, paddle.Tensor) or "paddle" in type(owner).__module__:
                seen.add(getattr(arg, "__qualname__", repr(arg)))
        elif event == "call" and "/paddle/" in frame.f_code.co_filename:
            seen.add(frame.f_code.co_qualname)

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_v1_launch_uses_accessors_only(launcher):
    batch = random_v1_batch(np.random.default_rng(3))
    t = {n: (None if v is None else paddle.to_tensor(v)) for n, v in copy_batch(batch).items() if n in V1_ARRAYS}
    calls = paddle_calls(lambda: launcher.update_inputs_v1_cuda(
        *(t[n] for n in V1_ARRAYS), batch["block_size"], batch["prefill_one_step_stop"]
    ))
    assert "Tensor.data_ptr" in calls  # the hook sees Paddle calls
    assert calls <= ALLOWED, sorted(calls - ALLOWED)


def test_v0_launch_uses_accessors_only(launcher):
    batch = random_v0_batch(np.random.default_rng(4))
    t = {n: (None if v is None else paddle.to_tensor(v)) for n, v in copy_batch(batch).items() if n in V0_ARRAYS}
    calls = paddle_calls(lambda: launcher.update_inputs_cuda(*(t[n] for n in V0_ARRAYS)))
    assert calls <= ALLOWED, sorted(calls - ALLOWED)


def test_the_hook_catches_numel():
    x = paddle.arange(4)
    assert "numel" in {c.rsplit(".", 1)[-1] for c in paddle_calls(lambda: int(x.numel()))}
