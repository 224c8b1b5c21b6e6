"""Features ``stop_flag`` + ``sampled_tokens``: what a decode step makes the host wait for.

The sync census of the fd24 replica, per decode step that post-processed, on the paths the plugin
patches (``harness.on_patched_path``): unpatched 2.4 blocks at least twice (the flag copy inside
the update op, the token copy inside the save op / payload builder); with the plugin both are
gone, the step waits on exactly one event, before its first host read of copied data, and never
synchronizes the device or the stream.
"""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.testing.harness import first_read_after_wait, on_patched_path

pytestmark = pytest.mark.usefixtures("plugin_off")

PATHS = {
    "save_output": {},
    "zmq": dict(save_output_v1=True),
    "legacy-scheduler": dict(use_v1_scheduler=False, chunk_size=None, num_gpu_blocks=None),
}


def _post_processing_steps(run) -> list:
    """Steps whose post-processing ran the update op (2.4's or the plugin's)."""
    steps = [
        s for s in run.census.steps
        if any(site.startswith("update_inputs") or site == "not_need_stop" for _, site in s.events)
    ]
    assert len(steps) == run.result.executed_steps
    return steps


def _patched(step, kind) -> list:
    return [site for k, site in step.events if k == kind and on_patched_path(site)]


def _first_read_waits(step) -> bool:
    """The step's first host read on a patched path comes after a wait on that path."""
    result = first_read_after_wait(step, on_patched_path)
    if result is None:
        raise AssertionError(f"step {step.index} has no host read on a patched path")
    return result


@pytest.fixture(scope="module")
def runs(sfkit):
    """(unpatched, plugin host, plugin sim) per path; computed once for the module."""
    cache = {}

    def get(path):
        if path not in cache:
            config, requests, arrivals = sfkit.mixed(**PATHS[path])
            cache[path] = tuple(
                sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=features)
                for backend, features in (("host", None), ("host", sfkit.FEATURES), ("sim", sfkit.FEATURES))
            )
        return cache[path]

    return get


@pytest.mark.parametrize("path", PATHS)
def test_unpatched_2_4_blocks_in_the_update_op_and_the_save_op(runs, path):
    base = runs(path)[0]
    for step in _post_processing_steps(base):
        blocking = _patched(step, "blocking_d2h")
        assert len(blocking) >= 2, step.events
        assert any(s.startswith("update_inputs") for s in blocking)
        assert any(s.startswith(("save_output", "_build_stream_transfer_data")) for s in blocking)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", [1, 2], ids=["host", "sim"])
def test_plugin_removes_both_blocking_copies(runs, path, variant):
    run = runs(path)[variant]
    for step in _post_processing_steps(run):
        assert _patched(step, "blocking_d2h") == [], step.events
        assert sorted(_patched(step, "async_d2h")) == ["not_need_stop", "sampled_token_ids"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", [1, 2], ids=["host", "sim"])
def test_one_event_wait_per_step_before_the_first_host_read(runs, path, variant):
    run = runs(path)[variant]
    for step in _post_processing_steps(run):
        assert len(_patched(step, "event_wait")) == 1, step.events
        assert _first_read_waits(step), step.events
    # steps that did not post-process (idle worker loop) wait for nothing
    idle = [s for s in run.census.steps if s not in _post_processing_steps(run)]
    assert idle and all(s.count("event_wait") == 0 for s in idle)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", [1, 2], ids=["host", "sim"])
def test_no_device_or_stream_synchronize_and_no_op_on_pinned(runs, path, variant):
    run = runs(path)[variant]
    totals = run.census.totals([run.census.setup, *run.census.steps])
    assert totals["device_sync"] == 0 and totals["stream_sync"] == 0
    assert totals["op_on_pinned"] == 0
    # the pinned flag and token buffers are allocated once, with the runner
    assert sum(s.count("pinned_alloc") + s.count("pinned_free") for s in run.census.steps) == 0
    assert sorted(run.census.setup.sites("pinned_alloc")) == ["not_need_stop_pinned", "sampled_token_ids"]


def test_host_and_sim_count_the_same_interactions(runs):
    """The simulator models timing, not extra work: both backends record the same census."""
    for path in PATHS:
        _, host, sim = runs(path)
        assert [s.events for s in host.census.steps] == [s.events for s in sim.census.steps], path
