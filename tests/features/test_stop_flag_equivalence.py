"""Features ``stop_flag`` + ``sampled_tokens``: decoding is bit-identical to unpatched FastDeploy 2.4.

Every run below goes through the driver's decode loop on the fd24 replica, once unpatched (host
backend, the reference) and once with the plugin on backends ``host`` and ``sim``. Compared bit for
bit: generated tokens, stop reasons and steps, every saved message (token ids and the sign of
``not_need_stop``), every ZMQ payload, and the loop's own step counts (which depend on
``not_need_stop()`` each iteration). On ``sim`` the pinned flag and token copies hold poison until
their event is waited on, so a patched path that reads them too early differs or raises.

Each run also asserts that the plugin actually took the patched path (the flag copy is issued
asynchronously, the 2.4 blocking copy inside the update op is gone), so a silently skipped
feature cannot pass as "identical".
"""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request

pytestmark = pytest.mark.usefixtures("plugin_off")

BACKENDS = ("host", "sim")


def _assert_patched_path_taken(run, features=("stop_flag", "sampled_tokens")) -> None:
    assert {f: run.states.get(f) for f in features} == {f: "applied" for f in features}, run.states
    sites = [(kind, site) for step in [run.census.setup, *run.census.steps] for kind, site in step.events]
    assert ("async_d2h", "not_need_stop") in sites, "the flag copy was not issued by the plugin"
    assert not [s for k, s in sites if k == "blocking_d2h" and s.startswith("update_inputs")], (
        "the 2.4 update op (blocking flag copy) ran instead of the plugin's"
    )
    if "sampled_tokens" in features:
        assert ("async_d2h", "sampled_token_ids") in sites


def _check(sfkit, key, config, requests, arrivals=None, backend="host", features=None, max_steps=96):
    features = tuple(features or sfkit.FEATURES)
    base = sfkit.baseline(key, config, requests, arrivals=arrivals, max_steps=max_steps)
    run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=features,
                    max_steps=max_steps)
    run.result.assert_same(base.result)
    _assert_patched_path_taken(run, features)
    return base, run


# ---- the mixed scenario: every stop decision FastDeploy makes -------------------------------------


def _block_steps(sfkit, config, requests, arrivals):
    seen = []
    sfkit.run(config, requests, arrivals=arrivals,
              on_step=lambda step, runner: seen.append(bool(runner.share_inputs["is_block_step"].numpy().any())))
    return seen


