"""Feature ``logprobs``: logprobs that are not float32 (issue 41).

FastDeploy's gather works on whatever dtype the model hands it: float64, or bf16/fp16 from a model
without the fp32 upcast. The plugin copied them into float32 pinned buffers and raised
``ValueError: copy_d2h: source dtype float64 differs ...`` out of the decode step (a request lost,
``status()`` still ``applied``). Now a float64 or float16 result gets pinned buffers of its own dtype
(the patched path, asserted), and a dtype with no pinned buffer (bfloat16: numpy has none) takes
FastDeploy's own blocking copies for that step, counted in ``status()``.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.sampling_math import log_softmax

SAMPLER = "model_executor.layers.sample.sampler"


def fastdeploys(original, sampler, *args):
    """FastDeploy's own gather, its copies landed (2.5's are non-blocking into pinned memory)."""
    from fd_async_copy_plugin.testing.reference import copy_backend

    out = original(sampler, *args)
    copy_backend.current().stream_synchronize("test")
    return out


def _inputs(dtype: str, rows: int = 5, vocab: int = 64):
    rng = np.random.default_rng(41)
    logits = paddle.to_tensor(rng.standard_normal((rows, vocab)).astype("float64"))
    logprobs = log_softmax(logits).astype(dtype)
    tokens = paddle.to_tensor(rng.integers(0, vocab, size=(rows, 1)), dtype="int64")
    return logprobs, tokens


@pytest.fixture(params=["fd24", "fd25"])
def patched_sampler(request, plugin_off, lpkit):
    if request.param == "fd25":
        lpkit.require_fd25_runner()
    root = ROOTS[request.param]
    lpkit.replica_module(root, "worker.gpu_model_runner")
    module = lpkit.replica_module(root, SAMPLER)
    sampler = module.Sampler(fd_config=None)
    original = module.Sampler.gather_logprobs
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=root)
    assert module.Sampler.gather_logprobs is not original
    yield sampler, original
    fd_async_copy_plugin.disable()


@pytest.mark.parametrize("dtype", ["float64", "float32"])  # CPU Paddle has no float16 clip
def test_logprobs_of_any_pinned_dtype_take_the_patched_path(patched_sampler, dtype, lpkit):
    sampler, original = patched_sampler
    logprobs, tokens = _inputs(dtype)
    expected = fastdeploys(original, sampler, logprobs.clone(), 3, tokens)
    with runtime.collecting() as census:
        census.begin_step()
        result = sampler.gather_logprobs(logprobs.clone(), 3, tokens)  # raised ValueError (float64)
        host = result.materialize("test")
    step = census.steps[0]
    assert step.count("async_d2h") == 3 and step.count("blocking_d2h") == 0  # the patched path ran
    for got, want in zip(host, expected):
        assert got.dtype == want.dtype and np.array_equal(got.numpy(), want.numpy())
    assert fd_async_copy_plugin.status()["features"]["logprobs"]["state"] == "applied"


def test_a_dtype_without_pinned_buffers_takes_fastdeploys_copies_counted(patched_sampler, monkeypatch):
    """bfloat16 has no pinned buffer (numpy has no such dtype) and CPU Paddle cannot gather it: the
    branch is driven with float64 taken off the pinned dtypes."""
    from fd_async_copy_plugin.patches import logprobs as logprobs_patch

    sampler, original = patched_sampler
    logprobs, tokens = _inputs("float32")
    sampler.gather_logprobs(logprobs.clone(), 3, tokens)  # one step on the patched path
    monkeypatch.setattr(logprobs_patch, "_PINNED_DTYPES", logprobs_patch._PINNED_DTYPES - {"float64"})
    wide = logprobs.astype("float64")
    expected = fastdeploys(original, sampler, wide.clone(), 3, tokens)
    with runtime.collecting() as census:
        census.begin_step()
        result = sampler.gather_logprobs(wide.clone(), 3, tokens)
    assert census.steps[0].count("blocking_d2h") == 3 and census.steps[0].count("async_d2h") == 0
    for got, want in zip(result, expected):
        assert got.dtype == want.dtype and np.array_equal(got.numpy(), want.numpy())
    entry = fd_async_copy_plugin.status()["features"]["logprobs"]
    assert entry["state"] == "partial" and "1 of 2 steps copied FastDeploy's blocking way: float64" in entry["reason"]
