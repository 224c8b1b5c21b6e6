"""Feature ``stop_flag``: FastDeploy 2.4's keys keep working and cannot corrupt the plugin's state.

``share_inputs["not_need_stop"]`` stays 2.4's pageable host flag: code outside ``post_process``
reads it with ``[0]``, ``bool()`` or ``.numpy()`` and must see what unpatched 2.4 shows at the same
points (after an insertion, after a step's post-processing). The plugin's own keys
(``not_need_stop_device`` with its alias ``not_need_stop_gpu``, ``not_need_stop_pinned``, the pinned
``sampled_token_ids``) and ``reset_share_inputs()`` must leave every copy of the flag consistent
without a Paddle op on a pinned buffer (on a GPU build Paddle would move the buffer to the GPU).
"""

from __future__ import annotations

import paddle
import pytest

from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend

pytestmark = pytest.mark.usefixtures("plugin_off")

BACKENDS = ("host", "sim")


class _Abort(Exception):
    """Ends a run from ``on_step`` once the test has what it needs."""


def _legacy_probe(sfkit):
    def probe(runner, record, event):
        reads = sfkit.legacy_reads(runner.share_inputs)
        record.append((event, reads))

    return probe


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", ["v1", "v1-zmq", "v1-warmup", "legacy"])
def test_legacy_flag_reads_like_2_4_after_insertion_and_after_post_process(sfkit, backend, path):
    """On the ZMQ path no save op reads the flag: only the post_process wrapper refreshes it."""
    overrides = {
        "v1": {},
        "v1-zmq": dict(save_output_v1=True),
        "v1-warmup": dict(warmup=True),
        "legacy": dict(use_v1_scheduler=False, chunk_size=None, num_gpu_blocks=None),
    }[path]
    config, requests, arrivals = sfkit.mixed(**overrides)
    probe = _legacy_probe(sfkit)
    base = sfkit.run(config, requests, arrivals=arrivals, probe=probe)
    run = sfkit.run(config, requests, arrivals=arrivals, probe=probe, backend=backend, features=sfkit.FEATURES)
    assert run.states == {"stop_flag": "applied", "sampled_tokens": "applied"}
    assert run.probe == base.probe
    # the three 2.4 readings agree, and the run saw the flag both ways at both read points
    assert all(len(set(reads)) == 1 for _, reads in run.probe)
    seen = {(event, reads[0]) for event, reads in run.probe}
    assert {("insert", True), ("execute", True), ("execute", False)} <= seen


def test_plugin_keys_after_runner_construction(sfkit):
    config, _, _ = sfkit.mixed()
    run = sfkit.run(config, [], backend="sim", features=sfkit.FEATURES)
    si = run.runner.share_inputs
    state = sfkit.state(run.runner)
    assert si["not_need_stop_gpu"] is si["not_need_stop_device"] is state.device
    assert si["not_need_stop_pinned"] is state.pinned and si["sampled_token_ids"] is state.tokens
    assert si["not_need_stop"] is state.legacy
    assert state.backend.is_pinned(si["not_need_stop_pinned"]) and state.backend.is_pinned(si["sampled_token_ids"])
    assert not state.backend.is_pinned(si["not_need_stop"]), "the 2.4 key must stay pageable"
    assert si["sampled_token_ids"].shape == [config.max_num_seqs, 1] and si["sampled_token_ids"].dtype == paddle.int64
    assert sfkit.raw(si["sampled_token_ids"]).tolist() == [[-1]] * config.max_num_seqs
    assert [sfkit.raw(si[k]).tolist() for k in ("not_need_stop", "not_need_stop_pinned", "not_need_stop_device")] \
        == [[False]] * 3


def test_without_sampled_tokens_2_4_sampled_token_ids_key_is_absent(sfkit):
    config, _, _ = sfkit.mixed()
    run = sfkit.run(config, [], features=("stop_flag",))
    assert "sampled_token_ids" not in run.runner.share_inputs
    assert "not_need_stop_pinned" in run.runner.share_inputs


@pytest.mark.parametrize("backend", BACKENDS)
def test_not_need_stop_returns_a_python_bool_with_2_4_values(sfkit, backend):
    config, requests, arrivals = sfkit.mixed()

    def probe(runner, record, event):
        value = runner.not_need_stop()
        record.append((type(value), bool(value)))  # 2.4's 0-d tensor is a view: read it now

    base = sfkit.run(config, requests, arrivals=arrivals, probe=probe)
    run = sfkit.run(config, requests, arrivals=arrivals, probe=probe, backend=backend, features=sfkit.FEATURES)
    assert {t for t, _ in run.probe} == {bool}
    assert {t for t, _ in base.probe} == {paddle.Tensor}  # what 2.4 returns despite its annotation
    assert [v for _, v in run.probe] == [v for _, v in base.probe]
    run.result.assert_same(base.result)


