"""The raw-pointer launch path of the ``cuda`` backend, exercised on CPU.

``StopFlagOps.update_inputs_v1_cuda`` / ``update_inputs_cuda`` assemble addresses and scalars for
the CUDA library and launch on Paddle's stream; they cannot run without a GPU build of Paddle. The
host library has the same C signature minus the stream, so with it standing in for the CUDA library
(and the GPU-only checks neutralised) the exact argument assembly of the CUDA path runs here and
must agree with the pybind host op on random slot states. A swapped pointer or scalar fails this.
"""

from __future__ import annotations


import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.ops import load_ops, stop_flag_ops
from fd_async_copy_plugin.testing.slot_states import V0_ARRAYS, V1_ARRAYS, copy_batch, random_v0_batch, random_v1_batch
from fd_async_copy_plugin.ops.stop_flag_ops import StopFlagOps



@pytest.fixture(scope="module")
def host_library(host_stop_flag_library):
    return host_stop_flag_library


@pytest.fixture
def raw_path_ops(host_library, monkeypatch):
    monkeypatch.setattr(stop_flag_ops, "check_device_tensors", lambda tensors: 0)
    monkeypatch.setattr(stop_flag_ops, "current_stream_handle", lambda device: None)
    monkeypatch.setattr(stop_flag_ops, "check_current_device", lambda device: None)
    pybind = load_ops()
    return StopFlagOps(pybind.module, host_library, ""), pybind


def tensors_of(batch, names):
    return {n: (None if batch[n] is None else paddle.to_tensor(batch[n])) for n in names}


def test_v1_raw_pointer_path_matches_the_host_op(raw_path_ops):
    raw, pybind = raw_path_ops
    rng = np.random.default_rng(7)
    for _ in range(60):
        batch = random_v1_batch(rng)
        a, b = tensors_of(copy_batch(batch), V1_ARRAYS), tensors_of(copy_batch(batch), V1_ARRAYS)
        raw.update_inputs_v1_cuda(*(a[n] for n in V1_ARRAYS), batch["block_size"], batch["prefill_one_step_stop"])
        pybind.update_inputs_v1_host(*(b[n] for n in V1_ARRAYS), batch["block_size"], batch["prefill_one_step_stop"])
        for n in V1_ARRAYS:
            if a[n] is not None:
                np.testing.assert_array_equal(a[n].numpy(), b[n].numpy(), err_msg=n)


def test_v0_raw_pointer_path_matches_the_host_op(raw_path_ops):
    raw, pybind = raw_path_ops
    rng = np.random.default_rng(8)
    for _ in range(60):
        batch = random_v0_batch(rng)
        a, b = tensors_of(copy_batch(batch), V0_ARRAYS), tensors_of(copy_batch(batch), V0_ARRAYS)
        raw.update_inputs_cuda(*(a[n] for n in V0_ARRAYS))
        pybind.update_inputs_host(*(b[n] for n in V0_ARRAYS))
        for n in V0_ARRAYS:
            if a[n] is not None:
                np.testing.assert_array_equal(a[n].numpy(), b[n].numpy(), err_msg=n)


def test_launch_on_another_device_than_the_tensors_is_refused(monkeypatch):
    import paddle

    monkeypatch.setattr(paddle.device, "current_device", lambda: 1)
    with pytest.raises(ValueError, match=r"on gpu:0 but the current device is gpu:1"):
        stop_flag_ops.check_current_device(0)
    monkeypatch.setattr(paddle.device, "current_device", lambda: 0)
    stop_flag_ops.check_current_device(0)
