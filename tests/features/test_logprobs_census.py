"""Feature ``logprobs``: what a decode step makes the host wait for, and the pinned ring's bound.

Census targets per decode step after warm-up (FastDeploy 2.4 with logprobs): no blocking D2H in
``gather_logprobs``, no device-wide synchronize, no pinned allocation or free, no Paddle op on a
pinned buffer, exactly one event wait, and the first host read of copied logprob data after it.

Ring bound: after warm-up the logprobs ring never adds a slot (two suffice) for every consumer
pattern: 2.4's same-step save, the ZMQ output path, and 2.5's overlap schedule where step N's
output is saved during step N+1 and still referenced when step N+1 gathers.
"""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.testing.harness import census_row, selftest_scenarios
from fd_async_copy_plugin.patches import logprobs as logprobs_patch
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig

FD24, FD25 = ROOTS["fd24"], ROOTS["fd25"]
VOCAB = 1024
ALL_HOST_FEATURES = ("logprobs", "stop_flag", "sampled_tokens")


def _steady_workload(zmq: bool, batch: int = 5, top_k: int = 5, steps: int = 8, lpkit=None):
    config = DriverConfig(max_num_seqs=batch, vocab_size=VOCAB, enable_logprob=True, save_output_v1=zmq)
    return config, lpkit.logprob_requests(batch, top_k, steps, VOCAB)


def _consumer_read(site: str, lpkit) -> bool:
    """A host read of copied data by a consumer (the reader names the consumers pass to the backend)."""
    return site in lpkit.LOGPROB_CONSUMER_SITES


def _gather_sites(step, kind: str) -> list:
    return [site for k, site in step.events if k == kind and "gather_logprobs" in site]


class _AsVariantRun:
    """``harness.census_row`` reads ``.census`` only."""

    def __init__(self, census) -> None:
        self.census = census


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("features", [("logprobs",), ALL_HOST_FEATURES], ids=["logprobs", "all"])
@pytest.mark.parametrize("zmq", [False, True], ids=["save_output_topk", "zmq"])
def test_census_targets_per_decode_step(zmq, features, backend, lpkit):
    config, requests = _steady_workload(zmq, lpkit=lpkit)
    run = lpkit.run_replica(FD24, config, requests, features=features, backend=backend)
    assert run.states["logprobs"] == "applied"
    steps = run.census.steps[1:]  # step 0 allocates the ring (warm-up)
    assert len(steps) >= 6
    for step in steps:
        assert _gather_sites(step, "blocking_d2h") == [], step.events
        assert len(_gather_sites(step, "async_d2h")) == 3
        assert step.count("device_sync") == 0
        assert step.count("pinned_alloc") == 0 and step.count("pinned_free") == 0
        assert step.count("op_on_pinned") == 0
        assert step.count("event_wait") == 1, step.sites("event_wait")
        kinds = [(kind, site) for kind, site in step.events]
        wait_at = next(i for i, (kind, _) in enumerate(kinds) if kind == "event_wait")
        reads = [i for i, (kind, site) in enumerate(kinds) if kind == "host_read" and _consumer_read(site, lpkit)]
        assert reads, "no host read of the copied logprobs"
        assert wait_at < reads[0], kinds
    row = census_row(_AsVariantRun(run.census), skip=1)
    assert row["first_read_after_wait"] is True
    assert row["pinned_alloc_after_warmup"] == 0
    assert row["op_on_pinned"] == 0 and row["device_sync"] == 0


def test_unpatched_2_4_blocks_three_times_per_step_in_gather_logprobs(lpkit):
    """The census tells the two apart: the target above is not met by FastDeploy 2.4 itself."""
    config, requests = _steady_workload(False, lpkit=lpkit)
    run = lpkit.run_replica(FD24, config, requests)
    for step in run.census.steps[1:]:
        assert len(_gather_sites(step, "blocking_d2h")) == 3
        assert step.count("event_wait") == 0


