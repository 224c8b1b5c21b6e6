"""The registry's contract: all-or-nothing apply, idempotence, exact revert, import order."""

from __future__ import annotations

import importlib
import sys

import pytest

from fd_async_copy_plugin.profile import ProfileInfo
from fd_async_copy_plugin.registry import Feature, Patch, Target, hookimpl
from fd_async_copy_plugin.registry import manager as manager_module
from fd_async_copy_plugin.registry.catalog import plugin_manager


class Planted(RuntimeError):
    pass


class DemoFeature(Feature):
    name = "demo"
    mirrors = "nothing (test)"
    profiles = {"fastdeploy-2.4": "apply", "fastdeploy-2.5": "native: has it"}

    def __init__(self, fail_last: bool = False) -> None:
        self.fail_last = fail_last
        self.patches = self._declare()

    def _declare(self):
        def replace(tag):
            def build(original, ctx):  # a link: its part, then the rest of the chain
                return lambda *a, **k: (tag, original(*a, **k))

            return build

        def last(original, ctx):
            if self.fail_last:
                raise Planted("planted failure in the last target")
            return replace("save")(original, ctx)

        return (
            Patch(Target("worker.gpu_model_runner", "GPUModelRunner.execute_model"), replace("exec")),
            Patch(Target("worker.gpu_model_runner", "GPUModelRunner.not_need_stop"), replace("stop")),
            Patch(Target("worker.gpu_model_runner", "GPUModelRunner.helper"), replace("helper")),
            Patch(Target("model_executor.pre_and_post_process", "post_process"), replace("post")),
            Patch(Target("worker.gpu_model_runner", "post_process"), replace("post-import")),
            Patch(Target("worker.metax_model_runner", "post_process", required=False), replace("metax")),
            Patch(Target("model_executor.pre_and_post_process", "save_output_topk"), last),
        )


class DemoPlugin:
    def __init__(self, feature):
        self.feature = feature

    @hookimpl
    def fd_async_copy_features(self):
        return [self.feature]


@pytest.fixture
def as_profile(monkeypatch):
    def use(profile):
        monkeypatch.setattr(
            manager_module, "detect_profile", lambda root: ProfileInfo(profile, "test", root, None, {}, "test profile")
        )

    return use


def snapshot(root):
    runner = sys.modules[f"{root}.worker.gpu_model_runner"]
    post = sys.modules[f"{root}.model_executor.pre_and_post_process"]
    return {
        "execute_model": vars(runner.GPUModelRunner)["execute_model"],
        "helper": vars(runner.GPUModelRunner)["helper"],
        "not_need_stop_own": "not_need_stop" in vars(runner.GPUModelRunner),
        "runner.post_process": runner.post_process,
        "post_process": post.post_process,
        "save_output_topk": post.save_output_topk,
    }


def add_plugin(manager, plugin, name: str) -> None:
    """Register a patch-set plugin object on the manager's pluggy manager (as an entry point would)."""
    manager.pm = manager.pm or plugin_manager()
    manager.pm.register(plugin, name=name)


def enable_demo(manager, root, feature, profile="fastdeploy-2.4", as_profile=None):
    add_plugin(manager, DemoPlugin(feature), name=f"test-{id(feature)}")
    manager.enable(("demo",), backend="host", root=root)
    return manager.decisions["demo"]


def test_apply_patches_every_target_including_importers(fakefd, manager, as_profile):
    as_profile("fastdeploy-2.4")
    importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    state = enable_demo(manager, fakefd, DemoFeature())
    assert state.state == "applied", state.reason
    runner = sys.modules[f"{fakefd}.worker.gpu_model_runner"]
    assert runner.GPUModelRunner().execute_model() == ("exec", ("post-import", ("post", "runner")))
    assert runner.GPUModelRunner().not_need_stop() == ("stop", "base")
    assert runner.GPUModelRunner.helper() == ("helper", "helper")
    assert isinstance(vars(runner.GPUModelRunner)["helper"], staticmethod)  # keeps its kind


def test_planted_failure_in_last_target_leaves_every_original(fakefd, manager, as_profile):
    as_profile("fastdeploy-2.4")
    importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    before = snapshot(fakefd)
    state = enable_demo(manager, fakefd, DemoFeature(fail_last=True))
    assert state.state == "failed"
    assert "planted failure" in state.reason
    after = snapshot(fakefd)
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] is before[key], key


def test_failure_while_setting_restores_what_was_set(fakefd, manager, as_profile, monkeypatch):
    as_profile("fastdeploy-2.4")
    importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    before = snapshot(fakefd)
    from fd_async_copy_plugin.registry import patch as patch_module

    real_set = setattr
    calls = []

    def flaky_set(owner, name, value):
        calls.append(name)
        if name == "save_output_topk" and value is not before["save_output_topk"]:
            raise Planted("setattr failed on the last target")
        real_set(owner, name, value)

    # the engine's setattr (a module global shadows the builtin there)
    monkeypatch.setattr(patch_module, "setattr", flaky_set, raising=False)
    state = enable_demo(manager, fakefd, DemoFeature())
    assert state.state == "failed"
    assert len(calls) > 5  # the earlier targets really were set before the failure
    after = snapshot(fakefd)
    for key in before:
        assert after[key] is before[key], key


