"""Issue 24: the logprobs producer issues a step's slot, copies and event through one
``PinnedRing.fill`` (each source's facts read once), and its outputs stay FastDeploy's."""

from __future__ import annotations

import numpy as np
import pytest

from fd_async_copy_plugin.runtime import PinnedRing
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend

from test_logprobs_ring_bounds import WIDTH, _host, _inputs, _patched

import fd_async_copy_plugin


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_each_step_is_one_fill_and_matches_fastdeploy(lpkit, monkeypatch, backend):
    calls = {"fill": 0, "acquire": 0, "copy_d2h_many": 0}
    fill, acquire, many = PinnedRing.fill, PinnedRing.acquire, RuntimeBackend.copy_d2h_many

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(PinnedRing, "fill", counting("fill", fill))
    monkeypatch.setattr(PinnedRing, "acquire", counting("acquire", acquire))
    sampler, original, copier = _patched(lpkit, backend)
    monkeypatch.setattr(type(copier.backend), "copy_d2h_many", counting("copy_d2h_many", many))
    try:
        for step in range(6):
            logprobs, tokens = _inputs(step)
            want = _host(original(sampler, logprobs.clone(), WIDTH, tokens))
            got = sampler.gather_logprobs(logprobs.clone(), WIDTH, tokens)
            assert isinstance(got, copier.AsyncLogprobsTensors)  # the plugin's path ran
            for g, w in zip(_host(got), want):
                assert np.array_equal(g, w)
        assert copier.async_steps == 6 and calls["fill"] == 6 and calls["acquire"] == 0
        # ``fill`` issues its copy set itself (``_issue``), on every backend: the simulator runs the same path
        assert calls["copy_d2h_many"] == 0
    finally:
        fd_async_copy_plugin.disable()
