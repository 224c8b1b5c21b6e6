"""The TP checks catch what they are for (issue 39): a rank that decides otherwise than the others, a
rank that never reaches a collective (a hang made a failure with every rank's stack), and the
plugin's step gate that must let the ranks' steps run side by side (their forwards meet in the
all-reduce). Planted faults on the real replica; real CPU Paddle."""

from __future__ import annotations

import sys
import threading
import time

import pytest

import fd_async_copy_plugin

from fd_async_copy_plugin.registry.patch import StepGate
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference import tp as tpm
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request

pytestmark = pytest.mark.usefixtures("plugin_off")

FD24 = ROOTS["fd24"]


def _small():
    cfg = DriverConfig(max_num_seqs=4, vocab_size=256, max_model_len=32, enable_logprob=True)
    requests = [Request(f"c{i}", [5 + i, 7, 9 + i], max_tokens=3 + 2 * i, eos_token_ids=[2], logprobs=5)
                for i in range(3)]
    return cfg, requests


def _runner_class():
    import importlib

    return importlib.import_module(FD24 + ".worker.gpu_model_runner").GPUModelRunner


def test_a_rank_answering_not_need_stop_otherwise_fails_at_once(monkeypatch):
    """Rank 1's worker loop gets False from ``not_need_stop()`` on its 4th question (as a decision on an event's timing
    could): it goes to the idle barrier while rank 0 enters the forward's all-reduce. On GPUs that
    hangs; here every rank fails at that collective, naming both."""
    cls = _runner_class()
    original = cls.not_need_stop
    calls = {}

    def planted(self):
        rank = self.parallel_config.tensor_parallel_rank
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name not in ("_rank_loop", "execute_model"):
            frame = frame.f_back
        if frame is not None and frame.f_code.co_name == "_rank_loop":  # the worker loop's question
            calls[rank] = calls.get(rank, 0) + 1
            if rank == 1 and calls[rank] == 4:
                return False
        return original(self)

    monkeypatch.setattr(cls, "not_need_stop", planted)
    cfg, requests = _small()
    with tpm.tp_backends(2):  # (the plugin's stop_flag answers from its own flag: FD's method is not asked)
        with pytest.raises(tpm.CollectiveMismatch) as caught:
            tpm.run_decode_tp(FD24, cfg, 2, requests, timeout=5.0)
    message = str(caught.value)
    assert "rank 0: all_reduce(forward)" in message and "rank 1: barrier 'idle" in message, message


def test_a_rank_inserting_other_tasks_is_reported(monkeypatch):
    """The per-iteration record: a rank that inserts a different task batch (here rank 1 drops one
    request of the first batch) shows in ``asymmetries`` - or, as its forward then has other rows,
    fails at the all-reduce."""
    cls = _runner_class()
    original = cls.insert_tasks_v1

    def planted(self, req_dicts, num_running_requests):
        if self.parallel_config.tensor_parallel_rank == 1 and len(req_dicts) > 1:
            req_dicts = req_dicts[:-1]
        return original(self, req_dicts, num_running_requests)

    monkeypatch.setattr(cls, "insert_tasks_v1", planted)
    cfg, requests = _small()
    with tpm.tp_backends(2):
        with pytest.raises(tpm.CollectiveMismatch, match="all_reduce"):
            tpm.run_decode_tp(FD24, cfg, 2, requests, timeout=5.0)


def test_a_rank_that_never_comes_is_a_hang_with_every_rank_stack(monkeypatch):
    """Rank 1 stalls in its forward (a GPU that never finishes): rank 0 waits at the all-reduce. The
    run's timeout turns that into ``RankHang`` naming the waiting collective, with both ranks' stacks."""
    import fd_async_copy_plugin.testing.reference.tiny_model as tiny

    original = tiny.all_reduce
    stalled = threading.Event()

    def planted(hidden, ids):
        if threading.current_thread().name == "tp-rank1" and not stalled.is_set():
            stalled.set()
            time.sleep(2.5)
        return original(hidden, ids)

    monkeypatch.setattr(tiny, "all_reduce", planted)
    cfg, requests = _small()
    started = time.monotonic()
    with tpm.tp_backends(2):
        with pytest.raises(tpm.RankHang) as caught:
            tpm.run_decode_tp(FD24, cfg, 2, requests, timeout=1.0)
    message = str(caught.value)
    assert "rank 0 waited 1 s at 'all_reduce(forward)'" in message, message
    assert "--- rank 0 (tp-rank0) ---" in message and "--- rank 1 (tp-rank1) ---" in message, message
    assert "planted" in message  # rank 1's stack shows where it is
    assert time.monotonic() - started < 10


