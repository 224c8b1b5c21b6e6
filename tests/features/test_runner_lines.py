"""The runner, read top to bottom per FastDeploy line: one replacement per FastDeploy attribute, one
function per FastDeploy method and line (``patches/fd24``, ``patches/fd25``) that runs the features'
parts around FastDeploy's original in a fixed order, a step context per runner and thread (no
thread-local step state), tensor watching scoped to a thread, and docs/architecture.md showing
those functions as they are.

``python tests/features/test_runner_lines.py --write`` rewrites the generated part of the doc.
"""

from __future__ import annotations

import ast
import collections
import inspect
import random
import sys
import threading
from pathlib import Path

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.patches import common, runner as runner_module, step
from fd_async_copy_plugin.patches.fd24 import overlap, stop_flag
from fd_async_copy_plugin.patches.fd24 import methods as fd24_methods, step_syncs as fd24_syncs
from fd_async_copy_plugin.patches.fd25 import methods as fd25_methods, step_syncs as fd25_syncs
from fd_async_copy_plugin.registry import hookspecs
from fd_async_copy_plugin.registry import patch as patch_module
from fd_async_copy_plugin.registry.patch import JUNCTION_MARK, Junction, Shared, _raw_attr
from fd_async_copy_plugin.runtime import collecting
from fd_async_copy_plugin.testing.harness import Variant, device_for, plugin_state
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

pytestmark = pytest.mark.usefixtures("plugin_off")

CHECKOUT = Path(__file__).resolve().parents[2]
DOC = CHECKOUT / "docs" / "architecture.md"
ALL = ("logprobs", "stop_flag", "sampled_tokens", "sync_scope", "step_syncs", "flag_race", "overlap")
LINES = (("FastDeploy 2.4", "fd24", ("fastdeploy-2.4",)),
         ("FastDeploy 2.5 and develop", "fd25", ("fastdeploy-2.5", "fastdeploy-2.6+")))
BEGIN = "<!-- generated from the code by tests/features/test_runner_lines.py --write: do not edit -->"
END = "<!-- end of the generated part -->"


def installed_junctions() -> list:
    return [j for j in list(patch_module._junctions.values()) if Junction.at(j.owner, j.name) is j]


def _features():
    return fd_async_copy_plugin._get_manager()._features


def _targets() -> dict:
    """Every attribute the applied features declare: (owner, name) -> [feature, ...]."""
    found = collections.defaultdict(list)
    for name, applied in fd_async_copy_plugin._get_manager().applied.items():
        for _, junction in applied.records:
            found[(junction.owner, junction.name)].append(name)
    return found


@pytest.mark.parametrize("root", ["fd24", "fd25"])
def test_every_attribute_is_replaced_exactly_once_and_disable_restores_the_identical_objects(root):
    root = ROOTS[root]
    fd_async_copy_plugin.enable(features=ALL, backend="host", root=root)
    for module in ("worker.gpu_model_runner", "model_executor.pre_and_post_process"):
        __import__(f"{root}.{module}")
    targets = _targets()
    assert targets, fd_async_copy_plugin.status()
    replaced = {}
    for (owner, name), features in targets.items():
        current = _raw_attr(owner, name)
        function = current.__func__ if isinstance(current, (staticmethod, classmethod)) else current
        junction = getattr(function, JUNCTION_MARK, None)
        assert isinstance(junction, Junction), (owner, name)
        assert sorted(junction.features()) == sorted(set(features)), (name, junction.features(), features)
        if len(features) > 1:  # several features around one attribute: the line's one function
            assert list(junction.links) == ["runner"] and set(junction.members["runner"]) == set(features)
        assert function.__wrapped__ is (junction.original.__func__ if junction.descriptor else junction.original)
        assert getattr(junction.original, JUNCTION_MARK, None) is None
        replaced[(owner, name)] = junction.original
    assert len(installed_junctions()) == len(replaced)
    fd_async_copy_plugin.disable()
    for key, original in replaced.items():
        assert _raw_attr(*key) is original, key
    assert installed_junctions() == []


