"""Issue 25 items 5 and 7: the order features are named in changes nothing, and ``status()`` never
claims what does not run."""

from __future__ import annotations

import threading

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.patches import step_syncs as step_syncs_patch
from fd_async_copy_plugin.patches.runner import part
from fd_async_copy_plugin.registry import manager as manager_module
from fd_async_copy_plugin.runtime import collecting
from fd_async_copy_plugin.testing.harness import device_for
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

pytestmark = pytest.mark.usefixtures("plugin_off")

FD24 = ROOTS["fd24"]
CFG = DriverConfig(max_num_seqs=4, vocab_size=128, max_model_len=48, chunk_size=6, enable_logprob=True,
                   max_logprobs=5)
REQUESTS = [Request(f"s{i}", [3 + i, 5, 7, 9 + i], max_tokens=6, eos_token_ids=[2], logprobs=5) for i in range(3)]


def _run(features, backend="sim"):
    """A decode with the plugin enabled as requested; each feature's status entry seen mid-run."""
    seen = {}

    def on_step(step, runner):
        if step == 2:
            seen.update(fd_async_copy_plugin.status()["features"])

    with device_for(backend), collecting():
        fd_async_copy_plugin.enable(features=features, backend=backend, root=FD24)
        try:
            run_decode(FD24, CFG, REQUESTS, max_steps=60, on_step=on_step)
        finally:
            fd_async_copy_plugin.disable()
    return seen


@pytest.mark.parametrize("order", [
    "stop_flag,logprobs",
    "step_syncs,stop_flag,logprobs",
    "overlap,step_syncs,stop_flag,logprobs",
    "overlap,logprobs,sampled_tokens,step_syncs,stop_flag",
])
def test_the_order_features_are_named_in_changes_nothing(order):
    names = order.split(",")
    seen = _run(names)
    reverse = _run(list(reversed(names)))
    for name in names:
        assert seen[name]["state"] == "applied", (name, seen[name])
        assert "reloaded" not in seen[name]["reason"] and "does not run" not in seen[name]["reason"], seen[name]
        assert reverse[name]["state"] == seen[name]["state"], (name, reverse[name])


def test_after_disable_and_enable_a_live_runner_is_reported_as_it_runs(sfkit):
    features = ["logprobs", "stop_flag", "sampled_tokens", "step_syncs", "overlap"]
    small = DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16, hidden_size=8)
    fd_async_copy_plugin.enable(features=features, backend="host", root=sfkit.FD24)
    try:
        (runner,) = sfkit.build_runners([small])
        assert part(runner, "overlap") is not None
        fd_async_copy_plugin.disable()
        fd_async_copy_plugin.enable(features=features, backend="host", root=sfkit.FD24)
        assert part(runner, "stop") is None and part(runner, "syncs") is None and part(runner, "overlap") is None
        reported = fd_async_copy_plugin.status()["features"]
        for name in ("stop_flag", "step_syncs", "overlap"):
            assert reported[name]["state"] == "passthrough", (name, reported[name])
            assert "disable()" in reported[name]["runners"][0]["reason"], reported[name]
        del runner
    finally:
        fd_async_copy_plugin.disable()


def test_a_runner_the_shadow_cannot_follow_is_left_untouched(sfkit, monkeypatch):
    """A runner step_syncs cannot serve (speculative decoding, EP, non-V1) stands down before it
    changes anything: FastDeploy's own seed tensor stays, no part is made, status says why."""
    monkeypatch.setattr(step_syncs_patch, "own_path_reason", lambda runner, module: "speculative decoding")
    small = DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16, hidden_size=8)
    fd_async_copy_plugin.enable(features=["stop_flag", "step_syncs", "overlap", "logprobs"], backend="host",
                                root=sfkit.FD24)
    from fd_async_copy_plugin.testing.reference.device_tracking import tracking
    from fd_async_copy_plugin.testing.reference.placement import is_device

    try:
        with tracking(recording=False):  # device marks: a seed moved to the device would be marked
            (runner,) = sfkit.build_runners([small])
        assert part(runner, "stop") is not None and part(runner, "syncs") is None
        assert not is_device(runner.share_inputs["infer_seed"])  # FastDeploy's host seed, untouched
        reported = fd_async_copy_plugin.status()["features"]
        assert reported["step_syncs"]["state"] == "passthrough", reported["step_syncs"]
        assert "speculative decoding" in reported["step_syncs"]["reason"]
        assert reported["overlap"]["state"] == "passthrough", reported["overlap"]
        del runner
    finally:
        fd_async_copy_plugin.disable()