def test_step_sections_of_two_threads_run_side_by_side():
    """Two threads' step sections meet inside (a collective in each rank's forward): with one lock for
    every section (the gate before issue 39) the second never enters and both wait forever."""
    gate = StepGate(timeout=5.0)
    meet = threading.Barrier(2, timeout=2.0)
    errors = []

    def step():
        try:
            gate.run(meet.wait)
        except threading.BrokenBarrierError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=step) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5.0)
    assert not errors


def test_a_change_waits_for_every_thread_section_and_sections_wait_for_a_change():
    gate = StepGate(timeout=5.0)
    order = []
    inside, release = threading.Event(), threading.Event()

    def step():
        inside.set()
        release.wait(5.0)
        order.append("step end")

    thread = threading.Thread(target=gate.run, args=(step,))
    thread.start()
    inside.wait(5.0)
    timer = threading.Timer(0.2, release.set)
    timer.start()
    with gate.change():  # waits for the other thread's section
        order.append("change")
        entered = threading.Event()
        late = threading.Thread(target=gate.run, args=(entered.set,))
        late.start()
        assert not entered.wait(0.2)  # a section does not start while the patches change
    assert entered.wait(5.0)
    thread.join(5.0)
    late.join(5.0)
    assert order == ["step end", "change"]


def test_a_change_within_a_section_of_its_own_thread_and_the_timeout():
    gate = StepGate(timeout=0.1)
    def own_change():
        with gate.change():  # re-entrant: the section's own thread may change the patches
            gate.run(lambda: None)

    gate.run(own_change)
    held = threading.Event()
    done = threading.Event()

    def stuck():
        held.set()
        done.wait(5.0)

    thread = threading.Thread(target=gate.run, args=(stuck,))
    thread.start()
    held.wait(5.0)
    started = time.monotonic()
    with gate.change():  # a step that does not end: the change goes ahead after the timeout
        pass
    assert time.monotonic() - started < 2.0
    done.set()
    thread.join(5.0)


@pytest.mark.parametrize("speeds", [[1, 1], [1, 3]])
def test_a_plugin_decision_on_an_event_timing_is_caught_at_different_speeds(monkeypatch, speeds):
    """A planted plugin bug of the class issue 39 is about: overlap's ``not_need_stop()`` answers True
    while the last step's save is pending only if that step's copies are still in flight (``query``),
    else saves at once and answers the flag. With both devices fast the ranks agree (the bug hides);
    with rank 1 at 3x, when the batch drains rank 0 goes idle while rank 1 runs the flush step: the
    run fails where their loops part."""
    from fd_async_copy_plugin.patches.fd24 import overlap

    def flag_check(state):
        if state.in_step and not state.after_forward:
            state.after_forward = True
            state.flush("after forward")
        elif state.pending and not state.in_step:
            event = state.backend.event_of(state.pending[-1][3])
            if event is not None and not state.backend.query(event):
                return True  # still in flight: keep the loop going
            state.flush("landed")  # landed already: save now and answer the flag
        return False

    monkeypatch.setattr(overlap.OverlapState, "flag_check", flag_check)  # what not_need_stop() consults
    cfg, requests = _small()
    with tpm.enable_tp(2, ["all", "overlap"], FD24):
        if speeds == [1, 1]:
            run = tpm.run_decode_tp(FD24, cfg, 2, requests, timeout=5.0, speeds=speeds)
            assert not run.asymmetries() and run.backends[1].queries["complete"] > 0
        else:
            with pytest.raises(tpm.CollectiveMismatch) as caught:
                tpm.run_decode_tp(FD24, cfg, 2, requests, timeout=5.0, speeds=speeds)
            assert "rank 0: barrier 'idle" in str(caught.value) and "rank 1: all_reduce" in str(caught.value)