def test_a_shared_function_stays_for_the_features_still_applied_and_goes_with_the_last():
    class Owner:
        def method(self, x):
            return x + 1

    seen = []

    def method(fd, on, self, x):
        seen.append(sorted(on))
        return fd(self, x) * 10

    own = Owner.__dict__["method"]
    junction = Junction.on(Owner, "method")
    junction.attach("a", lambda nxt: Shared("runner", method, "ctx-a"))
    junction.attach("b", lambda nxt: Shared("runner", method, "ctx-b"))
    assert Owner().method(1) == 20 and seen[-1] == ["a", "b"]
    assert junction.features() == ["a", "b"] and list(junction.links) == ["runner"]
    junction.detach("a")
    assert Owner().method(1) == 20 and seen[-1] == ["b"]
    junction.detach("b")
    assert Owner.__dict__["method"] is own and Owner().method(1) == 2 and len(seen) == 2


def _shuffled_hook(monkeypatch, seed: int) -> None:
    import fd_async_copy_plugin.patches as builtin

    original = builtin.fd_async_copy_features

    @hookspecs.hookimpl
    def fd_async_copy_features():
        listed = list(original())
        random.Random(seed).shuffle(listed)
        return listed

    monkeypatch.setattr(builtin, "fd_async_copy_features", fd_async_copy_features)
    monkeypatch.setattr(fd_async_copy_plugin._get_manager(), "pm", None)  # collected afresh, restored after


def _layout() -> dict:
    junctions = {f"{j.owner.__name__}.{j.name}": (tuple(j.features()), tuple(j.links)) for j in installed_junctions()}
    states = {n: s["state"] for n, s in fd_async_copy_plugin.status()["features"].items()}
    return {"junctions": junctions, "states": states}


@pytest.mark.parametrize("seed", range(3))
def test_the_order_of_the_feature_list_changes_nothing(monkeypatch, seed):
    """Shuffle the built-in feature list and the user's request: the same parts around every
    attribute, the same states, and bit-identical outputs with overlap on."""
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
            outputs.append(run_decode(ROOTS["fd24"], cfg, requests, max_steps=120,
                                      on_step=lambda s, r: seen.append(runner_module.part(r, "overlap") is not None)))
            assert seen and all(seen)  # the patched path ran
    outputs[0].assert_same(outputs[1])


# -- the order of the parts around FD 2.4's methods ------------------------------------------------


def _spy(monkeypatch, events: list, owner, name: str, tag: str) -> None:
    real = getattr(owner, name)

    def spy(self, *args, **kwargs):
        events.append((tag, args[0] if args and isinstance(args[0], str) else ""))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, spy)


def _fd_spy(events: list, owner, name: str) -> tuple:
    junction = Junction.at(owner, name)
    fd_own = junction.bottom

    def bottom(*args, **kwargs):
        events.append(("fd", name))
        return fd_own(*args, **kwargs)

    junction.set_bottom(bottom)
    return junction, fd_own


def _order(events: list, *wanted) -> list[int]:
    """Where each of ``wanted`` first occurs in ``events`` at or after the previous one."""
    found, start = [], 0
    for item in wanted:
        at = events.index(item, start)
        found.append(at)
        start = at
    return found


