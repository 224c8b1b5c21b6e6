"""Planted ordering bugs in the ``stop_flag`` / ``sampled_tokens`` patches that the ``sim`` backend
must catch, and the control: the real plugin passes the very same runs.

On CPU Paddle every copy is synchronous, so reading a pinned buffer before its event completed
gives the right value by luck (the ``host`` backend cannot see these bugs - checked below). The
simulator keeps poison in a pinned buffer (the inverted flag, -7777 tokens) until an event that
covers its copy is waited on, and raises when a read goes through the backend too early.

Planted, each by monkeypatching one piece of ``patches/fd24/stop_flag.py``:

(a) ``StopFlagState.sync`` reads the pinned flag without waiting for the event;
(b) the save guard hands the pinned ``sampled_token_ids`` to the save op and waits only after it;
(c) the event is recorded before the flag copy is issued (it covers nothing of this step) - both
    with the real lookup of the covering event and with a stored early event waited on.
"""

from __future__ import annotations

import pytest

from copy_path_mutations import record_event_before_copies
from fd_async_copy_plugin.runtime import AsyncCopyError, PendingCopyError

pytestmark = pytest.mark.usefixtures("plugin_off")

#: (features, DriverConfig overrides) of the runs the bugs are planted in
RUNS = {
    "stop_flag-save_output": (("stop_flag",), {}),
    "stop_flag-legacy": (("stop_flag",), dict(use_v1_scheduler=False, chunk_size=None, num_gpu_blocks=None)),
    "both-save_output": (("stop_flag", "sampled_tokens"), {}),
    "both-zmq": (("stop_flag", "sampled_tokens"), dict(save_output_v1=True)),
    "both-logprobs": (("stop_flag", "sampled_tokens"), dict(enable_logprob=True)),
}


def _scenario(sfkit, key):
    features, overrides = RUNS[key]
    config, requests, arrivals = sfkit.mixed(**overrides)
    if overrides.get("enable_logprob"):
        for i, r in enumerate(requests):
            r.logprobs = (0, 1, 5)[i % 3]
    base = sfkit.baseline(f"planted-{key}", config, requests, arrivals)
    return features, config, requests, arrivals, base


def _outcome(sfkit, key, backend="sim"):
    """'identical', the differences, or the error the run raised."""
    features, config, requests, arrivals, base = _scenario(sfkit, key)
    try:
        run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=features)
    except AsyncCopyError as error:
        return error
    assert set(run.states.values()) == {"applied"}, run.states
    return run.result.differences(base.result) or "identical"


# ---- the planted variants -------------------------------------------------------------------------


def _sync_without_wait(self, reader: str) -> None:
    """(a) FastDeploy-style ``.numpy()`` of the pinned flag: no event wait before the read."""
    if not self.flag_pending:
        return
    value = bool(self.pinned.numpy()[0])
    self.ops.set_stop(self.legacy, value)
    self.flag_pending = False


def _early_substitute(self, value, reader: str):
    """(b) the save consumers get the pinned token buffer itself and nothing waits before the
    consumer runs (the flag is made current only after post_process, by its own wrapper)."""
    state = next((s for s in self.parts() if value is not None and s.token_source is value), None)
    return state.tokens if state is not None else value


def _after_update_storing_early_event(self, topk_ids) -> None:
    """(c') the same, keeping the early event for the consumers to wait on."""
    self.planted_event = self.backend.record("post_process")
    self.backend.copy_d2h(self.pinned, self.device, "not_need_stop")
    if self.tokens is not None and topk_ids is not None:
        self.backend.copy_d2h(self.tokens, topk_ids, "sampled_token_ids")
        self.token_source = topk_ids
    self.flag_pending = True


def _sync_on_stored_event(self, reader: str) -> None:
    if not self.flag_pending:
        return
    self.backend.wait(self.planted_event, reader)
    value = bool(self.backend.read(self.pinned, reader)[0])
    self.ops.set_stop(self.legacy, value)
    self.flag_pending = False


def _host_tokens_on_stored_event(self, reader: str):
    self.backend.wait(self.planted_event, reader)
    import paddle

    return paddle.to_tensor(self.backend.read(self.tokens, reader))


def _plant(monkeypatch, sfkit, bug: str) -> None:
    module = sfkit.stop_flag_patches
    state = module.StopFlagState
    if bug == "a-sync-without-wait":
        monkeypatch.setattr(state, "sync", _sync_without_wait)
    elif bug == "b-tokens-before-event":
        monkeypatch.setattr(module.StopFlagRunners, "substitute", _early_substitute)
    elif bug == "c-record-before-copy":  # (the patch records no event: the copy path's C call does)
        record_event_before_copies(monkeypatch)
    elif bug == "c-wait-on-early-event":
        monkeypatch.setattr(state, "after_update", _after_update_storing_early_event)
        monkeypatch.setattr(state, "sync", _sync_on_stored_event)
        monkeypatch.setattr(state, "host_tokens", _host_tokens_on_stored_event)
    else:
        raise ValueError(bug)


# ---- the tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", RUNS)
def test_control_the_real_plugin_passes_every_run_on_sim(sfkit, key):
    assert _outcome(sfkit, key) == "identical"


@pytest.mark.parametrize("key", ["stop_flag-save_output", "stop_flag-legacy"])
def test_a_reading_the_pinned_flag_without_waiting_makes_outputs_differ(sfkit, monkeypatch, key):
    """The flag read first by the save guard (``stop_flag`` alone: no token copy waits before it)
    is the poison - the inverse of the real flag - so stop decisions go wrong."""
    _plant(monkeypatch, sfkit, "a-sync-without-wait")
    outcome = _outcome(sfkit, key)
    assert isinstance(outcome, (list, AsyncCopyError)) and outcome, outcome
    assert _outcome(sfkit, key, backend="host") == "identical"  # why the simulator exists


@pytest.mark.parametrize("key", ["both-save_output", "both-zmq", "both-logprobs"])
def test_b_handing_the_pinned_tokens_before_the_event_raises(sfkit, monkeypatch, key):
    """The save op (or the ZMQ payload builder) reads the tokens while their copy is in flight."""
    _plant(monkeypatch, sfkit, "b-tokens-before-event")
    outcome = _outcome(sfkit, key)
    assert isinstance(outcome, PendingCopyError), outcome
    assert "sampled_token_ids" in str(outcome)


@pytest.mark.parametrize("key", ["stop_flag-save_output", "both-save_output", "both-zmq"])
@pytest.mark.parametrize("bug, error, message", [
    ("c-record-before-copy", PendingCopyError, "before the copy"),
    ("c-wait-on-early-event", PendingCopyError, "before the copy"),
])
def test_c_an_event_recorded_before_the_copies_is_caught(sfkit, monkeypatch, key, bug, error, message):
    _plant(monkeypatch, sfkit, bug)
    outcome = _outcome(sfkit, key)
    assert isinstance(outcome, error), outcome
    assert message in str(outcome)
    assert _outcome(sfkit, key, backend="host") == "identical"  # only the simulator sees it
