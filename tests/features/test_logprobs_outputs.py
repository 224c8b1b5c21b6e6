"""Feature ``logprobs``: outputs bit-identical to unpatched FastDeploy.

Decode runs of the reference replica with the plugin are compared bit for bit with the unpatched
replica (host backend): tokens, the ``LogprobsTensors`` delivered through ``save_output_topk``
messages and through the ZMQ payloads, prompt logprobs across chunked prefill. The ``sim``
backend leaves poison in every pinned buffer until the covering event is waited on, so a patched
run that reads too early differs (or raises) there.

Direct checks: ``Sampler.gather_logprobs`` patched vs original on the same inputs, and the
returned object's ``slice_rows`` / ``tolists`` / pickling.
"""

from __future__ import annotations

import pickle

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from fd_async_copy_plugin.testing.harness import selftest_scenarios
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request
from fd_async_copy_plugin.testing.reference.sampling_math import log_softmax

FD24, FD25 = ROOTS["fd24"], ROOTS["fd25"]
VOCAB = 1024
BACKENDS = ("host", "sim")


def _config(batch: int, steps: int, **kw) -> DriverConfig:
    return DriverConfig(max_num_seqs=batch, vocab_size=VOCAB, enable_logprob=True,
                        max_model_len=max(64, steps + 24), **kw)


def assert_same_as_unpatched(run, base, asked_logprobs: bool = True) -> None:
    assert run.states.get("logprobs") == "applied", run.states
    run.result.assert_same(base.result)
    assert not run.result.truncated
    assert all(o.finished for o in run.result.outputs.values()), "the workload did not run to the end"
    if asked_logprobs:
        outputs = [o for o in run.result.outputs.values() if o.token_ids]
        assert outputs, "the workload produced no tokens"
        # Not vacuous: every generated token came with its logprobs.
        assert all(len(o.logprobs) == len(o.token_ids) for o in outputs)


def _patched_path_ran(run) -> bool:
    sites = [site for step in run.census.steps for kind, site in step.events if kind == "async_d2h"]
    return any(site.startswith("gather_logprobs.") for site in sites)


# ---- end-to-end: save_output_topk messages ---------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("top_k", [0, 1, 5, 20])
@pytest.mark.parametrize("batch", [1, 7, 128])
def test_save_output_topk_messages_are_bit_identical(batch, top_k, backend, unpatched_run, lpkit):
    steps = 3 if batch == 128 else 6
    config = _config(batch, steps)
    requests = lpkit.logprob_requests(batch, top_k, steps, VOCAB)
    base = unpatched_run(("topk", batch, top_k), FD24, config, requests)
    run = lpkit.run_replica(FD24, config, requests, features=["logprobs"], backend=backend)
    assert _patched_path_ran(run)
    assert_same_as_unpatched(run, base)
    assert any(m.kind == "topk" for m in run.result.messages)


# ---- end-to-end: ZMQ payloads (FD_USE_GET_SAVE_OUTPUT_V1) ------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("top_k", [-1, 5])
@pytest.mark.parametrize("batch", [1, 7, 128])
def test_zmq_payloads_are_bit_identical(batch, top_k, backend, unpatched_run, lpkit):
    steps = 2 if batch == 128 else 5
    config = _config(batch, steps, save_output_v1=True)
    requests = lpkit.logprob_requests(batch, top_k, steps, VOCAB)
    base = unpatched_run(("zmq", batch, top_k), FD24, config, requests)
    run = lpkit.run_replica(FD24, config, requests, features=["logprobs"], backend=backend)
    assert _patched_path_ran(run)
    assert_same_as_unpatched(run, base)
    payload_rows = [row for payload in run.result.zmq_payloads for row in payload if row["logprobs"] is not None]
    assert payload_rows
    if top_k == -1:  # the whole vocabulary (plus the sampled token) per row
        assert payload_rows[0]["logprobs"]["token_ids"].shape == (1, VOCAB + 1)