def test_fd24_parts_run_in_the_line_functions_order(monkeypatch):
    """Around FD 2.4's insert: overlap's pending save first, then the stop flag made current (the
    insert's flag write must be the last), then step_syncs' shadow refreshed, FD's insert, the pinned
    flag after it. Around its reset: the save first, the flag current, FD, the stop part reset, the
    shadow reloaded. The flag check: overlap's flush after the forward, then the stop flag."""
    events: list = []
    _spy(monkeypatch, events, overlap.OverlapState, "flush", "overlap.flush")
    _spy(monkeypatch, events, overlap.OverlapState, "flag_check", "overlap.flag_check")
    _spy(monkeypatch, events, stop_flag.StopFlagState, "sync", "stop.sync")
    _spy(monkeypatch, events, stop_flag.StopFlagState, "after_insert", "stop.after_insert")
    _spy(monkeypatch, events, stop_flag.StopFlagState, "reset", "stop.reset")
    _spy(monkeypatch, events, stop_flag.StopFlagState, "flag", "stop.flag")
    _spy(monkeypatch, events, fd24_syncs.StepShadow, "refresh", "shadow.refresh")
    _spy(monkeypatch, events, fd24_syncs.StepShadow, "load", "shadow.load")
    root = ROOTS["fd24"]
    module = __import__(f"{root}.worker.gpu_model_runner", fromlist=["GPUModelRunner"])
    resets = []

    def on_step(n, runner):
        if n == 3:
            resets.append(len(events))
            runner.reset_share_inputs()
            raise StopIteration

    cfg = DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=32, chunk_size=None)
    requests = [Request(f"r{i}", [3 + i, 5, 7], max_tokens=6, eos_token_ids=[2]) for i in range(3)]
    with device_for("sim"), plugin_state(Variant("p", root, True, ALL), "sim"), collecting():
        spies = [_fd_spy(events, module.GPUModelRunner, n) for n in ("insert_tasks_v1", "reset_share_inputs")]
        try:
            run_decode(root, cfg, requests, max_steps=20, on_step=on_step)
        except StopIteration:
            pass
        finally:
            for junction, fd_own in spies:
                junction.set_bottom(fd_own)
    insert = _order(events, ("overlap.flush", "insert_tasks_v1"), ("stop.sync", "insert_tasks_v1"),
                    ("shadow.refresh", "insert_tasks_v1"), ("fd", "insert_tasks_v1"), ("stop.after_insert", ""))
    assert insert == sorted(insert), events[:20]
    assert ("overlap.flag_check", "") in events and ("stop.flag", "not_need_stop") in events
    check = _order(events, ("overlap.flag_check", ""), ("stop.flag", "not_need_stop"))
    assert check[0] < check[1]
    tail = events[resets[0]:]
    reset = _order(tail, ("overlap.flush", "reset_share_inputs"), ("stop.sync", "reset_share_inputs"),
                   ("fd", "reset_share_inputs"), ("stop.reset", ""), ("shadow.load", "reset_share_inputs"))
    assert reset == sorted(reset), tail


def test_fd25_insert_waits_for_the_flag_copy_before_the_shadow_follows_it():
    """FD 2.5, overlap schedule: flag_race's wait for the last post-process event comes first in the
    insert, then step_syncs takes the snapshot that event covers (its reads come after the wait)."""
    root = ROOTS["fd25"]
    cfg = DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=32, chunk_size=None, overlap=True)
    requests = [Request(f"r{i}", [3 + i, 5, 7], max_tokens=3 + i, eos_token_ids=[2]) for i in range(8)]
    with device_for("sim"), plugin_state(Variant("p", root, True, overlap=True), "sim"), collecting() as census:
        run_decode(root, cfg, requests, max_steps=60)  # 8 requests in 4 slots: inserts between steps
    checked = 0
    for step_events in (s.events for s in census.steps):
        sites = [f"{kind} {site}" for kind, site in step_events]
        wait = next((i for i, s in enumerate(sites) if s.startswith("event_wait insert_tasks_v1.post_process")), None)
        read = next((i for i, s in enumerate(sites) if s.startswith("host_read insert_tasks_v1.this_time")), None)
        if wait is not None and read is not None:
            assert wait < read, sites[:6]
            checked += 1
    assert checked, "no insert both waited and took the snapshot"


# -- the step context --------------------------------------------------------------------------------


def test_a_step_is_seen_by_its_own_thread_only_and_nested_steps_start_from_the_outer_one():
    runner_a, runner_b, seen = object(), object(), {}
    inside, done = threading.Event(), threading.Event()

    def other():
        with step.opened(runner_b, count=("shadow", 7)):
            inside.set()
            done.wait(10)
            seen["other"] = (step.current().runner is runner_b, step.current().count, step.current().saves)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    assert step.current() is None  # the other thread's step is not this one's
    with step.opened(runner_a, saves="captured"):
        with step.opened(runner_a, count=("shadow", 3)):
            assert (step.current().saves, step.current().count) == ("captured", ("shadow", 3))
            assert step.prompt_runner() is None
        assert step.current().count is None
        done.set()
        thread.join(10)
    assert step.current() is None
    assert seen["other"] == (True, ("shadow", 7), None)