def test_a_runner_post_process_leaves_another_runner_flag_alone():
    """Two runners of one process (two ranks' runners on threads), stepped one after the other: rank
    0's step leaves its stop-flag copy pending (overlap: its save comes a step later); rank 1's
    ``post_process`` must make only its own flag current. Before issue 39 it synced every runner's,
    reading rank 0's pinned flag through rank 1's backend (``ValueError``: not its buffer)."""
    from fd_async_copy_plugin.patches.runner import part
    from fd_async_copy_plugin.testing.reference import driver, paddle_device

    cfg, requests = _small()
    mod = driver._Modules(FD24)
    with tpm.enable_tp(2, ["all", "overlap"], FD24), driver._environment(cfg), paddle_device.routed():
        backends = tpm._current_backends()
        tpm._per_rank_process_state(backends)  # (the logprobs rings, one per rank's process)
        runners = []
        for rank in range(2):
            fd_config = driver._fd_config(mod, cfg, next(driver._QUEUE_IDS))
            fd_config.parallel_config.tensor_parallel_rank = rank
            with backends.rank(rank):
                runners.append(mod.runner.GPUModelRunner(fd_config, device="gpu", device_id=rank, rank=rank,
                                                         local_rank=rank))
                runners[-1].load_model()
        sched = driver._Scheduler(mod, cfg, runners[0].fd_config)
        for user in requests:
            sched.add(user)
        tasks, bsz = sched.schedule(), sched.real_bsz()
        for rank, runner in enumerate(runners):
            with backends.rank(rank):
                runner.insert_tasks_v1(tpm.copy.deepcopy(tasks), bsz)
                runner.execute_model(None, bsz)
                assert part(runner, "stop").flag_pending and part(runner, "overlap").pending
        for rank, runner in enumerate(runners):
            with backends.rank(rank):
                runner.close() if hasattr(runner, "close") else None


def test_overlap_runs_on_every_rank_or_none(monkeypatch):
    """stop_flag stands down on rank 1 only (as its device's probe failing would make it): overlap,
    which needs it, cannot run there - and then runs on no rank (the ranks agree at runner
    construction, ``overlap.ranks_agree``). Before issue 39 rank 0 overlapped alone: when the batch
    drained it ran a flush step while rank 1 waited at the idle barrier (``CollectiveMismatch``).
    The outputs are then unpatched FD 2.4's, step for step."""
    from fd_async_copy_plugin.patches.fd24 import overlap, stop_flag

    original = stop_flag.StopFlagRunners.add

    def planted(self, runner, state):
        if runner.parallel_config.tensor_parallel_rank == 1:
            return self.stand_down(runner, "planted: the stop-flag probe failed on this GPU")
        return original(self, runner, state)

    monkeypatch.setattr(stop_flag.StopFlagRunners, "add", planted)
    cfg, requests = _small()
    with tpm.tp_backends(2):
        base = tpm.run_decode_tp(FD24, cfg, 2, requests, timeout=5.0)
    with tpm.enable_tp(2, ["all", "overlap"], FD24):
        run = tpm.run_decode_tp(FD24, cfg, 2, requests, timeout=5.0)
        status = fd_async_copy_plugin.status()["features"]
    assert run.collective_kinds.get("reduce_min") == 1  # the agreement, once, every rank
    base.result.assert_same(run.result)
    assert not run.asymmetries()
    assert status["overlap"]["state"] == "passthrough", status["overlap"]
    reasons = sorted(r["reason"] for r in status["overlap"]["runners"])
    assert reasons == sorted([overlap.ANOTHER_RANK, "needs stop_flag and step_syncs on this runner"]), reasons
    assert status["stop_flag"]["state"] == "partial"  # (stop_flag itself decides nothing that steers the loop)


def test_overlap_agreement_is_made_once_and_every_rank_overlaps():
    cfg, requests = _small()
    with tpm.enable_tp(2, ["all", "overlap"], FD24):
        run = tpm.run_decode_tp(FD24, cfg, 2, requests, timeout=5.0)
        status = fd_async_copy_plugin.status()["features"]
    assert run.collective_kinds.get("reduce_min") == 1 and status["overlap"]["state"] == "applied"
