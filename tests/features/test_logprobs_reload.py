"""Issue 13 defect 5: ``importlib.reload`` of a patched FastDeploy module re-binds FastDeploy's
originals. The plugin must not keep handing out in-flight buffers to a now unguarded consumer, and
status() must not say ``applied`` while its replacements are gone."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.placement import host_view

FD24 = ROOTS["fd24"]


@pytest.fixture
def modules(lpkit):
    sampler = lpkit.replica_module(FD24, "model_executor.layers.sample.sampler")
    lpkit.replica_module(FD24, "worker.gpu_model_runner")
    postproc = lpkit.replica_module(FD24, "model_executor.pre_and_post_process")
    fd_async_copy_plugin.disable()
    saved = {m: dict(vars(m)) for m in (sampler, postproc)}
    yield sampler, postproc
    fd_async_copy_plugin.disable()
    for module, namespace in saved.items():  # undo the reload: other tests use the original objects
        vars(module).clear()
        vars(module).update(namespace)


def _state() -> dict:
    return fd_async_copy_plugin.status()["features"]["logprobs"]


def test_reloading_the_consumer_module_stands_the_feature_down(logprob_inputs, modules):
    sampler_mod, postproc = modules
    original = sampler_mod.Sampler.gather_logprobs
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=FD24)
    sampler = sampler_mod.Sampler(fd_config=None)
    logprobs, tokens = logprob_inputs(1)
    expected = [np.array(f.numpy()) for f in original(sampler, logprobs.clone(), 4, tokens)]
    in_flight = sampler.gather_logprobs(logprobs.clone(), 4, tokens)
    assert _state()["state"] == "applied"
    importlib.reload(postproc)  # save_output_topk is FastDeploy's unguarded op again
    assert _state()["state"] != "applied", _state()
    after = sampler.gather_logprobs(logprobs.clone(), 4, tokens)
    assert type(after).__name__ == "LogprobsTensors"  # FastDeploy's own path, host data
    assert _state()["state"] == "passthrough" and "reloaded" in _state()["reason"], _state()
    for result in (in_flight, after):  # what the unguarded save reads is finished data
        for got, want in zip([np.array(host_view(f, "save_output_topk")) for f in result], expected):
            assert np.array_equal(got, want)
    fd_async_copy_plugin.disable()
    assert sampler_mod.Sampler.gather_logprobs is original


def test_reloading_the_producer_module_is_not_reported_applied(modules):
    sampler_mod, _ = modules
    fd_async_copy_plugin.enable(features=["logprobs"], backend="host", root=FD24)
    assert _state()["state"] == "applied"
    importlib.reload(sampler_mod)  # a new Sampler class, with FastDeploy's gather_logprobs
    state = _state()
    assert state["state"] == "failed" and "Sampler.gather_logprobs" in state["reason"], state


def test_a_save_op_that_is_not_compiled_is_no_reload(logprob_inputs, modules, monkeypatch):
    """FD's ops import resolves to None where its ops are not compiled (CPU, a source tree): nothing
    is installed on ``save_output_topk``, and that is not a reload - the async path keeps running
    (it used to stand ``logprobs`` down at the first gather, and selftest on real trees failed)."""
    sampler_mod, postproc = modules
    monkeypatch.setattr(postproc, "save_output_topk", None)
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=FD24)
    sampler = sampler_mod.Sampler(fd_config=None)
    logprobs, tokens = logprob_inputs(1)
    result = sampler.gather_logprobs(logprobs.clone(), 4, tokens)
    assert type(result).__name__ != "LogprobsTensors"  # the plugin's async tensors
    assert _state()["state"] == "applied", _state()

