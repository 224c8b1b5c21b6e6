"""Issue 25 item 1: with ``overlap``, ``disable()`` (or ``enable()`` with other features) from another
thread at any moment of a step loses no output and never hangs.

``enable()``/``disable()`` wait for a runner step in flight to end (``registry.patch.STEP_GATE``):
each case calls them from another thread at one moment of one step (the save captured, the last
step's save about to run after the forward, right after the update op, the step's end), lets the
step go on, and checks that the change was made after that step, that every request finished with
exactly the tokens and logprobs of unpatched FastDeploy 2.4 within the step bound, and that nothing
hung. A free-running case calls them at random moments. A planted gate that lets a change land
mid-step is caught.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.patches.fd24 import overlap as overlap_patch
from fd_async_copy_plugin.patches.fd24 import stop_flag as stop_flag_patch
from fd_async_copy_plugin.runtime import collecting
from fd_async_copy_plugin.testing.harness import Variant, device_for, plugin_state, run_variant
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

pytestmark = pytest.mark.usefixtures("plugin_off")

FD24 = ROOTS["fd24"]
OVERLAP = ("logprobs", "stop_flag", "sampled_tokens", "step_syncs", "overlap")
BACKPORT = ("logprobs", "stop_flag", "sampled_tokens", "step_syncs")
CFG = DriverConfig(max_num_seqs=8, vocab_size=256, max_model_len=64, chunk_size=8, enable_logprob=True,
                   max_logprobs=5)
MAX_STEPS = 120


def _requests():
    return [Request(f"d{i}", [(17 * i + 5 * j) % 200 + 3 for j in range(3 + i)], max_tokens=6 + i % 5,
                    eos_token_ids=[2], logprobs=5 if i % 2 else None) for i in range(8)]


def _per_request(result) -> dict:
    return {rid: (o.token_ids, o.finished, [(x.token_ids, x.logprobs, x.rank) for x in o.logprobs])
            for rid, o in result.outputs.items()}


@pytest.fixture(scope="module")
def unpatched():
    return _per_request(run_variant(Variant("fd24", FD24, False), CFG, _requests(), backend="sim",
                                    max_steps=MAX_STEPS).result)


def _in_other_thread(action) -> threading.Thread:
    errors = []

    def run():
        try:
            action()
        except BaseException as exc:  # reported on the decode thread
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.errors = errors
    worker.start()
    return worker


MOMENTS = {
    # (class, method, call before (True) or after the method)
    "save captured": (overlap_patch.OverlapState, "capture", False),
    "before the last step's save runs after the forward": (overlap_patch.OverlapState, "flush", True),
    "right after the update op": (stop_flag_patch.StopFlagState, "after_update", False),
    "step end": (overlap_patch.OverlapState, "end_step", True),
}


@pytest.mark.parametrize("then_enable", [False, True], ids=["disable", "disable+enable backport"])
@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("backend", ["host", "sim"])
def test_disable_at_a_moment_of_an_overlap_step_loses_nothing(monkeypatch, unpatched, moment, then_enable, backend):
    owner, name, before = MOMENTS[moment]
    original = getattr(owner, name)
    rng = random.Random(hash((moment, then_enable, backend)) & 0xFFFF)
    fired, calls = [], [0]
    when = rng.randrange(2, 9)

    def action():
        fd_async_copy_plugin.disable()
        if then_enable:
            fd_async_copy_plugin.enable(features=BACKPORT, backend=backend, root=FD24)

    def hooked(self, *args, **kwargs):
        calls[0] += 1
        if before and calls[0] == when and not fired:
            fired.append(_in_other_thread(action))
            time.sleep(0.05)  # the change is waiting for this step: it must not land inside it
            assert fd_async_copy_plugin.status()["enabled"] or then_enable
        result = original(self, *args, **kwargs)
        if not before and calls[0] == when and not fired:
            fired.append(_in_other_thread(action))
        return result

    monkeypatch.setattr(owner, name, hooked)
    with device_for(backend), plugin_state(Variant("p", FD24, True, OVERLAP), backend), collecting():
        result = run_decode(FD24, CFG, _requests(), max_steps=MAX_STEPS)
        assert fired, f"{moment} never happened"
        fired[0].join(30)
        assert not fired[0].is_alive(), "disable()/enable() hung"
        assert not fired[0].errors, fired[0].errors
        assert fd_async_copy_plugin.status()["enabled"] == then_enable
    assert not result.truncated, "a request never finished"
    assert _per_request(result) == unpatched


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_disable_past_the_gate_timeout_still_loses_nothing(monkeypatch, unpatched, moment):
    """A step that outlives ``STEP_GATE.timeout`` (a stuck GPU) lets ``disable()`` go ahead inside
    it: the step's captured saves still go out (``OverlapState.end_step``) and the rest is FD's."""
    from fd_async_copy_plugin.registry import patch as patch_module

    monkeypatch.setattr(patch_module.STEP_GATE, "timeout", 0.0)
    owner, name, before = MOMENTS[moment]
    original, calls, fired = getattr(owner, name), [0], []

    def hooked(self, *args, **kwargs):
        calls[0] += 1
        if before and calls[0] == 3 and not fired:
            fired.append(_in_other_thread(fd_async_copy_plugin.disable))
            fired[0].join(30)
        result = original(self, *args, **kwargs)
        if not before and calls[0] == 3 and not fired:
            fired.append(_in_other_thread(fd_async_copy_plugin.disable))
            fired[0].join(30)
        return result

    monkeypatch.setattr(owner, name, hooked)
    with device_for("sim"), plugin_state(Variant("p", FD24, True, OVERLAP), "sim"), collecting():
        result = run_decode(FD24, CFG, _requests(), max_steps=MAX_STEPS)
    assert fired and not fired[0].is_alive() and not fired[0].errors
    assert not result.truncated, "a request never finished"
    assert _per_request(result) == unpatched


@pytest.mark.parametrize("gate", [True, False], ids=["gated", "planted: no gate"])
def test_a_flip_while_fd_builds_the_runner(monkeypatch, unpatched, gate):
    """``disable()`` + ``enable()`` on another thread while FastDeploy constructs the runner (its
    ``_init_share_inputs``): with the gate the flip lands after the construction and the run is
    FD 2.4's; without it (planted) the runner is left half-patched and the run breaks."""
    from fd_async_copy_plugin.registry import patch as patch_module

    if not gate:
        monkeypatch.setattr(patch_module.STEP_GATE, "change", contextlib.nullcontext)
    original, fired = stop_flag_patch.StopFlagState.__init__, []

    def flip():
        fd_async_copy_plugin.disable()
        fd_async_copy_plugin.enable(features=OVERLAP, backend="sim", root=FD24)

    def hooked(self, *args, **kwargs):
        if not fired:
            fired.append(_in_other_thread(flip))
            if not gate:
                fired[0].join(30)  # lands inside the construction
        return original(self, *args, **kwargs)

    monkeypatch.setattr(stop_flag_patch.StopFlagState, "__init__", hooked)
    with device_for("sim"), plugin_state(Variant("p", FD24, True, OVERLAP), "sim"), collecting():
        try:
            result = run_decode(FD24, CFG, _requests(), max_steps=MAX_STEPS)
            same = not result.truncated and _per_request(result) == unpatched
        except Exception:
            same = False
        fired[0].join(30)
    assert fired and not fired[0].is_alive() and not fired[0].errors
    assert same == gate


@pytest.mark.parametrize("seed", range(6))
def test_disable_and_enable_at_random_moments_lose_nothing(unpatched, seed):
    """Free-running: another thread flips the plugin at random moments while the decode runs."""
    _flip_at_random(seed, unpatched)


def _flip_at_random(seed, unpatched):
    rng = random.Random(seed)
    stop = threading.Event()
    flips = [0]

    def flipper():
        while not stop.is_set():
            time.sleep(rng.uniform(0, 0.004))
            if rng.random() < 0.5:
                fd_async_copy_plugin.disable()
            else:
                fd_async_copy_plugin.enable(features=OVERLAP, backend="sim", root=FD24)
            flips[0] += 1

    worker = threading.Thread(target=flipper)
    with device_for("sim"), plugin_state(Variant("p", FD24, True, OVERLAP), "sim"), collecting():
        worker.start()
        try:
            result = run_decode(FD24, CFG, _requests(), max_steps=MAX_STEPS)
        finally:
            stop.set()
            worker.join(30)
    assert not worker.is_alive() and flips[0] > 0
    assert not result.truncated, "a request never finished"
    assert _per_request(result) == unpatched
