"""``plan()``: the one function that decides per feature, for enable(), doctor and strict mode."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.cli.doctor import diagnose
from fd_async_copy_plugin.profile import ProfileInfo
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.registry import Decision, Feature, StrictModeError, plan
from fd_async_copy_plugin.registry import manager as manager_module
from fd_async_copy_plugin.registry import predict as predict_module
from fd_async_copy_plugin.registry.plan import strict_violations


class Served(Feature):
    name = "served"
    mirrors = "PR #1"
    profiles = {"fastdeploy-2.4": "apply", "fastdeploy-2.5": "native: 2.5 has it"}
    options = {"extra": "adds the extra"}


class NeedsOps(Feature):
    name = "needs_ops"
    profiles = {"fastdeploy-2.4": "apply"}

    def unavailable(self, backend):
        return f"no ops for {backend}"


FEATURES = {"served": Served(), "needs_ops": NeedsOps()}


def profile(name):
    return ProfileInfo(name, "test", "fastdeploy", None, {}, f"{name} because test")


def backend_probe(result=("host", "")):
    calls = []

    def probe():
        calls.append(1)
        return result

    probe.calls = calls
    return probe


def test_each_decision_with_its_reason():
    probe = backend_probe()
    got = plan(("served", "needs_ops", "nope"), FEATURES, profile("fastdeploy-2.4"), probe)
    assert got["served"] == Decision("apply", "mirrors PR #1")
    assert got["needs_ops"] == Decision("skipped", "no ops for host")
    assert got["nope"] == Decision("skipped", "no installed patch set provides this feature")
    assert len(probe.calls) == 1  # the backend is probed once, however many features need it


def test_profiles_decide_before_the_backend_is_touched():
    probe = backend_probe()
    assert plan(("served",), FEATURES, profile("fastdeploy-2.5"), probe)["served"] == Decision("native", "2.5 has it")
    skipped = plan(("needs_ops",), FEATURES, profile("fastdeploy-2.5"), probe)["needs_ops"]
    assert skipped.state == "skipped" and "not for profile 'fastdeploy-2.5'" in skipped.reason
    for name, words in (("absent", "FastDeploy not found"), ("unknown", "unrecognised FastDeploy")):
        decision = plan(("served",), FEATURES, profile(name), probe)["served"]
        assert decision.state == "skipped" and words in decision.reason and "because test" in decision.reason
    assert probe.calls == []


def test_a_backend_that_stands_down_skips_what_would_apply():
    got = plan(("served",), FEATURES, profile("fastdeploy-2.4"), backend_probe(("cuda", "no GPU here")))
    assert got["served"] == Decision("skipped", "backend stands down: no GPU here")


def test_an_option_follows_its_feature():
    both = plan(("served", "extra"), FEATURES, profile("fastdeploy-2.4"), backend_probe())
    assert both["extra"] == Decision("apply", "adds the extra", option_of="served")
    alone = plan(("extra",), FEATURES, profile("fastdeploy-2.4"), backend_probe())
    assert alone == {"extra": Decision("skipped", "an option of served: request served too", "served")}
    down = plan(("served", "extra"), FEATURES, profile("fastdeploy-2.4"), backend_probe(("cuda", "no GPU")))
    assert down["extra"].state == "skipped" and down["extra"].reason.startswith("needs served, which is skipped: ")


def test_without_loadable_features_every_name_gets_the_reason():
    got = plan(("served", "extra"), "Paddle is not importable", profile("fastdeploy-2.4"), backend_probe())
    assert got == {n: Decision("skipped", "Paddle is not importable") for n in ("served", "extra")}


def test_strict_mode_refuses_every_state_but_applied_pending_native():
    ok = {"a": Decision("applied", ""), "b": Decision("pending", ""), "c": Decision("native", "")}
    assert strict_violations(ok) == ""
    for state in ("skipped", "incompatible", "failed", "passthrough"):
        assert strict_violations({**ok, "d": Decision(state, "why")}) == f"d: {state} (why)"


# ---- enable(), doctor and strict mode all act on plan() ------------------------------------------


def test_enable_doctor_and_strict_mode_use_the_same_plan(monkeypatch):
    """Plant a decision in plan(): enable() reports it, doctor predicts it, strict mode refuses it."""
    planted = Decision("skipped", "planted by the test")
    real = manager_module.plan

    def planted_plan(requested, features, profile, backend):
        decisions = real(requested, features, profile, backend)
        decisions["logprobs"] = planted
        return decisions

    monkeypatch.setattr(manager_module, "plan", planted_plan)  # enable()
    monkeypatch.setattr(predict_module, "plan", planted_plan)  # plan() and doctor
    environ = {"FD_ASYNC_COPY": "1", "FD_ASYNC_COPY_BACKEND": "host", "FD_ASYNC_COPY_FEATURES": "logprobs"}
    assert diagnose(root=ROOTS["fd24"], environ=environ)["features"]["logprobs"] == planted.as_dict()
    fd_async_copy_plugin.disable()
    try:
        status = fd_async_copy_plugin.enable(["logprobs"], backend="host", root=ROOTS["fd24"])
        assert status["features"]["logprobs"] == planted.as_dict()
        fd_async_copy_plugin.disable()
        with pytest.raises(StrictModeError, match="logprobs: skipped \\(planted by the test\\)"):
            fd_async_copy_plugin.enable(["logprobs"], backend="host", root=ROOTS["fd24"], strict=True)
    finally:
        fd_async_copy_plugin.disable()


def test_public_plan_predicts_the_states_enable_reaches():
    fd_async_copy_plugin.disable()
    predicted = fd_async_copy_plugin.plan(None, backend="host", root=ROOTS["fd24"])["features"]
    try:
        importlib.import_module(f"{ROOTS['fd24']}.worker.gpu_model_runner")
        actual = fd_async_copy_plugin.enable(None, backend="host", root=ROOTS["fd24"])["features"]
    finally:
        fd_async_copy_plugin.disable()
    assert predicted.keys() == actual.keys()
    for name, entry in predicted.items():
        assert actual[name]["state"] == ("applied" if entry["state"] == "apply" else entry["state"]), name


def test_enable_with_a_different_feature_set_plans_afresh():
    fd_async_copy_plugin.disable()
    root = ROOTS["fd24"]
    postproc = importlib.import_module(f"{root}.model_executor.pre_and_post_process")
    original_update = postproc.update_inputs_v1
    try:
        importlib.import_module(f"{root}.worker.gpu_model_runner")
        everything = fd_async_copy_plugin.enable(None, backend="host", root=root)
        assert everything["features"]["stop_flag"]["state"] == "applied"
        assert postproc.update_inputs_v1 is not original_update
        fewer = fd_async_copy_plugin.enable(["logprobs"], backend="host", root=root)
        assert list(fewer["features"]) == ["logprobs"]
        assert postproc.update_inputs_v1 is original_update  # stop_flag was reverted, not kept
    finally:
        fd_async_copy_plugin.disable()


def test_status_reads_state_only():
    """status() loads no ops, imports no Paddle and runs no deferred patch."""
    code = textwrap.dedent(
        """
        import sys
        import fd_async_copy_plugin
        from fd_async_copy_plugin.registry import imports
        imports.WATCHER.poll = lambda: sys.exit("status() polled the import watcher")
        status = fd_async_copy_plugin.status()
        assert "paddle" not in sys.modules, "status() imported Paddle"
        assert "fd_async_copy_plugin.ops.stop_flag_ops" not in sys.modules, "status() loaded the ops"
        assert status["features"] == {} and status["enabled"] is False
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_every_replacement_keeps_the_original_names():
    """One wrapping helper: FastDeploy code and tracebacks see the original names."""
    fd_async_copy_plugin.disable()
    root = ROOTS["fd24"]
    importlib.import_module(f"{root}.worker.gpu_model_runner")
    try:
        fd_async_copy_plugin.enable(None, backend="host", root=root)
        junctions = [j for a in fd_async_copy_plugin._get_manager().applied.values() for _, j in a.records]
        checked = 0
        for junction in junctions:
            original, replacement = junction.original, junction.installed
            if not inspect.isfunction(original) or replacement is original:
                continue
            assert replacement.__name__ == original.__name__, junction.name
            assert replacement.__qualname__ == original.__qualname__, junction.name
            assert replacement.__wrapped__ is original, junction.name
            checked += 1
        assert checked >= 10
    finally:
        fd_async_copy_plugin.disable()
