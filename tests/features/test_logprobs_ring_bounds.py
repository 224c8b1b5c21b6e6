"""Issue 13 defect 7: the logprobs ring has a total byte cap (FD_ASYNC_COPY_RING_MAX_BYTES) beyond
which steps are copied FastDeploy 2.4's blocking way (counted), and it gives back the slots a lagging
consumer made it add once that consumer caught up."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.config import ENV_RING_MAX_BYTES, AsyncCopyConfig, ConfigError
from fd_async_copy_plugin.patches import logprobs as logprobs_patch
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.runtime.ring import IDLE_ACQUIRES

FD24 = ROOTS["fd24"]
VOCAB = 64
ROWS, WIDTH = 4, 5


def _patched(lpkit, backend: str):
    sampler_mod = lpkit.replica_module(FD24, "model_executor.layers.sample.sampler")
    lpkit.replica_module(FD24, "worker.gpu_model_runner")
    original = sampler_mod.Sampler.gather_logprobs
    fd_async_copy_plugin.disable()
    fd_async_copy_plugin.enable(features=["logprobs"], backend=backend, root=FD24)
    assert fd_async_copy_plugin.status()["features"]["logprobs"]["state"] == "applied"
    copier = fd_async_copy_plugin._get_manager().applied["logprobs"].ctx.state
    return sampler_mod.Sampler(fd_config=None), original, copier


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    logprobs = paddle.nn.functional.log_softmax(paddle.to_tensor(rng.standard_normal((ROWS, VOCAB)).astype("float32")), -1)
    return logprobs, paddle.to_tensor(rng.integers(0, VOCAB, size=(ROWS, 1)), dtype="int64")


def _host(result):
    fields = result.materialize() if hasattr(result, "materialize") else result
    return [np.array(f.numpy()) for f in fields]


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_a_lagging_consumer_cannot_grow_the_ring_past_its_cap(lpkit, monkeypatch, backend):
    monkeypatch.setenv(ENV_RING_MAX_BYTES, "6000")
    sampler, original, copier = _patched(lpkit, backend)
    try:
        held, expected = [], []
        for step in range(40):  # a consumer that reads nothing for 40 steps
            logprobs, tokens = _inputs(step)
            expected.append(_host(original(sampler, logprobs.clone(), WIDTH, tokens)))
            held.append(sampler.gather_logprobs(logprobs.clone(), WIDTH, tokens))
            assert copier.rings["decode"].nbytes <= 6000, copier.rings["decode"].nbytes
        assert copier.capped_steps > 0 and copier.rings["decode"].refused == copier.capped_steps
        capped = [r for r in held if not isinstance(r, copier.AsyncLogprobsTensors)]
        assert len(capped) == copier.capped_steps  # copied blocking: host-owned FastDeploy tensors
        for result, want in zip(held, expected):  # every step still exact, capped or not
            for got, w in zip(_host(result), want):
                assert np.array_equal(got, w)
        entry = fd_async_copy_plugin.status()["features"]["logprobs"]  # issue 25 item 7(c): counted
        assert entry["state"] == "partial" and f"{copier.capped_steps} of 40 steps copied" in entry["reason"], entry
    finally:
        fd_async_copy_plugin.disable()


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_a_cap_below_one_step_is_not_reported_applied(lpkit, monkeypatch, backend):
    """Issue 25 item 7(c): a ring cap below one step copies every step the blocking way; status()
    says so (``passthrough``, with the count), not ``applied``."""
    monkeypatch.setenv(ENV_RING_MAX_BYTES, "64")
    sampler, original, copier = _patched(lpkit, backend)
    try:
        for step in range(5):
            logprobs, tokens = _inputs(step)
            sampler.gather_logprobs(logprobs.clone(), WIDTH, tokens)
        entry = fd_async_copy_plugin.status()["features"]["logprobs"]
        assert copier.async_steps == 0 and copier.capped_steps == 5
        assert entry["state"] == "passthrough" and "5 of 5 steps copied" in entry["reason"], entry
    finally:
        fd_async_copy_plugin.disable()


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_idle_slots_are_released_after_the_consumer_catches_up(lpkit, backend):
    sampler, original, copier = _patched(lpkit, backend)
    try:
        logprobs, tokens = _inputs(0)
        first = sampler.gather_logprobs(logprobs.clone(), WIDTH, tokens)
        ring = copier.rings["decode"]
        base_slots, base_bytes = ring.size, ring.nbytes
        held = [first] + [sampler.gather_logprobs(logprobs.clone(), WIDTH, tokens) for _ in range(20)]
        assert ring.size == 21 and ring.nbytes > base_bytes
        for result in held:  # the consumer catches up: reads everything, drops it
            _host(result)
        del held, first, result
        last = None
        for _ in range(IDLE_ACQUIRES + 4):  # a healthy consumer: one step behind
            last = sampler.gather_logprobs(logprobs.clone(), WIDTH, tokens)
            _host(last)
        assert ring.size == base_slots, ring.size
        assert ring.nbytes == base_bytes and ring.released_slots == 19
    finally:
        fd_async_copy_plugin.disable()


def test_a_referenced_or_in_flight_slot_is_never_released():
    sim = runtime.SimulatedBackend()
    ring = runtime.PinnedRing(sim, "r", {"x": "int64"}, {"x": 4}, slots=1)
    kept = ring.acquire("w0", {"x": [4]}).buffers["x"]
    sim.copy_d2h(kept, paddle.arange(4, dtype="int64"), "w0")
    sim.record("w0")
    in_flight = ring.acquire("w1", {"x": [4]})  # grows: slot 0 is referenced
    sim.copy_d2h(in_flight.buffers["x"], paddle.arange(4, dtype="int64"), "w1")  # no wait yet
    del in_flight
    assert ring.size == 2
    assert ring.release_idle(min_idle=0) == 0  # slot 0 referenced, slot 1's copy in flight
    sim.stream_synchronize("test")
    assert ring.release_idle(min_idle=0) == 1 and ring.size == 1
    assert sim.to_host(kept, "reader").numpy().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("raw", ["0", "-5", "lots", "1.5G"])
def test_the_cap_variable_is_validated(raw):
    with pytest.raises(ConfigError, match=ENV_RING_MAX_BYTES):
        AsyncCopyConfig.from_env({ENV_RING_MAX_BYTES: raw})
    assert AsyncCopyConfig.from_env({ENV_RING_MAX_BYTES: "256M"}).ring_max_bytes == 256 << 20
    assert logprobs_patch.LogprobsCopier  # the feature reads the same variable


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("lag", [IDLE_ACQUIRES - 1, IDLE_ACQUIRES, 40])
def test_a_consumer_steps_behind_causes_no_pinned_churn_after_warm_up(lpkit, backend, lag):
    """Issue 25 item 8: a consumer 31+ steps behind made every step release the slot it had just
    freed (idle since its last use 31+ acquires ago) and allocate a new one: 3 pinned allocations
    and 3 frees per step (each free a hidden device sync on a GPU). Now a slot counts as idle from
    when it was first seen unreferenced: the ring keeps the slots the lag needs, allocating nothing."""
    from collections import deque

    sampler, original, copier = _patched(lpkit, backend)
    try:
        rt = copier.backend.rt
        logprobs, tokens = _inputs(0)
        want = _host(original(sampler, logprobs.clone(), WIDTH, tokens))
        pending = deque()
        counts = []
        for step in range(2 * lag + IDLE_ACQUIRES + 40):
            counts.append((rt.allocations, rt.frees))
            pending.append(sampler.gather_logprobs(logprobs.clone(), WIDTH, tokens))
            if len(pending) > lag:  # the consumer reads the result of `lag` steps ago
                oldest = pending.popleft()
                assert all(np.array_equal(g, w) for g, w in zip(_host(oldest), want))
                del oldest
        warm = counts[2 * lag + IDLE_ACQUIRES]
        assert counts[-1] == warm, f"pinned allocations/frees after warm-up: {counts[-1]} vs {warm}"
        assert copier.rings["decode"].size <= lag + 3 and copier.capped_steps == 0
    finally:
        fd_async_copy_plugin.disable()