def test_after_a_reload_no_shadow_answer_is_served():
    """Item 7(b): once ``update_inputs_v1`` is FastDeploy's own again (a reloaded module), no
    snapshot follows the device: ``exist_prefill()`` is FastDeploy's answer from then on."""
    import importlib

    from fd_async_copy_plugin.registry.patch import Junction

    postproc = importlib.import_module(f"{FD24}.model_executor.pre_and_post_process")
    runner_module = importlib.import_module(f"{FD24}.worker.gpu_model_runner")
    answers, undo = [], []

    def on_step(step, runner):
        if step != 3:
            return
        # what importlib.reload does to the update op: FastDeploy's function again
        update = Junction.at(postproc, "update_inputs_v1")
        postproc.update_inputs_v1 = update.original
        undo.append((postproc, "update_inputs_v1", update.installed))
        junction = Junction.at(runner_module.GPUModelRunner, "exist_prefill")

        def exist_prefill(self):  # every call FastDeploy makes from now on: the plugin's answer and FD's
            mine, theirs = junction.installed(self), junction.original(self)
            answers.append((mine, theirs))
            return mine

        runner_module.GPUModelRunner.exist_prefill = exist_prefill
        undo.append((runner_module.GPUModelRunner, "exist_prefill", junction.installed))

    requests = [Request(f"r{i}", [3 + i] * (4 + 5 * i), max_tokens=12, eos_token_ids=[2]) for i in range(4)]
    arrivals = {s: [Request(f"a{s}", [9, 4, 7] * (1 + s % 4), max_tokens=5, eos_token_ids=[2])] for s in range(3, 12)}
    with device_for("sim"), collecting():
        fd_async_copy_plugin.enable(features=["stop_flag", "step_syncs"], backend="sim", root=FD24)
        try:
            run_decode(FD24, CFG, requests, arrivals=arrivals, max_steps=80, on_step=on_step)
        finally:
            for owner, name, value in undo:  # the plugin's junctions back, so disable() restores FD's own
                setattr(owner, name, value)
            fd_async_copy_plugin.disable()
    assert answers and all(mine == theirs for mine, theirs in answers), answers
    assert any(theirs for _, theirs in answers)


def test_status_during_enable_on_another_thread_is_never_half_done(monkeypatch):
    """Item 7(d): ``status()`` waits for an ``enable()`` in progress instead of reporting part of it."""
    entered, release = threading.Event(), threading.Event()
    real_apply = manager_module.apply_feature

    def slow_apply(feature, ctx):
        if feature.name == "stop_flag":
            entered.set()
            release.wait(10)
        return real_apply(feature, ctx)

    monkeypatch.setattr(manager_module, "apply_feature", slow_apply)
    import importlib

    importlib.import_module(f"{FD24}.worker.gpu_model_runner")
    importlib.import_module(f"{FD24}.model_executor.pre_and_post_process")
    requested = ["logprobs", "stop_flag", "step_syncs"]
    enabling = threading.Thread(target=fd_async_copy_plugin.enable,
                                kwargs=dict(features=requested, backend="host", root=FD24))
    enabling.start()
    assert entered.wait(10)
    seen = {}
    reader = threading.Thread(target=lambda: seen.update(fd_async_copy_plugin.status()))
    reader.start()
    reader.join(0.3)
    release.set()
    enabling.join(10)
    reader.join(10)
    assert seen["enabled"]
    assert set(seen["features"]) == set(requested), seen["features"]
    assert all(entry["state"] == "applied" for entry in seen["features"].values()), seen["features"]