def _prompt_logprob_requests():
    spec = [(0, 13, 0, -1), (1, 9, 3, 5), (2, 17, -1, 0), (3, 6, 20, None), (4, 11, None, 2)]
    requests = []
    for i, prompt_len, prompt_k, k in spec:
        prompt = [(13 * i + 5 * j) % (VOCAB - 3) + 3 for j in range(prompt_len)]
        requests.append(Request(f"p{i}", prompt, max_tokens=4, eos_token_ids=[VOCAB + 1],
                                logprobs=k, prompt_logprobs=prompt_k))
    return requests


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompt_logprobs_across_chunked_prefill_are_bit_identical(backend, unpatched_run, lpkit):
    config = _config(6, 4, save_output_v1=True, chunk_size=4)
    requests = _prompt_logprob_requests()
    arrivals = {2: [Request("late", [5, 9, 14, 3, 8, 21, 7], max_tokens=3, eos_token_ids=[VOCAB + 1],
                            logprobs=1, prompt_logprobs=4)]}
    base = unpatched_run("prompt-chunked", FD24, config, requests, arrivals=arrivals)
    run = lpkit.run_replica(FD24, config, requests, features=["logprobs"], backend=backend, arrivals=arrivals)
    assert_same_as_unpatched(run, base, asked_logprobs=False)
    with_prompt = [o for o in run.result.outputs.values() if o.prompt_logprobs is not None]
    assert len(with_prompt) == 5  # every request that asked, chunked over several steps
    long_prompt = run.result.outputs["p2"].prompt_logprobs
    assert long_prompt["token_ids"].shape == (16, VOCAB + 1)  # prompt_logprobs=-1, 17 tokens


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", [0, 1])
def test_selftest_scenarios_are_bit_identical(which, backend, unpatched_run, lpkit):
    """Mixed widths, eos and stop sequences, max_tokens=1, block steps, arrivals, both paths."""
    scenario = [s for s in selftest_scenarios(steps=12) if s.replica == "fd24"][which]
    base = unpatched_run(("selftest", which), FD24, scenario.config, scenario.requests, arrivals=scenario.arrivals,
                         max_steps=200)
    run = lpkit.run_replica(FD24, scenario.config, scenario.requests, features=["logprobs"], backend=backend,
                            arrivals=scenario.arrivals, max_steps=200)
    assert_same_as_unpatched(run, base, asked_logprobs=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("zmq", [False, True])
def test_keep_sampling_mask_renormalisation_is_bit_identical(zmq, backend, unpatched_run, lpkit):
    """2.4's Keep-Sampling-Mask renormalises the logprobs with Paddle ops before the save."""
    config = _config(4, 5, save_output_v1=zmq, keep_sampling_mask=True)
    requests = lpkit.logprob_requests(4, 5, 5, VOCAB, top_p=0.9)
    base = unpatched_run(("ksm", zmq), FD24, config, requests)
    run = lpkit.run_replica(FD24, config, requests, features=["logprobs"], backend=backend)
    assert_same_as_unpatched(run, base)
    if zmq:
        assert any(row["sampling_mask"] is not None for payload in run.result.zmq_payloads for row in payload)
    else:
        assert run.result.sampling_masks
    # The renormalisation got host-owned tensors read after the copy event.
    assert any(site == "ksm_renormalize" for step in run.census.steps for _, site in step.events)
    assert sum(s.count("op_on_pinned") for s in run.census.steps) == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("zmq", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
def test_fd25_outputs_are_bit_identical(overlap, zmq, backend, fd25_logprobs, unpatched_run, lpkit):
    """2.5 (native per-step pinned buffers) vs the plugin's ring, with and without the overlap
    schedule (the save of step N runs one step late), chunked prompt logprobs, logprobs -1..20."""
    scenario = [s for s in selftest_scenarios(steps=10) if s.replica == "fd25"][0]
    config = DriverConfig(**{**scenario.config.__dict__, "overlap": overlap, "save_output_v1": zmq})
    base = unpatched_run(("fd25", overlap, zmq), FD25, config, scenario.requests, max_steps=200)
    run = lpkit.run_replica(FD25, config, scenario.requests, features=["logprobs"], backend=backend, max_steps=200)
    assert _patched_path_ran(run)
    assert_same_as_unpatched(run, base, asked_logprobs=False)
    assert any(o.logprobs for o in run.result.outputs.values())


def test_logprobs_applies_to_the_fd25_replica(plugin_off, lpkit):
    """The compatibility check accepts FastDeploy 2.5's gather_logprobs (maths spelled out)."""
    lpkit.require_fd25_runner()
    assert lpkit.fd25_check_problem("logprobs") is None
    fd_async_copy_plugin.enable(features=["logprobs"], backend="host", root=FD25)
    assert fd_async_copy_plugin.status()["features"]["logprobs"]["state"] == "applied"


# ---- direct: Sampler.gather_logprobs ---------------------------------------------------------

def _inputs(rows: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    logits = paddle.to_tensor(rng.standard_normal((rows, vocab)).astype("float32") * 3)
    logprobs = log_softmax(logits)
    # A -inf entry exercises the clip to finfo.min.
    logprobs[0, 3] = float("-inf")
    tokens = paddle.to_tensor(rng.integers(0, vocab, size=(rows, 1)), dtype="int64")
    return logprobs, tokens


def _host_fields(tensors) -> list:
    return [np.asarray(t.numpy()) for t in tensors]


def _bits(arrays) -> list:
    return [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]


@pytest.fixture(params=BACKENDS)
def patched_sampler(request, plugin_off, lpkit):
    """(Sampler, original gather_logprobs, backend) with ``logprobs`` applied to fd24."""
    sampler_mod = lpkit.replica_module(FD24, "model_executor.layers.sample.sampler")
    lpkit.replica_module(FD24, "worker.gpu_model_runner")
    original = sampler_mod.Sampler.gather_logprobs
    fd_async_copy_plugin.enable(features=["logprobs"], backend=request.param, root=FD24)
    assert fd_async_copy_plugin.status()["features"]["logprobs"]["state"] == "applied"
    assert sampler_mod.Sampler.gather_logprobs is not original
    yield sampler_mod.Sampler(fd_config=None), original, replica_backend.current()
    fd_async_copy_plugin.disable()
    assert sampler_mod.Sampler.gather_logprobs is original


@pytest.mark.parametrize("num_logprobs", [0, 1, 5, 20, VOCAB])
@pytest.mark.parametrize("token_shape", ["column", "flat"])
def test_gather_logprobs_matches_the_original_bit_for_bit(patched_sampler, num_logprobs, token_shape):
    sampler, original, backend = patched_sampler
    logprobs, tokens = _inputs(7, VOCAB, seed=num_logprobs)
    if token_shape == "flat":  # prompt logprobs pass a 1-D token tensor
        tokens = tokens.reshape([-1])
    expected = original(sampler, logprobs.clone(), num_logprobs, tokens)
    result = sampler.gather_logprobs(logprobs.clone(), num_logprobs, tokens)
    assert type(result) is not type(expected)  # the async subclass
    assert isinstance(result, type(expected))
    assert all(backend.is_pinned(field) for field in result)
    host = result.materialize()
    assert type(host) is type(expected)
    assert _bits(_host_fields(host)) == _bits(_host_fields(expected))
    assert host.logprob_token_ids.shape == [7, num_logprobs + 1 if num_logprobs >= 1 else 1]


def test_slice_rows_tolists_and_pickling_of_the_returned_object(patched_sampler):
    sampler, original, backend = patched_sampler
    logprobs, tokens = _inputs(9, VOCAB, seed=1)
    expected = original(sampler, logprobs.clone(), 5, tokens)
    result = sampler.gather_logprobs(logprobs.clone(), 5, tokens)

    for start, end in [(0, 1), (3, 4), (2, 7), (8, 9), (0, 9)]:
        part = result.slice_rows(start, end)
        assert type(part) is type(expected)
        assert not any(backend.is_pinned(field) for field in part)
        assert _bits(_host_fields(part)) == _bits(_host_fields(expected.slice_rows(start, end)))

    lists = result.tolists()
    assert lists == expected.tolists()
    assert type(lists) is type(expected.tolists())

    restored = pickle.loads(pickle.dumps(result))
    assert type(restored) is type(expected)  # FastDeploy's own class: loadable without the plugin
    assert _bits(_host_fields(restored)) == _bits(_host_fields(expected))


def test_simulated_copies_are_really_pending_until_a_consumer_waits(plugin_off, lpkit):
    """The sim backend makes the checks above meaningful: before a consumer waits, the pinned
    fields hold poison and a host read raises."""
    sampler_mod = lpkit.replica_module(FD24, "model_executor.layers.sample.sampler")
    lpkit.replica_module(FD24, "worker.gpu_model_runner")
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=FD24)
    sim = replica_backend.current()
    logprobs, tokens = _inputs(3, VOCAB, seed=2)
    result = sampler_mod.Sampler(fd_config=None).gather_logprobs(logprobs, 5, tokens)
    assert np.isnan(result.logprobs.numpy()).all()
    with pytest.raises(runtime.PendingCopyError, match="gather_logprobs"):
        sim.read(result.logprobs, "too early")
    assert not np.isnan(result.slice_rows(0, 3).logprobs.numpy()).any()


@pytest.mark.parametrize("num_logprobs", [0, 5])
def test_fd25_gather_logprobs_matches_native_2_5(num_logprobs, plugin_off, fd25_logprobs, lpkit):
    """On 2.5 the original returns per-step pinned buffers; the values must not change."""
    sampler_mod = lpkit.replica_module(FD25, "model_executor.layers.sample.sampler")
    original = sampler_mod.Sampler.gather_logprobs
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=FD25)
    assert fd_async_copy_plugin.status()["features"]["logprobs"]["state"] == "applied"
    backend = replica_backend.current()
    sampler = sampler_mod.Sampler(fd_config=None)
    logprobs, tokens = _inputs(5, VOCAB, seed=3)
    expected = original(sampler, logprobs.clone(), num_logprobs, tokens)
    backend.wait(backend.record("test"), "test")  # 2.5's caller waits on post_process_event
    expected = [backend.to_host(f, "test").numpy() for f in expected]
    result = sampler.gather_logprobs(logprobs.clone(), num_logprobs, tokens)
    assert _bits(_host_fields(result.materialize())) == _bits(expected)
