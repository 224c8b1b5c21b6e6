"""One runner pipeline (issue 21): one replacement per FastDeploy attribute, the order of the parts
around it from one table, per-runner state in one object."""

from __future__ import annotations

import collections
import random
import threading
from pathlib import Path

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.patches import runner as pipeline
from fd_async_copy_plugin.registry import hookspecs
from fd_async_copy_plugin.registry import patch as patch_module
from fd_async_copy_plugin.registry.patch import JUNCTION_MARK, Junction, _raw_attr
from fd_async_copy_plugin.runtime import collecting
from fd_async_copy_plugin.testing.harness import Variant, device_for, plugin_state
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

pytestmark = pytest.mark.usefixtures("plugin_off")

CHECKOUT = Path(__file__).resolve().parents[2]
ALL = ("logprobs", "stop_flag", "sampled_tokens", "sync_scope", "step_syncs", "flag_race", "overlap")


def installed_junctions() -> list:
    """Every junction in place now."""
    return [j for j in list(patch_module._junctions.values()) if Junction.at(j.owner, j.name) is j]


def _features():
    return fd_async_copy_plugin._get_manager()._features


def _targets(root: str) -> dict:
    """Every attribute the applied features declare: (owner, name) -> [feature, ...]."""
    manager = fd_async_copy_plugin._get_manager()
    found = collections.defaultdict(list)
    for name, applied in manager.applied.items():
        for record in applied.records:
            found[(record.owner, record.name)].append(name)
    return found


def _snapshot(targets) -> dict:
    return {key: _raw_attr(*key) for key in targets}


@pytest.mark.parametrize("root", ["fd24", "fd25"])
def test_every_attribute_is_replaced_exactly_once_and_disable_restores_the_identical_objects(root):
    root = ROOTS[root]
    fd_async_copy_plugin.enable(features=ALL, backend="host", root=root)
    # load what FastDeploy loads, so every feature applies
    for module in ("worker.gpu_model_runner", "model_executor.pre_and_post_process"):
        __import__(f"{root}.{module}")
    targets = _targets(root)
    assert targets, fd_async_copy_plugin.status()
    replaced = {}
    for (owner, name), features in targets.items():
        current = _raw_attr(owner, name)
        function = current.__func__ if isinstance(current, (staticmethod, classmethod)) else current
        junction = getattr(function, JUNCTION_MARK, None)
        assert isinstance(junction, Junction), (owner, name)
        assert sorted(junction.links) == sorted(set(features)), (name, junction.links, features)
        # one wrapper: what is installed wraps FastDeploy's own object directly
        assert function.__wrapped__ is (junction.original.__func__ if junction.descriptor else junction.original)
        assert getattr(junction.original, JUNCTION_MARK, None) is None
        replaced[(owner, name)] = junction.original
    assert len(installed_junctions()) == len(replaced)
    fd_async_copy_plugin.disable()
    for key, original in replaced.items():
        assert _raw_attr(*key) is original, key
    assert installed_junctions() == []


def test_every_attribute_two_builtin_features_touch_has_a_row_in_the_table():
    fd_async_copy_plugin.enable(features=ALL, backend="host", root=ROOTS["fd24"])
    features = _features()
    touched = collections.defaultdict(set)
    for feature in features.values():
        for patch in feature.patches:
            touched[f"{patch.target.module}:{patch.target.attr}"].add(feature.name)
    shared = {target: names for target, names in touched.items() if len(names) > 1}
    assert shared
    for target, names in shared.items():
        assert target in pipeline.PIPELINE, target
        assert set(pipeline.PIPELINE[target]) - {"sync_check"} == names, (target, names)
    for target, row in pipeline.PIPELINE.items():  # plus the sync check's step bounds (a diagnostic)
        assert set(row) - {"sync_check"} <= touched[target], target


def _shuffled_hook(monkeypatch, seed: int) -> None:
    import fd_async_copy_plugin.patches as builtin

    original = builtin.fd_async_copy_features.__wrapped__ if hasattr(builtin.fd_async_copy_features, "__wrapped__") \
        else builtin.fd_async_copy_features

    @hookspecs.hookimpl
    def fd_async_copy_features():
        listed = list(original())
        random.Random(seed).shuffle(listed)
        return listed

    monkeypatch.setattr(builtin, "fd_async_copy_features", fd_async_copy_features)
    monkeypatch.setattr(fd_async_copy_plugin._get_manager(), "pm", None)  # collected afresh, restored after


