"""Planted bugs in the ``logprobs`` feature that the simulator must catch loudly.

Each test breaks one small piece of the plugin (monkeypatched for the test only) and runs a real
decode workload on the ``sim`` backend, where a copy lands only when an event recorded after it is
waited on. The run must raise (``PendingCopyError``, ``BufferInUseError``, ``AsyncCopyError``) or
give outputs that differ from unpatched FastDeploy. The control runs the unbroken plugin on the
same workloads and gets bit-identical outputs.

(a) reads before the event; (b) reuses a ring slot one step too early; (c) waits on the wrong
event. (a) and (c) are planted on 2.4, where the logprob event is the only wait before the
consumers; on 2.5 the runner's own ``post_process_event`` wait (recorded after the copies) precedes
every save, which hides them. (b) needs 2.5's overlap schedule, where step N's output is still
referenced when step N+1 gathers.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from copy_path_mutations import read_before_wait, record_event_before_copies
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.patches import logprobs as logprobs_patch
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig
from fd_async_copy_plugin.testing.reference.sampling_math import log_softmax
from fd_async_copy_plugin.runtime import BufferInUseError, PendingCopyError, PinnedRing

FD24, FD25 = ROOTS["fd24"], ROOTS["fd25"]
VOCAB = 512

WORKLOADS = {
    # name: (root, DriverConfig overrides)
    "fd24-save_output_topk": (FD24, {}),
    "fd24-zmq": (FD24, {"save_output_v1": True}),
    "fd25-overlap": (FD25, {"overlap": True}),
    "fd25-overlap-zmq": (FD25, {"overlap": True, "save_output_v1": True}),
}


def _workload(name: str, lpkit):
    root, overrides = WORKLOADS[name]
    if root == FD25:
        lpkit.require_fd25_runner()
    config = DriverConfig(max_num_seqs=4, vocab_size=VOCAB, enable_logprob=True, **overrides)
    return root, config, lpkit.logprob_requests(4, 5, 5, VOCAB)


def _run_planted(name: str, lpkit, unpatched_run):
    """(patched run on sim, unpatched reference); the patched run may raise instead."""
    root, config, requests = _workload(name, lpkit)
    base = unpatched_run(("planted", name), root, config, requests)
    run = lpkit.run_replica(root, config, requests, features=["logprobs"], backend="sim")
    assert run.states["logprobs"] == "applied"
    return run, base


# ---- control -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(WORKLOADS))
def test_control_the_unbroken_plugin_passes_under_the_simulator(name, lpkit, unpatched_run):
    run, base = _run_planted(name, lpkit, unpatched_run)
    run.result.assert_same(base.result)
    assert all(o.finished for o in run.result.outputs.values())
    assert run.ring is not None and run.ring.grow_events == 0


# ---- (a) reads before the event ------------------------------------------------------------------

def _guard_reading_before_the_event(via_fastdeploy_numpy: bool):
    """A save-op guard that hands the op host tensors without waiting on the copy event: through
    the backend (``read``), or as FastDeploy's own ``.numpy()`` would."""

    def build_guard(reader):
        def build(original, ctx):
            if original is None:
                return original

            def guarded(*args, **kwargs):
                backend = ctx.backend

                def host(a):
                    if not backend.is_pinned(a):
                        return a
                    values = a.numpy() if via_fastdeploy_numpy else backend.read(a, reader)
                    return paddle.to_tensor(values)

                return original(*[host(a) for a in args], **kwargs)

            return guarded

        return build

    return build_guard


def test_a_save_guard_reading_before_the_event_raises(replace_build, lpkit, unpatched_run):
    replace_build(logprobs_patch.LogprobsFeature, "save_output_topk", _guard_reading_before_the_event(False))
    with pytest.raises(PendingCopyError, match=r"logprobs\.decode\[\d\]\..*save_output_topk"):
        _run_planted("fd24-save_output_topk", lpkit, unpatched_run)


def test_a_save_guard_reading_pinned_memory_itself_before_the_event_changes_outputs(
        replace_build, lpkit, unpatched_run):
    replace_build(logprobs_patch.LogprobsFeature, "save_output_topk", _guard_reading_before_the_event(True))
    run, base = _run_planted("fd24-save_output_topk", lpkit, unpatched_run)
    differences = run.result.differences(base.result)
    assert any("message" in d for d in differences), differences