def test_the_prompt_scope_marks_the_thread_inside_the_method_only():
    seen = []

    def fd(self, hidden_states):
        seen.append(step.prompt_runner())
        return hidden_states

    runner = object()
    assert common._get_prompt_logprobs_list(fd, {}, runner, paddle.ones([1])).shape == [1]
    assert seen == [runner] and step.prompt_runner() is None


def test_no_thread_local_holds_step_state_in_the_patches():
    """Step state lives in ``patches/step.py``'s steps, one per runner call and thread (FD 2.5's
    deferred token-count event included): no ``threading.local`` in the patches."""
    hits = []
    for path in sorted((CHECKOUT / "patches").rglob("*.py")):
        if "threading.local" in path.read_text():
            hits.append(str(path.relative_to(CHECKOUT)))
    assert hits == []


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
    """The sync check's step hook is a link of the same junction, outside the line's function,
    whichever is installed first; each leaves FD's own execute_model when it goes."""
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
        assert list(junction.links) in (["sync_check", "runner"], ["runner", "sync_check"])
        assert junction.head is junction.links["sync_check"]
    finally:
        fd_async_copy_plugin.disable()
        sync_check.uninstall_step_hooks()
    assert vars(module.GPUModelRunner)["execute_model"] is fd_own


# -- docs/architecture.md shows the lines' functions -----------------------------------------------------


def _named_by() -> dict:
    """(line package, function name) -> [(FastDeploy attribute, [features]), ...] from the declarations."""
    import fd_async_copy_plugin.patches as builtin

    found: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    for feature in builtin.fd_async_copy_features():
        for _, package, profiles in LINES:
            applies = [p for p in profiles if feature.profiles.get(p) == "apply"]
            for patch in feature.patches:
                name = getattr(patch.build, "line", None)
                if name is not None and any(patch.profiles is None or p in patch.profiles for p in applies):
                    attr = patch.target.attr
                    target = attr if "." in attr else f"{patch.target.module.rsplit('.', 1)[-1]}.{attr}"
                    found[(package, name)][target].append(feature.name)
    return found


def _body(module) -> str:
    """The module's code without its docstring and imports."""
    source = inspect.getsource(module)
    tree = ast.parse(source)
    lines = source.splitlines()
    start = next(n.lineno for n in tree.body if not isinstance(n, (ast.Expr, ast.Import, ast.ImportFrom)))
    return "\n".join(lines[start - 1:]).strip() + "\n"


def generated() -> str:
    named = _named_by()
    out = [BEGIN, ""]
    for title, package, _ in LINES:
        out += [f"### {title}: `patches/{package}/methods.py`", "",
                "| FastDeploy attribute | the line's function | features with a part there |", "|---|---|---|"]
        module = {"fd24": fd24_methods, "fd25": fd25_methods}[package]
        rows = sorted((target, name, sorted(set(features)))
                      for (pkg, name), targets in named.items() if pkg == package
                      for target, features in targets.items())
        out += [f"| `{target}` | `{name}` | {', '.join(features)} |" for target, name, features in rows]
        out += ["", "```python", _body(module).rstrip(), "```", ""]
    out += ["### Every line: `patches/common.py`", "", "```python", _body(common).rstrip(), "```", "", END]
    return "\n".join(out)


def test_the_architecture_doc_shows_each_lines_functions_as_they_are():
    text = DOC.read_text()
    assert BEGIN in text and END in text, "docs/architecture.md lost its generated part"
    current = text[text.index(BEGIN):text.index(END) + len(END)]
    assert current == generated(), "docs/architecture.md differs from the code: run " \
                                   "python tests/features/test_runner_lines.py --write"


def test_every_function_a_feature_names_exists_on_each_line_it_applies_to():
    named = _named_by()
    for package, name in named:
        module = {"fd24": fd24_methods, "fd25": fd25_methods}[package]
        assert callable(getattr(module, name, None)), (package, name)


def _write() -> None:
    text = DOC.read_text()
    new = generated()
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + new + text[text.index(END) + len(END):]
    else:
        raise SystemExit(f"{DOC} has no generated part: put {BEGIN!r} and {END!r} where it goes")
    DOC.write_text(text)


if __name__ == "__main__" and "--write" in sys.argv:
    _write()
