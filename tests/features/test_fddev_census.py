"""FastDeploy develop (2.6-dev): the replica's decode step, its census, and the plugin on it.

develop already has what ``step_syncs``, ``stop_flag``, ``flag_race`` and ``overlap`` do (the
registry's plan says ``native``: T gone by #6765/#6668, S1-S3/S7 and I1 by #6356, the overlap
schedule its default by #6668), so the plugin applies ``logprobs`` and ``sync_scope`` only and must
leave develop's census as it is: two host waits per plain decode step, overlap on or off. Every
comparison is bit for bit against the unpatched develop replica (tokens, logprobs, prompt
logprobs, stop decisions, saved messages, ZMQ payloads), on the ``host`` and ``sim`` backends, and
asserts that the plugin's path ran (its preallocated pinned logprob buffers: no per-step pinned
allocation; prompt logprobs without the device-wide synchronize), not a stand-down.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.testing.harness import CENSUS_VARIANTS, Variant, host_waits, run_variant, step_labels
from fd_async_copy_plugin.testing.reference import ROOTS
from test_step_syncs import config  # the same small model: vocabulary 256, 64 tokens, chunks of 8
from test_step_syncs_fd25 import workload  # seeded/greedy rows, chunked prefill, an arrival every step

pytestmark = pytest.mark.usefixtures("plugin_off")

FDDEV = ROOTS["fddev"]
#: what the plugin runs on develop: the registry's plan for profile fastdeploy-2.6+
APPLIED = {"logprobs", "sync_scope"}
NATIVE = {"stop_flag", "sampled_tokens", "step_syncs", "flag_race"}


def mod(name: str):
    return importlib.import_module(f"{FDDEV}.{name}")


# ---- the replica is develop-shaped ----------------------------------------------------------------

def test_detected_as_develop_and_shaped_like_it():
    from fd_async_copy_plugin.profile import detect_profile

    info = detect_profile(FDDEV)
    assert info.profile == "fastdeploy-2.6+" and info.version == "2.6.0-dev", info
    runner = mod("worker.gpu_model_runner").GPUModelRunner
    # #6356: no not_need_stop(); develop splits the step into _preprocess/_execute/_postprocess
    assert not hasattr(runner, "not_need_stop") and not hasattr(runner, "_preprocess_and_execute_model")
    for name in ("_preprocess", "_execute", "_postprocess", "_save_model_output",
                 "_resolve_current_launch_token_num", "_predict_next_launch_token_num"):
        assert hasattr(runner, name), name
    assert mod("config").SchedulerConfig().enable_overlap_schedule is True  # #6668: on by default


def test_the_plan_applies_logprobs_and_sync_scope_only():
    answer = fd_async_copy_plugin.plan(backend="host", root=FDDEV)
    assert answer["profile"] == "fastdeploy-2.6+", answer
    states = {name: f["state"] for name, f in answer["features"].items()}
    assert {n for n, s in states.items() if s == "apply"} == APPLIED, states
    assert {n for n, s in states.items() if s == "native"} >= NATIVE, states


# ---- the census ----------------------------------------------------------------------------------

PLAIN = dataclasses.replace(config(3), chunk_size=None, block_size=64)
REQUESTS = [workload(3)[0][i] for i in range(3)]


@pytest.mark.parametrize("name, expected", [
    # overlap off: the token count (:328, short: the GPU ran only recover_decode_task and the copies)
    # and the save event (:2113, long: it covers the whole step)
    ("fddev-native", ["token_num", "save event*"]),
    ("fddev-plugin", ["token_num", "save event*"]),
    # overlap on (develop's default): the previous step's save event (:2129) and this step's token
    # count (:2138); both events were recorded before forward N: nothing waits for the forward
    ("fddev-native-overlap", ["save event", "token_num"]),
    ("fddev-plugin-overlap", ["save event", "token_num"]),
])
def test_develop_waits_per_plain_decode_step(name, expected):
    run = run_variant(CENSUS_VARIANTS[name], PLAIN, REQUESTS, max_steps=60, track=True)
    steps = step_labels(run, skip=2)
    assert len(steps) > 4 and all(s == expected for s in steps[:-1]), steps
    waits = host_waits(run.census.steps)
    assert (waits["total"], waits["long"]) == (2, expected.count("save event*")), waits
    for site in waits["sites"]:  # the develop replica's own sites, event waits only
        assert site["mechanism"] == "event" and site["site"].startswith("reference/fddev/worker/"), site


def test_no_variant_of_develop_has_t_i1_or_a_host_flag_read():
    """develop's three removals, seen in the census: no T (device seed), no I1 (no is_block_step
    read on a DECODE task), no S5/stop-flag read (no not_need_stop()); DECODE tasks included."""
    small_blocks = dataclasses.replace(PLAIN, block_size=4)
    for name in ("fddev-native", "fddev-native-overlap", "fddev-plugin", "fddev-plugin-overlap"):
        run = run_variant(CENSUS_VARIANTS[name], small_blocks, REQUESTS, max_steps=80, track=True)
        labels = {label for step in step_labels(run, skip=0) for label in step}
        assert labels <= {"token_num", "save event", "save event*", "token_num*"}, (name, labels)


# ---- bit identity ---------------------------------------------------------------------------------

def run_pair(cfg, requests, arrivals, backend, max_steps=160):
    """The develop replica with the plugin, bit for bit against the unpatched develop replica."""
    base = run_variant(Variant("fddev-native", FDDEV, False), cfg, requests, backend=backend,
                       arrivals=arrivals, max_steps=max_steps)
    plugin = run_variant(Variant("fddev-plugin", FDDEV, True), cfg, requests, backend=backend,
                         arrivals=arrivals, max_steps=max_steps)
    states = {name: f["state"] for name, f in plugin.status["features"].items()}
    assert {n for n, s in states.items() if s == "applied"} == APPLIED, states
    assert plugin.final_status["profile"] == "fastdeploy-2.6+"
    assert not plugin.result.truncated and plugin.result.executed_steps > 5
    base.result.assert_same(plugin.result)
    return base, plugin


def pinned_allocs(run, prefix: str = "Sampler.gather_logprobs.") -> int:
    """Pinned allocations by develop's own ``gather_logprobs`` (three per call, :493-498); the
    plugin's ring allocates only when it grows (``logprobs.decode[...]``)."""
    return sum(site.startswith(prefix) for step in run.census.steps for kind, site in step.events
               if kind == "pinned_alloc")


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
@pytest.mark.parametrize("batch", [1, 7, 128])
def test_bit_identical_to_develop(backend, overlap, batch):
    requests, arrivals = workload(batch, logprobs=(None, 0, 5, -1))
    cfg = config(batch, overlap=overlap, enable_logprob=True)
    base, plugin = run_pair(cfg, requests, arrivals, backend)
    # the plugin's path ran: develop's gather_logprobs allocates three pinned buffers per step that
    # asks for logprobs; the plugin's preallocated ring none
    assert pinned_allocs(base) >= 3 * base.result.executed_steps // 2, pinned_allocs(base)
    assert pinned_allocs(plugin) == 0 and pinned_allocs(plugin, "logprobs.decode[") > 0
    assert any(o.logprobs for o in plugin.result.outputs.values())


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_zmq_path_with_prompt_logprobs_is_bit_identical_without_the_device_wide_sync(backend, overlap):
    """develop's V1 ZMQ path (the pinned sampled ids, pre_and_post_process.py:380-394), logprobs 0/5/-1
    and prompt logprobs over chunked prefill: sync_scope drops develop's ``paddle.device.synchronize()``
    (gpu_model_runner.py:3136) and the outputs stay bit-identical."""
    requests, arrivals = workload(7, logprobs=(0, 5, -1))
    requests = [dataclasses.replace(r, prompt_logprobs=(3 if i % 2 else -1)) for i, r in enumerate(requests)]
    cfg = config(7, overlap=overlap, enable_logprob=True, save_output_v1=True)
    base, plugin = run_pair(cfg, requests, arrivals, backend)
    assert sum(o.prompt_logprobs is not None for o in plugin.result.outputs.values()) == len(requests)
    syncs = [sum(step.count("device_sync") for step in run.census.steps) for run in (base, plugin)]
    assert syncs[0] > 0 and syncs[1] == 0, syncs
    assert pinned_allocs(base) > 0 and pinned_allocs(plugin) == 0


def test_plain_decode_without_logprobs_is_bit_identical_and_the_census_unchanged():
    requests, arrivals = workload(7)
    for overlap in (False, True):
        base, plugin = run_pair(config(7, overlap=overlap), requests, arrivals, "sim")
        assert [s.counts() for s in base.census.steps] == [s.counts() for s in plugin.census.steps]
