"""Issue 13 defect 2: ``disable()`` from another thread while decoding. A logprobs result handed out
before the guards are removed reaches FastDeploy's own (unguarded) save op afterwards: it must never
be read before its copy completed (the simulator poisons buffers until then)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.placement import host_view
from fd_async_copy_plugin.patches.runner import part

FD24 = ROOTS["fd24"]


def _saved(result) -> list:
    """What FastDeploy's save_output_topk reads from the three fields (host reads, no wait)."""
    return [np.array(host_view(field, "save_output_topk")) for field in result]


@pytest.fixture
def sampler_module(lpkit):
    module = lpkit.replica_module(FD24, "model_executor.layers.sample.sampler")
    lpkit.replica_module(FD24, "worker.gpu_model_runner")
    fd_async_copy_plugin.disable()
    yield module
    fd_async_copy_plugin.disable()


def test_results_handed_out_before_disable_read_correctly_after_it(logprob_inputs, sampler_module):
    original = sampler_module.Sampler.gather_logprobs
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=FD24)
    sampler = sampler_module.Sampler(fd_config=None)
    cases = [logprob_inputs(seed) for seed in range(2)]
    expected = [[np.array(f.numpy()) for f in original(sampler, lp.clone(), 4, tok)] for lp, tok in cases]
    held = [sampler.gather_logprobs(lp.clone(), 4, tok) for lp, tok in cases]  # a deferred save holds them
    assert all(type(r).__name__ != "LogprobsTensors" for r in held)  # the plugin's async results
    disabler = threading.Thread(target=fd_async_copy_plugin.disable)
    disabler.start()
    disabler.join(30)
    assert sampler_module.Sampler.gather_logprobs is original
    for result, want in zip(held, expected):
        for got, w in zip(_saved(result), want):
            assert np.array_equal(got, w), (got, w)


def test_a_gather_running_while_disable_restores_fd_hands_out_finished_data(logprob_inputs, sampler_module, monkeypatch):
    """The model loop is inside the plugin's gather_logprobs when another thread calls disable()."""
    inside, release = threading.Event(), threading.Event()
    real_count = sampler_module.batched_count_greater_than

    def slow_count(*args):
        inside.set()
        release.wait(30)
        return real_count(*args)

    monkeypatch.setattr(sampler_module, "batched_count_greater_than", slow_count)
    original = sampler_module.Sampler.gather_logprobs
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=FD24)
    sampler = sampler_module.Sampler(fd_config=None)
    logprobs, tokens = logprob_inputs(7)
    release.set()
    expected = [np.array(f.numpy()) for f in original(sampler, logprobs.clone(), 4, tokens)]
    release.clear()
    inside.clear()
    out: dict = {}
    loop = threading.Thread(target=lambda: out.setdefault("r", sampler.gather_logprobs(logprobs.clone(), 4, tokens)))
    loop.start()
    assert inside.wait(30)
    fd_async_copy_plugin.disable()  # while the model loop is mid-gather
    release.set()
    loop.join(30)
    for got, w in zip(_saved(out["r"]), expected):
        assert np.array_equal(got, w), (got, w)


def test_stop_flag_makes_every_flag_current_before_its_save_guards_go(sfkit, monkeypatch):
    """The stop flag's copy issued by the last update is finished (the legacy flag FastDeploy's own
    save reads is current) before disable() re-binds FastDeploy's save ops."""
    from fd_async_copy_plugin.testing.reference.driver import DriverConfig
    from fd_async_copy_plugin.registry import patch as patch_module

    fd_async_copy_plugin.disable()
    fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend="sim", root=sfkit.FD24)
    try:
        (runner,) = sfkit.build_runners([DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16, hidden_size=8)])
        state = part(runner, "stop")
        state.after_update(None)  # a step's flag copy in flight
        seen = []
        real_detach = patch_module.Junction.detach

        def checking_detach(junction, feature):  # a feature's link taken out of a junction
            if junction.name in ("save_output", "save_output_topk"):
                seen.append(state.flag_pending)
            real_detach(junction, feature)

        monkeypatch.setattr(patch_module.Junction, "detach", checking_detach)
        disabler = threading.Thread(target=fd_async_copy_plugin.disable)
        disabler.start()
        disabler.join(30)
        assert seen and not any(seen), seen
    finally:
        fd_async_copy_plugin.disable()