def _layout() -> dict:
    junctions = {f"{j.owner.__name__}.{j.name}": tuple(j.features()) for j in installed_junctions()}
    states = {n: s["state"] for n, s in fd_async_copy_plugin.status()["features"].items()}
    return {"junctions": junctions, "states": states}


@pytest.mark.parametrize("seed", range(4))
def test_the_order_of_the_feature_list_changes_nothing(monkeypatch, seed):
    """Shuffle the built-in feature list and the user's request: the same parts in the same order
    around every attribute, the same states, and bit-identical outputs with overlap on."""
    requested = list(ALL)
    fd_async_copy_plugin.enable(features=requested, backend="host", root=ROOTS["fd24"])
    __import__(f"{ROOTS['fd24']}.worker.gpu_model_runner")
    baseline = _layout()
    fd_async_copy_plugin.disable()

    _shuffled_hook(monkeypatch, seed)
    random.Random(seed).shuffle(requested)
    fd_async_copy_plugin.enable(features=requested, backend="host", root=ROOTS["fd24"])
    assert _layout() == baseline
    fd_async_copy_plugin.disable()

    cfg = DriverConfig(max_num_seqs=4, vocab_size=128, max_model_len=48, chunk_size=6, enable_logprob=True,
                       max_logprobs=5)
    requests = [Request(f"r{i}", [3 + i, 5, 7 + i, 9][: 2 + i % 3] * 3, max_tokens=8 + i, eos_token_ids=[2],
                        logprobs=5 if i % 2 else None) for i in range(5)]
    outputs = []
    for order in (list(ALL), requested):
        with device_for("sim"), plugin_state(Variant("p", ROOTS["fd24"], True, tuple(order)), "sim"), \
                collecting():
            seen = []
            outputs.append(run_decode(ROOTS["fd24"], cfg, requests,
                                      max_steps=120, on_step=lambda s, r: seen.append(
                                          pipeline.part(r, "overlap") is not None)))
            assert seen and all(seen)  # the patched path ran
    outputs[0].assert_same(outputs[1])


def test_feature_modules_keep_no_state_on_the_runner_but_through_runner_state():
    """``grep _fdac_``: only the module that owns the per-runner state names it."""
    hits = []
    for folder in (CHECKOUT / "patches", CHECKOUT / "fd_async_copy_plugin"):
        for path in folder.rglob("*.py"):
            if "patches" in path.relative_to(CHECKOUT).parts[:2] and folder.name == "fd_async_copy_plugin":
                continue  # the link to patches/, read once above
            if "_fdac_" in path.read_text():
                hits.append(str(path.relative_to(CHECKOUT)))
    assert hits == ["patches/runner.py"], hits


@pytest.mark.parametrize("check_first", [True, False], ids=["check, then enable", "enable, then check"])
def test_the_sync_checks_step_bounds_are_outermost_around_execute_model(check_first):
    """The sync check's step hook is a link of the same junction, outside overlap's part, whichever
    is installed first; each leaves FD's own execute_model when it goes."""
    from fd_async_copy_plugin import sync_check

    root = ROOTS["fd24"]
    module = __import__(f"{root}.worker.gpu_model_runner", fromlist=["GPUModelRunner"])
    fd_own = vars(module.GPUModelRunner)["execute_model"]
    try:
        if check_first:
            sync_check.install_step_hook(root)
        fd_async_copy_plugin.enable(features=ALL, backend="host", root=root)
        if not check_first:
            sync_check.install_step_hook(root)
        junction = Junction.at(module.GPUModelRunner, "execute_model")
        assert junction.features() == ["sync_check", "overlap", "stop_flag"] and junction.original is fd_own
    finally:
        fd_async_copy_plugin.disable()
        sync_check.uninstall_step_hooks()
    assert vars(module.GPUModelRunner)["execute_model"] is fd_own