def test_native_2_5_allocates_pinned_buffers_every_step_the_plugin_does_not(fd25_logprobs, lpkit):
    config, requests = _steady_workload(False, lpkit=lpkit)
    native = lpkit.run_replica(FD25, config, requests)
    patched = lpkit.run_replica(FD25, config, requests, features=["logprobs"], backend="sim")
    patched.result.assert_same(native.result)
    assert all(step.count("pinned_alloc") == 3 for step in native.census.steps[1:-1])
    assert all(step.count("pinned_alloc") + step.count("pinned_free") == 0 for step in patched.census.steps[1:])
    assert sum(step.count("op_on_pinned") for step in patched.census.steps) == 0


def test_batch_growing_after_warmup_allocates_no_pinned_memory(lpkit):
    """The ring is sized for max_num_seqs rows at first use (FastDeploy's
    ``GuidedDecoding.max_num_seqs``), not for the first batch: arrivals never reallocate it."""
    config = DriverConfig(max_num_seqs=8, vocab_size=VOCAB, enable_logprob=True)
    first = lpkit.logprob_requests(1, 5, 6, VOCAB)
    later = {2: lpkit.logprob_requests(6, 5, 6, VOCAB, first=1)}
    run = lpkit.run_replica(FD24, config, first, features=["logprobs"], backend="sim", arrivals=later)
    assert run.states["logprobs"] == "applied"
    after_warmup = run.census.steps[1:]
    assert sum(s.count("pinned_alloc") + s.count("pinned_free") for s in after_warmup) == 0


# ---- the ring bound ------------------------------------------------------------------------------

def _assert_ring_bounded(run) -> None:
    assert run.states["logprobs"] == "applied"
    assert not run.result.truncated
    assert all(o.finished for o in run.result.outputs.values()), "the workload did not run to the end"
    ring = run.ring
    assert ring is not None, "the ring was never used"
    assert ring.grow_events == 0
    assert ring.size <= 2


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("zmq", [False, True], ids=["same_step_save", "zmq"])
def test_ring_never_grows_on_2_4(zmq, backend, lpkit):
    config, requests = _steady_workload(zmq, batch=7, top_k=20, steps=10, lpkit=lpkit)
    _assert_ring_bounded(lpkit.run_replica(FD24, config, requests, features=["logprobs"], backend=backend))


@pytest.mark.parametrize("which", [0, 1], ids=["save_ops_mixed", "zmq_prompt_logprobs"])
def test_ring_never_grows_on_2_4_mixed_workloads(which, lpkit):
    """Arrivals, block steps, eos, logprobs 0..20 and -1, chunked prompt logprobs."""
    scenario = [s for s in selftest_scenarios(steps=12) if s.replica == "fd24"][which]
    run = lpkit.run_replica(FD24, scenario.config, scenario.requests, features=["logprobs"], backend="sim",
                            arrivals=scenario.arrivals, max_steps=200)
    _assert_ring_bounded(run)


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("zmq", [False, True], ids=["save_output_topk", "zmq"])
def test_ring_never_grows_under_the_2_5_overlap_schedule(zmq, backend, fd25_logprobs, lpkit):
    # Whole prompts: a step whose requests are all mid-prefill ends with not_need_stop False, and
    # under the simulator native 2.5's overlap schedule then loses the next insert's set_stop(True).
    config = DriverConfig(max_num_seqs=6, vocab_size=VOCAB, enable_logprob=True, save_output_v1=zmq,
                          overlap=True)
    requests = lpkit.logprob_requests(6, 5, 10, VOCAB, prompt_len=10)
    _assert_ring_bounded(lpkit.run_replica(FD25, config, requests, features=["logprobs"], backend=backend))


def test_overlap_schedule_really_holds_the_previous_step_when_the_next_gathers(fd25_logprobs, monkeypatch, lpkit):
    """Why the ring has two slots: with one, the overlap schedule makes it grow (on the host
    backend the ring adds a slot rather than overwrite data still referenced)."""
    monkeypatch.setattr(logprobs_patch, "RING_SLOTS", 1)
    config = DriverConfig(max_num_seqs=4, vocab_size=VOCAB, enable_logprob=True, overlap=True)
    run = lpkit.run_replica(FD25, config, lpkit.logprob_requests(4, 5, 6, VOCAB), features=["logprobs"])
    assert run.ring.grow_events == 1 and run.ring.size == 2
