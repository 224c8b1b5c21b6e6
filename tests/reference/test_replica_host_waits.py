"""The replica's whole decode step against fd24-step-syncs.md, measured by device tracking.

Every blocking point of unpatched FastDeploy 2.4 (S1, S2, S3, T, S5, S6, S7; L1-3 with logprobs;
S6' with --enable-logprob when no request asks; I1 on DECODE-task steps) and of 2.5 (token_num
event twice, T, the save event; overlap: three) comes from its real mechanism at its call site
(a ``.cpu()``/``.numpy()`` of a device tensor, the host ``infer_seed`` passed to the sampling op),
not from a counter - so moving ``infer_seed`` to the device removes T.
"""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.testing.harness import VARIANTS, CENSUS_VARIANTS, run_variant, site_label, step_labels
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request
from fd_async_copy_plugin.testing.reference.device_tracking import decode_host_wait

pytestmark = pytest.mark.usefixtures("plugin_off")

PLAIN = DriverConfig(max_num_seqs=3, vocab_size=128, max_model_len=64, block_size=64)
REQUESTS = [Request(f"r{i}", [3 + i, 4, 5], max_tokens=6, eos_token_ids=[200]) for i in range(3)]
FD24_STEP = ["S1", "S2", "S3/S7", "T*", "S5*", "S6", "S3/S7"]


def tracked(name, config=PLAIN, requests=REQUESTS, **kw):
    return run_variant(CENSUS_VARIANTS[name], config, requests, max_steps=40, track=True, **kw)


def test_fd24_plain_decode_step_has_the_documented_seven_waits_in_order():
    run = tracked("fd24-unpatched")
    steps = step_labels(run)
    assert len(steps) == 5 and all(s == FD24_STEP for s in steps), steps
    waits = [decode_host_wait(site) for k, site in run.census.steps[2].events if k == "host_wait"]
    assert [w["mechanism"] for w in waits] == ["d2h", "d2h", "d2h", "h2d", "d2h", "d2h", "d2h"]
    assert waits[3]["what"] == "top_p_sampling(topp_seed=pageable host tensor)"
    assert waits[3]["where"].endswith("top_k_top_p_sampling")


def test_tracking_changes_no_output():
    plain = run_variant(VARIANTS["fd24-unpatched"], PLAIN, REQUESTS, max_steps=40)
    tracked_run = tracked("fd24-unpatched")
    tracked_run.result.assert_same(plain.result)


def test_fd24_with_logprobs_adds_the_three_blocking_copies():
    config = DriverConfig(max_num_seqs=3, vocab_size=128, max_model_len=64, block_size=64, enable_logprob=True)
    requests = [Request(f"r{i}", [3 + i, 4, 5], max_tokens=6, eos_token_ids=[200], logprobs=2) for i in range(3)]
    steps = step_labels(tracked("fd24-unpatched", config, requests))
    assert all(s == ["S1", "S2", "S3/S7", "T*", "L1-3*", "L1-3", "L1-3", "S5", "S6", "S3/S7"] for s in steps), steps


def test_fd24_enable_logprob_without_logprob_requests_copies_the_sampled_ids_twice():
    config = DriverConfig(max_num_seqs=3, vocab_size=128, max_model_len=64, block_size=64, enable_logprob=True)
    steps = step_labels(tracked("fd24-unpatched", config))
    assert all(s == ["S1", "S2", "S3/S7", "T*", "S5*", "S6", "S6", "S3/S7"] for s in steps), steps


def test_fd24_decode_task_steps_read_the_block_step_flag_once_per_task():
    config = DriverConfig(max_num_seqs=3, vocab_size=128, max_model_len=64, block_size=4)
    steps = step_labels(tracked("fd24-unpatched", config), skip=0)
    with_tasks = [s for s in steps if s[0] == "I1"]
    assert with_tasks and all(s == ["I1"] * 3 + FD24_STEP for s in with_tasks), steps
    assert all(s == FD24_STEP for s in steps[1:] if s[0] != "I1")


def test_t_is_the_host_infer_seed_moving_it_to_the_device_removes_exactly_t(monkeypatch):
    """#6765's fix, applied to the replica's share inputs: the sampling op no longer transforms."""
    from fd_async_copy_plugin.testing.reference.fd24.worker import gpu_model_runner as runner_module
    from fd_async_copy_plugin.testing.reference.placement import as_device

    original = runner_module.GPUModelRunner.__init__

    def seeds_on_device(self, *args, **kwargs):
        original(self, *args, **kwargs)
        # both: a device seed with a host increment would make ``add_`` transform instead
        as_device(self.share_inputs["infer_seed"])
        as_device(self.infer_seed_increment)

    monkeypatch.setattr(runner_module.GPUModelRunner, "__init__", seeds_on_device)
    steps = step_labels(tracked("fd24-unpatched"))
    assert all(s == ["S1", "S2", "S3/S7", "S5*", "S6", "S3/S7"] for s in steps), steps


@pytest.mark.parametrize("name, expected", [
    ("fd25-native", ["token_num", "token_num", "T*", "save event*"]),
    # the save waits on the previous step's event after this step's forward was launched: not long
    ("fd25-native-overlap", ["save event", "token_num", "T*"]),
    # develop: T gone (#6765); overlap off waits on the token count (:328) and the save (:2113); on
    # (its default), on the last step's save (:2129) and this step's token count (:2138)
    ("fddev-native", ["token_num", "save event*"]),
    ("fddev-native-overlap", ["save event", "token_num"]),
])
def test_fd25_waits_per_decode_step(name, expected):
    steps = step_labels(tracked(name), skip=2)
    assert steps and all(s == expected for s in steps[:-1]), steps


def test_every_host_wait_of_every_selftest_scenario_is_a_documented_blocking_point():
    """No host wait the document does not name, unpatched or with the plugin, on every path the
    selftest covers (save ops, ZMQ thread, legacy scheduler, 2.5 overlap, Keep-Sampling-Mask):
    a replica artifact (e.g. a host tensor made without a host place) would show up here."""
    import dataclasses

    from fd_async_copy_plugin.testing.harness import Variant, selftest_scenarios
    from fd_async_copy_plugin.testing.reference import ROOTS

    scenarios = selftest_scenarios(steps=8)
    ksm = dataclasses.replace(scenarios[0], config=dataclasses.replace(scenarios[0].config, keep_sampling_mask=True))
    unnamed = set()
    for sc in [*scenarios, ksm]:
        for plugin in (False, True):
            run = run_variant(Variant("v", ROOTS[sc.replica], plugin), sc.config, sc.requests,
                              arrivals=sc.arrivals, max_steps=200, track=True)
            for step in run.census.steps:
                for kind, site in step.events:
                    if kind == "host_wait" and not site_label(decode_host_wait(site)):
                        unnamed.add((sc.name, plugin, site))
    assert not unnamed, sorted(unnamed)
