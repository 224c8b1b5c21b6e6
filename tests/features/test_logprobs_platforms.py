"""Feature ``logprobs``: only the CUDA ``Sampler`` is changed.

Non-CUDA platforms that share ``Sampler`` (XPU, Iluvatar, GCU, DCU, Metax) run the original code
path, blocking copies and all, and never touch the ring. The speculative and MTP samplers'
``gather_logprobs`` return device tensors and are left exactly as they are.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.sampling_math import log_softmax

FD24, FD25 = ROOTS["fd24"], ROOTS["fd25"]
SAMPLER = "model_executor.layers.sample.sampler"


def _inputs(rows: int = 4, vocab: int = 256):
    rng = np.random.default_rng(11)
    logprobs = log_softmax(paddle.to_tensor(rng.standard_normal((rows, vocab)).astype("float32")))
    tokens = paddle.to_tensor(rng.integers(0, vocab, size=(rows, 1)), dtype="int64")
    return logprobs, tokens


def _root(version: str, lpkit) -> str:
    if version == "fd25":
        lpkit.require_fd25_runner()
    lpkit.replica_module(ROOTS[version], "worker.gpu_model_runner")
    return ROOTS[version]


@pytest.mark.parametrize("version", ["fd24", "fd25"])
def test_non_cuda_platforms_run_the_original_gather_logprobs(version, plugin_off, monkeypatch, lpkit):
    root = _root(version, lpkit)
    sampler_mod = lpkit.replica_module(root, SAMPLER)
    sampler = sampler_mod.Sampler(fd_config=None)  # built while the platform is CUDA (it refuses others)
    original = sampler_mod.Sampler.gather_logprobs
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=root)
    assert fd_async_copy_plugin.status()["features"]["logprobs"]["state"] == "applied"
    assert sampler_mod.Sampler.gather_logprobs is not original

    monkeypatch.setattr(sampler_mod.current_platform, "is_cuda", lambda: False)
    logprobs, tokens = _inputs()
    expected = original(sampler, logprobs.clone(), 5, tokens)
    with runtime.collecting() as census:
        census.begin_step()
        result = sampler.gather_logprobs(logprobs.clone(), 5, tokens)
    step = census.steps[0]
    assert step.sites("blocking_d2h") == [
        "Sampler.gather_logprobs.logprob_token_ids",
        "Sampler.gather_logprobs.logprobs",
        "Sampler.gather_logprobs.selected_token_ranks",
    ]
    assert step.count("async_d2h") == 0 and step.count("pinned_alloc") == 0
    assert lpkit.logprobs_ring() is None  # the ring was never created
    assert type(result) is type(expected)  # FastDeploy's own LogprobsTensors, host tensors
    for got, want in zip(result, expected):
        assert np.array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("version", ["fd24", "fd25"])
def test_the_cuda_path_is_the_one_patched(version, plugin_off, lpkit):
    """Control for the test above: on CUDA the same call goes through the ring."""
    root = _root(version, lpkit)
    sampler_mod = lpkit.replica_module(root, SAMPLER)
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=root)
    logprobs, tokens = _inputs()
    with runtime.collecting() as census:
        census.begin_step()
        result = sampler_mod.Sampler(fd_config=None).gather_logprobs(logprobs, 5, tokens)
    assert census.steps[0].count("blocking_d2h") == 0 and census.steps[0].count("async_d2h") == 3
    assert lpkit.logprobs_ring() is not None
    del result


@pytest.mark.parametrize("version", ["fd24", "fd25"])
def test_speculative_and_mtp_samplers_are_untouched(version, plugin_off, lpkit):
    root = _root(version, lpkit)
    sampler_mod = lpkit.replica_module(root, SAMPLER)
    before = {
        name: getattr(sampler_mod, name).__dict__["gather_logprobs"]
        for name in ("Sampler", "SpeculativeSampler", "MTPSampler")
    }
    fd_async_copy_plugin.enable(features=["logprobs"], backend="host", root=root)
    assert fd_async_copy_plugin.status()["features"]["logprobs"]["state"] == "applied"
    assert sampler_mod.Sampler.__dict__["gather_logprobs"] is not before["Sampler"]
    assert sampler_mod.SpeculativeSampler.__dict__["gather_logprobs"] is before["SpeculativeSampler"]
    assert sampler_mod.MTPSampler.__dict__["gather_logprobs"] is before["MTPSampler"]
    fd_async_copy_plugin.disable()
    assert sampler_mod.Sampler.__dict__["gather_logprobs"] is before["Sampler"]