def _reset_mid_run(sfkit, backend, monkeypatch, before_reset=None):
    """Run the mixed scenario with the plugin, call ``reset_share_inputs()`` after step 5 (requests
    running, the pinned tokens resized to the batch), and return what the test checks."""
    config, requests, arrivals = sfkit.mixed()
    runner_module = sfkit.runner_module
    filled = []
    original_fill = runner_module.fill_paddle_tensor

    def spy(shared_inputs, key, value):
        filled.append((key, replica_backend.current().is_pinned(shared_inputs.get(key))))
        return original_fill(shared_inputs, key, value)

    monkeypatch.setattr(runner_module, "fill_paddle_tensor", spy)
    seen = {}

    def on_step(step, runner):
        if step == 0:
            state = sfkit.state(runner)
            seen["objects"] = {k: runner.share_inputs[k] for k in ("not_need_stop_pinned", "sampled_token_ids")}
            seen["ptrs"] = {k: t.data_ptr() for k, t in seen["objects"].items()}
        if step < 5:
            return
        state = sfkit.state(runner)
        assert sfkit.legacy_reads(runner.share_inputs) == (True, True, True)
        assert runner.share_inputs["sampled_token_ids"].shape[0] < config.max_num_seqs
        if before_reset is not None:
            before_reset(runner, state)
        with runtime.collecting() as census:
            runner.reset_share_inputs()
        seen["census"] = census
        seen["runner"], seen["state"] = sfkit.snapshot(runner), state
        raise _Abort

    with pytest.raises(_Abort):
        sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=sfkit.FEATURES, on_step=on_step)
    return config, seen, filled


def _assert_reset_state(sfkit, config, seen):
    si, state = seen["runner"].share_inputs, seen["state"]
    assert sfkit.legacy_reads(si) == (False, False, False)
    assert sfkit.raw(si["not_need_stop_pinned"]).tolist() == [False]
    assert sfkit.raw(si["not_need_stop_device"]).tolist() == [False]
    tokens = si["sampled_token_ids"]
    assert tokens.shape == [config.max_num_seqs, 1]
    assert sfkit.raw(tokens).tolist() == [[-1]] * config.max_num_seqs
    assert not seen["runner"].not_need_stop()
    # the pinned buffers are the same allocations, still known to the backend as pinned
    for key, obj in seen["objects"].items():
        assert si[key] is obj and obj.data_ptr() == seen["ptrs"][key], key
        assert state.backend.is_pinned(obj), key


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_share_inputs_leaves_every_flag_copy_consistent(sfkit, backend, monkeypatch):
    config, seen, filled = _reset_mid_run(sfkit, backend, monkeypatch)
    _assert_reset_state(sfkit, config, seen)
    # 2.4's reset ran (it fills every key it names) but never on a pinned buffer
    keys = [k for k, _ in filled]
    assert "stop_flags" in keys and "not_need_stop" in keys
    assert [k for k, pinned in filled if pinned] == []
    assert seen["census"].totals([seen["census"].setup])["op_on_pinned"] == 0
    stop_flags = seen["runner"].share_inputs["stop_flags"].numpy()
    assert stop_flags.all()


def test_reset_while_a_flag_copy_is_in_flight_is_not_overwritten_later(sfkit, monkeypatch):
    """sim: the update op's flag (True) and token copies are still in flight when the reset
    comes. The reset must land them first; a later stream wait must not bring True back."""

    def issue_copies(runner, state):
        state.ops.set_stop(state.device, True)
        state.after_update(paddle.full([3, 1], 42, dtype="int64"))
        assert state.backend.pending_writers() == ["not_need_stop", "sampled_token_ids"]

    config, seen, _ = _reset_mid_run(sfkit, "sim", monkeypatch, before_reset=issue_copies)
    backend = seen["state"].backend
    assert backend.pending_writers() == []
    backend.stream_synchronize("test: later device work")
    _assert_reset_state(sfkit, config, seen)


@pytest.mark.parametrize("backend", BACKENDS)
def test_insertion_write_wins_over_a_flag_copy_still_in_flight(sfkit, backend):
    """A stale "stop" copy is in flight when the scheduler inserts a request: the insertion's
    ``not_need_stop[0] = True`` must be the last write - to the 2.4 flag and to the pinned one."""
    config, requests, arrivals = sfkit.mixed(num_gpu_blocks=None)  # "mid" is admitted on arrival
    base = sfkit.baseline("mixed-roomy", config, requests, arrivals)
    insert_step = min(arrivals)

    def on_step(step, runner):
        if step == insert_step - 1:
            state = sfkit.state(runner)
            state.ops.set_stop(state.device, False)
            state.after_update(None)

    def probe(runner, record, event):
        if event == "insert":
            state = sfkit.state(runner)
            record.append((sfkit.legacy_reads(runner.share_inputs)[0], bool(sfkit.raw(state.pinned)[0]),
                           state.flag_pending))

    run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=sfkit.FEATURES,
                    on_step=on_step, probe=probe)
    run.result.assert_same(base.result)
    assert set(run.probe) == {(True, True, False)}