def test_a_zmq_slice_rows_reading_before_the_event_raises(monkeypatch, lpkit, unpatched_run):
    real = logprobs_patch.make_async_class

    def make_async_class(base, backend):
        cls = real(base, backend)

        def slice_rows(self, start, end):  # the bug: no wait on the copy event
            return base(*(paddle.to_tensor(backend.read(f, "slice_rows", start, end)) for f in self))

        cls.slice_rows = slice_rows
        return cls

    monkeypatch.setattr(logprobs_patch, "make_async_class", make_async_class)
    with pytest.raises(PendingCopyError, match="slice_rows"):
        _run_planted("fd24-zmq", lpkit, unpatched_run)


# ---- (b) a ring slot reused one step too early ---------------------------------------------------

def _eager_ring(monkeypatch, *, verify: bool = True) -> None:
    """One slot, reused every step without asking whether step N's output is still referenced
    (round robin over a ring one slot too small). ``verify=False`` also removes the ring's last
    check, leaving only the simulator's data to show the damage."""
    monkeypatch.setattr(logprobs_patch, "RING_SLOTS", 1)
    monkeypatch.setattr(PinnedRing, "_select", lambda self: self.slots[self._next % len(self.slots)])
    if not verify:
        monkeypatch.setattr(PinnedRing, "_verify_unreferenced", lambda self, slot, writer: True)


@pytest.mark.parametrize("name", ["fd25-overlap", "fd25-overlap-zmq"])
def test_b_reusing_the_slot_the_deferred_save_still_holds_raises(name, monkeypatch, lpkit, unpatched_run):
    _eager_ring(monkeypatch)
    with pytest.raises(BufferInUseError, match=r"pinned ring 'logprobs.decode'.*reused too early"):
        _run_planted(name, lpkit, unpatched_run)


def _gather_inputs(seed: int):
    rng = np.random.default_rng(seed)
    logprobs = log_softmax(paddle.to_tensor(rng.standard_normal((4, VOCAB)).astype("float32")))
    tokens = paddle.to_tensor(rng.integers(0, VOCAB, size=(4, 1)), dtype="int64")
    return logprobs, tokens


@pytest.mark.parametrize("broken", [False, True], ids=["control", "eager_ring"])
def test_b_a_deferred_consumer_of_an_overwritten_slot_reads_the_next_steps_data(
        broken, plugin_off, monkeypatch, lpkit):
    """The 2.5 overlap pattern, on the sampler directly: step N's result is consumed after step
    N+1 gathered. With the slot reused, step N's consumer gets step N+1's logprobs."""
    if broken:
        _eager_ring(monkeypatch, verify=False)
    sampler_mod = lpkit.replica_module(FD24, "model_executor.layers.sample.sampler")
    lpkit.replica_module(FD24, "worker.gpu_model_runner")
    original = sampler_mod.Sampler.gather_logprobs
    fd_async_copy_plugin.enable(features=["logprobs"], backend="sim", root=FD24)
    sampler = sampler_mod.Sampler(fd_config=None)
    (lp_n, tok_n), (lp_next, tok_next) = _gather_inputs(1), _gather_inputs(2)
    expected_n = [f.numpy() for f in original(sampler, lp_n.clone(), 5, tok_n)]
    step_n = sampler.gather_logprobs(lp_n.clone(), 5, tok_n)  # held for the deferred save
    sampler.gather_logprobs(lp_next.clone(), 5, tok_next)
    saved = [f.numpy() for f in step_n.materialize("deferred save")]
    same = all(np.array_equal(a, b) for a, b in zip(saved, expected_n))
    assert same is not broken


# ---- (c) a wait on the wrong event ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["fd24-save_output_topk", "fd24-zmq"])
def test_c_a_consumer_waiting_on_an_event_recorded_before_the_copies_raises(name, monkeypatch, lpkit,
                                                                            unpatched_run):
    """The consumer's wait covers none of the step's copies (waiting on an earlier event is not
    waiting at all): the read is caught by the fake runtime."""
    read_before_wait(monkeypatch)
    with pytest.raises(PendingCopyError, match=r"before the copy 'gather_logprobs\."):
        _run_planted(name, lpkit, unpatched_run)


@pytest.mark.parametrize("name", ["fd24-save_output_topk", "fd24-zmq"])
def test_c_a_producer_recording_its_event_before_the_copies_raises(name, monkeypatch, lpkit, unpatched_run):
    """The copy set's event recorded before its copies (a mutation of the C call): it covers none."""
    record_event_before_copies(monkeypatch)
    with pytest.raises(PendingCopyError, match=r"before the copy 'gather_logprobs\."):
        _run_planted(name, lpkit, unpatched_run)