def test_apply_twice_is_a_noop_and_disable_restores_identical_objects(fakefd, manager, as_profile):
    as_profile("fastdeploy-2.4")
    importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    before = snapshot(fakefd)
    feature = DemoFeature()
    enable_demo(manager, fakefd, feature)
    patched = snapshot(fakefd)
    manager.enable(("demo",), backend="host", root=fakefd)
    assert snapshot(fakefd) == patched
    assert all(snapshot(fakefd)[k] is patched[k] for k in patched)
    manager.disable()
    restored = snapshot(fakefd)
    for key in before:
        assert restored[key] is before[key], key
    # the inherited method is inherited again, not shadowed by a copy
    runner = sys.modules[f"{fakefd}.worker.gpu_model_runner"]
    assert "not_need_stop" not in vars(runner.GPUModelRunner)


def test_native_and_unknown_profiles_patch_nothing(fakefd, manager, as_profile):
    importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    before = snapshot(fakefd)
    as_profile("fastdeploy-2.5")
    assert enable_demo(manager, fakefd, DemoFeature()).state == "native"
    manager.disable()
    as_profile("unknown")
    manager.enable(("demo",), backend="host", root=fakefd)
    state = manager.decisions["demo"]
    assert state.state == "skipped" and "unrecognised" in state.reason
    assert all(snapshot(fakefd)[k] is before[k] for k in before)


def test_modules_imported_later_are_patched_on_import(fakefd, manager, as_profile):
    as_profile("fastdeploy-2.4")
    assert f"{fakefd}.worker.gpu_model_runner" not in sys.modules
    state = enable_demo(manager, fakefd, DemoFeature())
    assert state.state == "pending"
    runner = importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    assert manager.decisions["demo"].state == "applied"
    assert runner.GPUModelRunner().execute_model()[0] == "exec"


def test_half_initialised_module_ends_in_the_same_patched_state(fakefd, manager, as_profile, tmp_path):
    """FD's tests import gpu_model_runner first; the plugin hook fires in the middle of it."""
    as_profile("fastdeploy-2.4")
    path = tmp_path / fakefd / "worker" / "gpu_model_runner.py"
    source = path.read_text()
    hook = (
        "import fd_async_copy_plugin as _p\n"
        f"_p._get_manager().enable(('demo',), backend='host', root={fakefd!r})\n"
    )
    # The hook runs before the class is defined, as FD's model_register hook does.
    path.write_text(source.replace("from .base import RunnerBase\n", "from .base import RunnerBase\n" + hook))
    add_plugin(manager, DemoPlugin(DemoFeature()), name="test-half")
    runner = importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    importlib.import_module("json.tool")  # any later import completes the deferred apply
    assert manager.decisions["demo"].state == "applied"
    assert runner.GPUModelRunner().execute_model()[0] == "exec"
    assert runner.GPUModelRunner().not_need_stop() == ("stop", "base")


def test_enable_twice_with_backend_auto_is_a_noop(fakefd, manager, as_profile, monkeypatch):
    """``auto`` resolves to a concrete backend; a second identical call must not revert and reapply."""
    as_profile("fastdeploy-2.4")
    from fd_async_copy_plugin import runtime

    monkeypatch.setattr(runtime, "make_backend", lambda name: runtime.HostBackend())
    importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    add_plugin(manager, DemoPlugin(DemoFeature()), name="test-auto")
    manager.enable(("demo",), backend="auto", root=fakefd)
    first = snapshot(fakefd)
    applied = manager.applied["demo"]
    manager.enable(("demo",), backend="auto", root=fakefd)
    assert manager.applied["demo"] is applied
    assert all(snapshot(fakefd)[k] is first[k] for k in first)


def test_an_importer_loaded_after_apply_is_pointed_back_on_revert(fakefd, manager, as_profile, tmp_path):
    """A declared ``from ... import`` importer (``required=False``) that FD loads only after the
    patch imports the replacement itself; ``disable()`` hands it FD's original again."""
    as_profile("fastdeploy-2.4")
    importlib.import_module(f"{fakefd}.worker.gpu_model_runner")
    post = importlib.import_module(f"{fakefd}.model_executor.pre_and_post_process")
    original = post.post_process
    assert enable_demo(manager, fakefd, DemoFeature()).state == "applied"
    (tmp_path / fakefd / "worker" / "metax_model_runner.py").write_text(
        "from ..model_executor.pre_and_post_process import post_process\n"
    )
    metax = importlib.import_module(f"{fakefd}.worker.metax_model_runner")
    assert metax.post_process is post.post_process and metax.post_process is not original
    manager.disable()
    assert metax.post_process is original
