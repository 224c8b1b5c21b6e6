"""Feature ``sampled_tokens``: the step's final tokens reach the save consumers through one pinned
buffer and the step's one event, never as a pinned tensor handed to a Paddle op.

``share_inputs["sampled_token_ids"]`` is a pinned [max_num_seqs, 1] int64 buffer allocated once
with the runner. Right after the update op the device tokens are copied into it (non-blocking);
``save_output`` / ``save_output_topk`` / ``_build_stream_transfer_data`` receive an owned pageable
copy read after the event. ``save_output_topk`` is a static Paddle op in 2.4: given the pinned
buffer itself, Paddle would move it to the GPU (the census counts that as ``op_on_pinned``).
"""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from fd_async_copy_plugin.testing.reference.driver import Request

pytestmark = pytest.mark.usefixtures("plugin_off")

BACKENDS = ("host", "sim")


def test_sampled_tokens_alone_is_skipped_and_fd_runs_unpatched(sfkit):
    config, requests, arrivals = sfkit.mixed()
    base = sfkit.baseline("mixed", config, requests, arrivals)
    run = sfkit.run(config, requests, arrivals=arrivals, features=("sampled_tokens",), backend="sim")
    assert run.states == {"sampled_tokens": "skipped"}
    assert "stop_flag" in run.reasons["sampled_tokens"]
    run.result.assert_same(base.result)
    assert [s.events for s in run.census.steps] == [s.events for s in base.census.steps]
    assert "sampled_token_ids" not in run.runner.share_inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", ["save_output", "zmq"])
def test_save_consumers_get_an_owned_host_copy_of_the_final_tokens(sfkit, monkeypatch, backend, path):
    """Spies sit where FastDeploy's ops are bound, under the plugin's guard: they see what the
    guard hands over."""
    overrides = {"save_output": {}, "zmq": dict(save_output_v1=True)}[path]
    name = {"save_output": "save_output", "zmq": "_build_stream_transfer_data"}[path]
    config, requests, arrivals = sfkit.mixed(**overrides)
    postproc = sfkit.postproc
    original = getattr(postproc, name)
    handed = []

    def spy(tokens, *args, **kwargs):
        handed.append((replica_backend.current().is_pinned(tokens), tokens.numpy().reshape(-1).tolist()))
        return original(tokens, *args, **kwargs)

    monkeypatch.setattr(postproc, name, spy)  # before enable(): the plugin's guard wraps the spy
    base = sfkit.run(config, requests, arrivals=arrivals)
    base_handed, handed[:] = list(handed), []
    run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=sfkit.FEATURES)
    run.result.assert_same(base.result)
    assert handed and [values for _, values in handed] == [values for _, values in base_handed]
    assert not any(pinned for pinned, _ in handed), "the pinned buffer reached the consumer"


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_output_topk_gets_no_pinned_tensor(sfkit, backend):
    """With logprobs (the ``logprobs`` feature off) the tokens go to ``save_output_topk``, a static
    Paddle op in 2.4: no Paddle op may touch the pinned buffer."""
    config, requests, arrivals = sfkit.mixed(enable_logprob=True)
    for i, r in enumerate(requests):
        r.logprobs = (0, 1, 5)[i % 3]
    base = sfkit.run(config, requests, arrivals=arrivals)
    run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=sfkit.FEATURES)
    run.result.assert_same(base.result)
    assert {m.kind for m in run.result.messages} == {"topk"}
    totals = run.census.totals([run.census.setup, *run.census.steps])
    assert totals["op_on_pinned"] == 0
    assert sum(s.sites("async_d2h").count("sampled_token_ids") for s in run.census.steps) == run.result.executed_steps


def test_pinned_buffer_is_allocated_once_and_reused_every_step(sfkit):
    config, _, _ = sfkit.mixed()
    requests = [Request(f"r{i}", [5 + i, 6], max_tokens=3, eos_token_ids=[sfkit.EOS_NEVER]) for i in range(3)]

    def probe(runner, record, event):
        if event == "execute":
            tokens = runner.share_inputs["sampled_token_ids"]
            record.append((tokens, tokens.data_ptr(), list(tokens.shape)))

    run = sfkit.run(config, requests, backend="sim", features=sfkit.FEATURES, probe=probe)
    assert len({(id(t), ptr) for t, ptr, _ in run.probe}) == 1, "the pinned buffer was replaced"
    assert run.probe[0][2] == [3, 1]  # Paddle's copy_ takes the source's shape: this step's batch
    assert sum(s.count("pinned_alloc") for s in run.census.steps) == 0
    assert run.census.setup.sites("pinned_alloc").count("sampled_token_ids") == 1