def test_a_runner_configured_for_speculative_decoding_is_detected_and_left_untouched():
    """Item 7(e) without a monkeypatched reason: a runner FastDeploy builds for speculative decoding
    (``speculative_config.method`` set) is detected by step_syncs itself, which touches nothing."""
    import importlib

    from fd_async_copy_plugin.testing.reference.driver import _fd_config, _Modules

    root = ROOTS["fd24"]
    fd_config = _fd_config(_Modules(root), DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16,
                                                        hidden_size=8), 7391)
    fd_config.speculative_config.method = "mtp"
    runner_module = importlib.import_module(root + ".worker.gpu_model_runner")
    from fd_async_copy_plugin.testing.reference.device_tracking import tracking
    from fd_async_copy_plugin.testing.reference.placement import is_device

    fd_async_copy_plugin.enable(features=["stop_flag", "step_syncs", "logprobs"], backend="host", root=root)
    try:
        with tracking(recording=False):  # device marks: a seed moved to the device would be marked
            runner = runner_module.GPUModelRunner(fd_config, device="gpu", device_id=0, rank=0, local_rank=0)
        assert runner.speculative_decoding and part(runner, "syncs") is None
        assert not is_device(runner.share_inputs["infer_seed"])  # FastDeploy's host seed, untouched
        reported = fd_async_copy_plugin.status()["features"]["step_syncs"]
        assert reported["state"] == "passthrough" and "speculative decoding" in reported["reason"], reported
        del runner
    finally:
        fd_async_copy_plugin.disable()


# ---- issue 41 item 8: a speculative runner, and enabled with nothing applied --------------------

def _speculative_runner(root):
    import importlib

    from fd_async_copy_plugin.testing.reference.driver import _fd_config, _Modules

    fd_config = _fd_config(_Modules(root), DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16,
                                                        hidden_size=8), 7391)
    fd_config.speculative_config.method = "mtp"
    runner_module = importlib.import_module(root + ".worker.gpu_model_runner")
    return runner_module.GPUModelRunner(fd_config, device="gpu", device_id=0, rank=0, local_rank=0)


def test_on_a_speculative_runner_stop_flag_sampled_tokens_and_logprobs_are_not_reported_applied():
    """FD's speculative path (post_process_specualate, the speculative sampler) runs for that runner:
    stop_flag (with its option sampled_tokens) stands down for it, logprobs says its sampler is FD's."""
    root = ROOTS["fd24"]
    fd_async_copy_plugin.enable(features=["stop_flag", "sampled_tokens", "logprobs"], backend="host", root=root)
    try:
        runner = _speculative_runner(root)
        assert runner.speculative_decoding and part(runner, "stop") is None  # nothing made for it
        reported = fd_async_copy_plugin.status()["features"]
        for name in ("stop_flag", "sampled_tokens", "logprobs"):
            assert reported[name]["state"] == "passthrough", (name, reported[name])
            assert "speculative" in reported[name]["reason"], (name, reported[name])
        del runner
    finally:
        fd_async_copy_plugin.disable()


def test_enabled_is_false_when_every_requested_feature_is_skipped():
    import importlib

    importlib.import_module(f"{FD24}.worker.gpu_model_runner")
    status = fd_async_copy_plugin.enable(features=["step_syncs"], backend="host", root=FD24)  # needs stop_flag
    try:
        assert status["features"]["step_syncs"]["state"] == "skipped"
        now = fd_async_copy_plugin.status()
        assert now["enabled"] is False and "no feature is applied or pending" in now["enabled_reason"]
    finally:
        fd_async_copy_plugin.disable()
    status = fd_async_copy_plugin.enable(features=["stop_flag"], backend="host", root=FD24)
    try:
        assert fd_async_copy_plugin.status()["enabled"] is True and "enabled_reason" not in fd_async_copy_plugin.status()
    finally:
        fd_async_copy_plugin.disable()


def test_on_fd25_a_speculative_runner_is_not_reported_as_running_the_logprobs_feature():
    root = ROOTS["fd25"]
    fd_async_copy_plugin.enable(features=["logprobs", "sync_scope"], backend="host", root=root)
    try:
        runner = _speculative_runner(root)
        entry = fd_async_copy_plugin.status()["features"]["logprobs"]
        assert entry["state"] == "passthrough" and "speculative sampler" in entry["reason"], entry
        plain = _plain_runner(root)  # a plain runner beside it: partial
        entry = fd_async_copy_plugin.status()["features"]["logprobs"]
        assert entry["state"] == "partial" and "1 runner(s) decode speculatively" in entry["reason"], entry
        del runner, plain
    finally:
        fd_async_copy_plugin.disable()


def _plain_runner(root):
    import importlib

    from fd_async_copy_plugin.testing.reference.driver import _fd_config, _Modules

    fd_config = _fd_config(_Modules(root), DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16,
                                                        hidden_size=8), 7391)
    runner_module = importlib.import_module(root + ".worker.gpu_model_runner")
    return runner_module.GPUModelRunner(fd_config, device="gpu", device_id=0, rank=0, local_rank=0)