def test_mixed_scenario_covers_every_stop_decision(sfkit):
    """Guards the scenario itself: if the tiny model changes, the run must still cover eos, a stop
    sequence, max_tokens (also =1), chunked prefill, block steps, mid-run insertion and idle steps."""
    config, requests, arrivals = sfkit.mixed()
    base = sfkit.baseline("mixed", config, requests, arrivals)
    out = base.result.outputs
    assert {o.stop_reason for o in out.values()} == {"eos", "stop", "length"}, {
        rid: (o.stop_reason, o.token_ids) for rid, o in out.items()
    }
    assert out["stop"].stop_reason == "stop" and out["eos"].stop_reason == "eos"
    assert out["one"].token_ids and len(out["one"].token_ids) == 1
    assert all(o.finished for o in out.values()) and not base.result.truncated
    assert base.result.executed_steps < base.result.steps, "no idle step between the two waves"
    assert any(_block_steps(sfkit, config, requests, arrivals)), "no block step happened"


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_scenario_is_bit_identical(sfkit, backend):
    config, requests, arrivals = sfkit.mixed()
    _check(sfkit, "mixed", config, requests, arrivals, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_flag_alone_is_bit_identical(sfkit, backend):
    """Without ``sampled_tokens`` the save op reads the device tokens itself (the 2.4 way) and
    the flag is still the plugin's."""
    config, requests, arrivals = sfkit.mixed()
    _check(sfkit, "mixed", config, requests, arrivals, backend=backend, features=("stop_flag",))


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_requests_finishing_ends_the_loop_in_the_same_step(sfkit, backend):
    """The step that finishes the last request saves ``not_need_stop`` False and the worker loop
    stops there; after the idle gap the late request restarts it (the flag goes True again)."""
    config, requests, arrivals = sfkit.mixed()
    base, run = _check(sfkit, "mixed", config, requests, arrivals, backend=backend)
    for result in (base.result, run.result):
        signs = [m.not_need_stop for m in result.messages]
        assert signs[-1] is False, signs
        assert True in signs[signs.index(False):], "the late request did not restart the loop"
        last = max(o.finish_step for o in result.outputs.values())
        assert result.steps == last + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_zmq_output_path_is_bit_identical(sfkit, backend):
    """FD_USE_GET_SAVE_OUTPUT_V1: the tokens reach the output thread through
    ``_build_stream_transfer_data`` instead of ``save_output``."""
    config, requests, arrivals = sfkit.mixed(save_output_v1=True)
    base, _ = _check(sfkit, "mixed-zmq", config, requests, arrivals, backend=backend)
    assert base.result.zmq_payloads and not base.result.messages


@pytest.mark.parametrize("backend", BACKENDS)
def test_legacy_scheduler_is_bit_identical(sfkit, backend):
    """ENABLE_V1_KVCACHE_SCHEDULER=0: ``insert_prefill_inputs`` and ``update_inputs``."""
    config, requests, arrivals = sfkit.mixed(use_v1_scheduler=False, chunk_size=None, num_gpu_blocks=None)
    base, run = _check(sfkit, "mixed-legacy", config, requests, arrivals, backend=backend)
    assert [s for step in run.census.steps for k, s in step.events if k == "async_d2h"]
    assert "stop" in {o.stop_reason for o in base.result.outputs.values()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_warmup_dummy_run_is_bit_identical(sfkit, backend):
    """``_dummy_run`` post-processes with ``skip_save_output=True`` through the plugin's update op
    before the first real step; the flag it leaves behind must not leak into serving."""
    config, requests, arrivals = sfkit.mixed(warmup=True)
    base, run = _check(sfkit, "mixed-warmup", config, requests, arrivals, backend=backend)
    assert ("async_d2h", "not_need_stop") in run.census.setup.events, "the warm-up did not use the plugin"
    assert not [e for e in base.census.setup.events if e[0] == "host_read" and e[1].startswith("save_output")]


# ---- batch sizes ---------------------------------------------------------------------------------


def _batch(n: int, max_tokens: int, **config):
    cfg = dict(max_num_seqs=n, vocab_size=64, max_model_len=16, hidden_size=8)
    cfg.update(config)
    requests = [
        Request(f"b{i}", [(7 * i + j) % 60 + 3 for j in range(2 + i % 3)],
                max_tokens=1 + (i % max_tokens), eos_token_ids=[2])
        for i in range(n)
    ]
    return DriverConfig(**cfg), requests


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_of_one_reuses_its_slot(sfkit, backend):
    config, _ = _batch(1, 1)
    eos = [2]
    first = Request("first", [5, 6, 7], max_tokens=6, eos_token_ids=eos)
    second = Request("second", [9, 4], max_tokens=4, eos_token_ids=eos)
    base, _ = _check(sfkit, "batch-1", config, [first], arrivals={2: [second]}, backend=backend)
    assert base.result.outputs["second"].slot == 0 and base.result.outputs["second"].finished


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, max_tokens", [(7, 6), (128, 4)])
def test_batches_are_bit_identical(sfkit, backend, n, max_tokens):
    config, requests = _batch(n, max_tokens)
    base, _ = _check(sfkit, f"batch-{n}", config, requests, backend=backend)
    assert len({o.finish_step for o in base.result.outputs.values()}) > 1  # staggered finishes


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_of_1024_is_bit_identical(sfkit, backend):
    """The kernels' one-block limit exactly. On the ZMQ path: ``save_output`` messages hold at most
    512 rows (FastDeploy's MAX_BSZ), for unpatched FastDeploy as well."""
    config, requests = _batch(1024, 2, save_output_v1=True)
    base, _ = _check(sfkit, "batch-1024", config, requests, backend=backend, max_steps=4)
    assert all(o.finished for o in base.result.outputs.values())
