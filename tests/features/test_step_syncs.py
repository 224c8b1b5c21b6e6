"""Feature ``step_syncs``: one host wait per FastDeploy 2.4 decode step, outputs bit-identical.

Real CPU Paddle, the fd24 replica, ``host`` and ``sim`` backends. Every comparison asserts that the
plugin's path ran (the shadow served S1/S2/S3/I1, the seed lives on the device), so a run that
quietly handed the step back to FastDeploy cannot pass as identical.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.patches.fd24 import step_syncs
from fd_async_copy_plugin.runtime import collecting
from fd_async_copy_plugin.runtime.backend import BufferInUseError
from fd_async_copy_plugin.testing.harness import Variant, device_for, host_waits, plugin_state, run_variant
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode
from fd_async_copy_plugin.patches.runner import part
# the workload where preemption empties the running batch, and the record of its steps
from test_overlap import assert_emptied_by_preemption, emptied_by_preemption_workload
from test_overlap import schedule_log  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("plugin_off")

FD24 = ROOTS["fd24"]
BACKPORT = ("logprobs", "stop_flag", "sampled_tokens")
WITH_SYNCS = BACKPORT + ("step_syncs",)
EOS = [2]


def _req(i, n_prompt, max_tokens, **kw):
    prompt = [(13 * i + 7 * j) % 200 + 3 for j in range(n_prompt)]
    return Request(f"q{i}", prompt, max_tokens=max_tokens, eos_token_ids=EOS, **kw)


def workload(batch: int, *, logprobs=(None,), steps: int = 16, arrive_every_step: bool = True):
    """Mixed requests: seeds with top-p sampling, bad-word lists, stop sequences, max_tokens=1,
    long prompts (chunked prefill), and arrivals on every step."""
    def make(i):
        kw = dict(logprobs=logprobs[i % len(logprobs)])
        if i % 3 == 0:
            kw.update(top_p=0.8, seed=1000 + i)  # seeded sampling: the device seed decides the token
        elif i % 3 == 1:
            kw.update(top_p=0.6)  # FastDeploy's default seed, incremented every step
        if i % 4 == 0:
            kw.update(bad_words=[(i * 5 + k) % 200 + 3 for k in range(1 + i % 5)])
        if i % 5 == 2:
            kw.update(stop_seqs=[[(13 * i) % 200 + 3, 7]])
        max_tokens = 1 if i % 7 == 3 else steps - i % 5
        return _req(i, 3 + (i * 7) % 23, max_tokens, **kw)

    first = min(batch, 6)
    requests = [make(i) for i in range(first)]
    arrivals = {}
    if arrive_every_step:
        n = first
        for step in range(1, steps):
            arrivals[step] = [make(n)]
            n += 1
    return requests, arrivals


def config(batch, **kw):
    kw.setdefault("vocab_size", 256)
    kw.setdefault("max_model_len", 64)
    kw.setdefault("chunk_size", 8)
    return DriverConfig(max_num_seqs=batch, **kw)


def run_pair(cfg, requests, arrivals, backend, features=WITH_SYNCS, max_steps=120):
    base = run_variant(Variant("fd24-unpatched", FD24, False), cfg, requests, backend=backend,
                       arrivals=arrivals, max_steps=max_steps)
    served = collections.Counter()
    fallbacks = collections.Counter()

    def on_step(step, runner):
        state = part(runner, "syncs")
        if state is not None:
            served.clear()
            served.update(state.shadow.served)
            fallbacks.clear()
            fallbacks.update(state.shadow.fallbacks)
            assert state.increment is runner.infer_seed_increment  # T: the device increment is in use

    with device_for(backend), plugin_state(Variant("p", FD24, True, features), backend) as status, collecting():
        assert status["features"]["step_syncs"]["state"] == "pending" or "applied"
        plugin = run_decode(FD24, cfg, requests, arrivals=arrivals, max_steps=max_steps, on_step=on_step)
    base.result.assert_same(plugin)
    return plugin, served, fallbacks



def _keys_through_the_view(monkeypatch) -> collections.Counter:
    """The share_inputs keys read through a view while a step's S1 count is armed (``_prepare_inputs``)."""
    from fd_async_copy_plugin.patches import _tensor_watch
    from fd_async_copy_plugin.patches.step import current

    seen, real = collections.Counter(), _tensor_watch.ScopedInputs.__getitem__

    def counting(self, key):
        step = current()
        if step is not None and step.count is not None:
            seen[key] += 1
        return real(self, key)

    monkeypatch.setattr(_tensor_watch.ScopedInputs, "__getitem__", counting)
    return seen


def test_s2s_view_comes_after_get_padding_offset(monkeypatch):
    """``_prepare_inputs`` reads its step state (``recover_decode_task``'s arguments, ``pre_process``'s
    inputs) from FastDeploy's dict: S2's view comes after ``get_padding_offset``, and S2 is served."""
    seen = _keys_through_the_view(monkeypatch)
    requests, arrivals = workload(7)
    result, served, fallbacks = run_pair(config(7), requests, arrivals, "sim")
    assert served["S2 bad_tokens_len"] >= result.executed_steps - 1 and seen["bad_tokens_len"] > 0, (served, seen)
    assert not {"stop_flags", "seq_lens_encoder", "input_ids"} & set(seen), seen


def test_without_s1s_count_s2s_view_comes_with_the_call(monkeypatch):
    from fd_async_copy_plugin.patches.fd24 import step_syncs as fd24_syncs

    monkeypatch.setattr(fd24_syncs.StepShadow, "recover_and_count", lambda self, num_running: None)
    requests, arrivals = workload(7)
    result, served, fallbacks = run_pair(config(7), requests, arrivals, "sim")
    assert served["S1 token count"] == 0 and fallbacks["S1: the shadow cannot tell the count"] > 0
    assert served["S2 bad_tokens_len"] >= result.executed_steps - 1, served

@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("batch", [1, 7, 128, 1024])
def test_bit_identical_over_mixed_workloads(backend, batch):
    requests, arrivals = workload(batch, steps=14 if batch > 100 else 18)
    cfg = config(batch)
    result, served, fallbacks = run_pair(cfg, requests, arrivals, backend)
    assert result.executed_steps > 5
    # the patched path ran: every point was answered on the host
    assert served["S1 token count"] >= result.executed_steps - 1, served
    assert served["S2 bad_tokens_len"] >= result.executed_steps - 1, served
    assert served["S3/S7 exist_prefill"] >= result.executed_steps, served
    assert set(fallbacks) == {"shadow loaded (construction)"}, fallbacks


#: the selftest's block-step set-up: 14 KV blocks of 16 tokens for 7+ requests of up to 128 tokens
BLOCKY = config(8, max_model_len=128, vocab_size=1024, num_gpu_blocks=14)


def block_step_workload(steps=48):
    def req(i, n_prompt, max_tokens, **kw):
        return _req(i, n_prompt, max_tokens, top_p=0.7, seed=i, **kw)

    requests = [req(0, 5, steps), req(1, 9, steps // 2), req(2, 20, 1), req(3, 13, steps, stop_seqs=[[17, 23]]),
                req(4, 3, steps - 5), req(5, 30, steps // 3), req(6, 7, steps)]
    return requests, {3: [req(7, 11, steps // 2)], 9: [req(8, 4, 3)]}


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_block_steps_and_recovery_are_served_from_the_shadow(backend):
    # Few KV blocks: requests block (is_block_step), get DECODE tasks and are recovered.
    requests, arrivals = block_step_workload()
    result, served, fallbacks = run_pair(BLOCKY, requests, arrivals, backend, max_steps=300)
    assert served["I1 is_block_step read"] > 0, served  # DECODE tasks happened and were answered
    assert served["I1 block-table rows staged"] > 0, served
    assert set(fallbacks) == {"shadow loaded (construction)"}, fallbacks


def test_an_insert_writes_block_table_rows_into_the_mirror_and_reads_the_block_step_flag_as_a_host_value(
        monkeypatch):
    """Inside FD's insert (its thread): ``share_inputs["block_tables"]`` is the pinned mirror's numpy
    array (FD's row writes cost no Python call) and the I1 read answers a host value, no framework
    tensor; the unpatched reference run sees tensors at the same points. Each insert's changed rows
    go to the device in one copy."""
    from fd_async_copy_plugin.runtime.backend import CopyBackend

    module = __import__(f"{FD24}.worker.gpu_model_runner", fromlist=["GPUModelRunner"])
    fd_insert = vars(module.GPUModelRunner)["insert_tasks_v1"]
    seen, copies, flushes = collections.Counter(), [], []

    def insert_tasks_v1(self, req_dicts, num_running_requests=None):
        si = self.share_inputs
        seen["tables", type(si["block_tables"]).__name__] += 1
        seen["block_step", type(si["is_block_step"][0]).__name__] += 1
        return fd_insert(self, req_dicts, num_running_requests)

    copy_h2d, flush = CopyBackend.copy_h2d, step_syncs.StepShadow.flush

    def counted_flush(self):
        before = len(copies)
        flush(self)
        flushes.append(len(copies) - before)

    def counted(self, dst, device, src, offset, nbytes, label):
        if label == "step_syncs.block_tables":
            copies.append(nbytes)
        return copy_h2d(self, dst, device, src, offset, nbytes, label)

    monkeypatch.setattr(module.GPUModelRunner, "insert_tasks_v1", insert_tasks_v1)
    monkeypatch.setattr(CopyBackend, "copy_h2d", counted)
    monkeypatch.setattr(step_syncs.StepShadow, "flush", counted_flush)
    requests, arrivals = block_step_workload()
    _, served, fallbacks = run_pair(BLOCKY, requests, arrivals, "sim", max_steps=300)
    inserts = seen["tables", "Tensor"]  # the reference run's inserts; the plugin's made as many
    assert inserts > 0 and seen == {("tables", "Tensor"): inserts, ("tables", "ndarray"): inserts,
                                    ("block_step", "Tensor"): inserts, ("block_step", "ndarray"): inserts}, seen
    assert copies and max(flushes) == 1, flushes  # one copy per insert, from the first changed row to the last
    assert served["I1 block-table rows staged"] > 0 and set(fallbacks) == {"shadow loaded (construction)"}


def test_exist_prefill_asks_the_steps_own_verdict_on_the_shadow(monkeypatch):
    """``shadow_not_exact`` (FD's switch, the runner's configuration, the update op's junction) is
    asked once per ``_prepare_inputs`` and per insert; ``exist_prefill()``, twice a step after it,
    reads that step's answer instead of asking again."""
    asked = collections.Counter()
    fd_not_exact = step_syncs.shadow_not_exact

    def counted(runner, *modules):
        asked["asked"] += 1
        return fd_not_exact(runner, *modules)

    for name in ("step_count", "inserting", "exist_prefill"):
        real = getattr(step_syncs, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            asked[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(step_syncs, name, spy)
    monkeypatch.setattr(step_syncs, "shadow_not_exact", counted)
    requests, arrivals = workload(7, steps=10)
    _, served, _ = run_pair(config(7), requests, arrivals, "sim")
    assert served["S3/S7 exist_prefill"] >= asked["exist_prefill"] > 0, (served, asked)
    assert asked["asked"] == asked["step_count"] + asked["inserting"], asked


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("blocks, lag", [(10, 0), (12, 0), (12, 1)])
def test_preemption_mid_flight_is_followed_by_the_shadow(backend, blocks, lag):
    """PREEMPTED inserts (stop flag, lengths and block-table row reset in the victim's slot) and the
    victim's second prefill of prompt + received tokens go through the shadow like any insert."""
    from fd_async_copy_plugin.testing.harness import preemption_workload

    cfg, requests, arrivals = preemption_workload(num_gpu_blocks=blocks, engine_lag=lag)
    result, served, fallbacks = run_pair(cfg, requests, arrivals, backend, max_steps=400)
    assert result.preemptions >= 4 and all(o.finished for o in result.outputs.values())
    assert served["S1 token count"] >= result.executed_steps - 1, served
    assert served["I1 block-table rows staged"] > 0, served
    assert set(fallbacks) == {"shadow loaded (construction)"}, fallbacks


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("lag", [0, 1])
def test_a_batch_emptied_by_preemption_is_followed_by_the_shadow(backend, lag, schedule_log):
    """Issue 25's all-preempted batch, as close as the driver gets (test_overlap.py says why no step
    preempts every running request): two of three running requests preempted in one step, the
    survivor finishes, no request runs while only the victims are left (with the engine one step
    behind, an empty batch runs on the device), then both are prefilled again and finish."""
    cfg, requests, arrivals = emptied_by_preemption_workload()
    cfg = dataclasses.replace(cfg, engine_lag=lag)
    result, served, fallbacks = run_pair(cfg, requests, arrivals, backend, max_steps=200)
    base_log, plugin_log = schedule_log  # the unpatched run, then the plugin's: the same steps
    assert base_log == plugin_log
    idle = assert_emptied_by_preemption(plugin_log, result)
    assert bool(idle) == bool(lag), idle  # FD's engine one step behind: nothing ran for a step
    assert result.preemptions >= 3 and all(o.finished for o in result.outputs.values())
    assert served["S1 token count"] >= result.executed_steps - 1, served
    assert served["S3/S7 exist_prefill"] >= result.executed_steps, served
    assert served["I1 block-table rows staged"] > 0, served
    assert set(fallbacks) == {"shadow loaded (construction)"}, fallbacks


@pytest.mark.parametrize("logprobs", [(0,), (1,), (20,), (-1,), (None, 5, 20, 0)])
def test_every_logprob_width(logprobs):
    requests, arrivals = workload(7, logprobs=logprobs, steps=12)
    cfg = config(7, enable_logprob=True, save_output_v1=-1 in logprobs, max_logprobs=20)
    _, served, _ = run_pair(cfg, requests, arrivals, "sim")
    assert served["S1 token count"] > 0


def _census(features, logprobs=None, backend="sim"):
    cfg = config(8, chunk_size=None, enable_logprob=logprobs is not None)
    requests = [_req(i, 4 + i, 20, logprobs=logprobs, top_p=0.9, seed=i) for i in range(6)]
    run = run_variant(Variant("p", FD24, features is not None, features), cfg, requests, backend=backend,
                      max_steps=40, track=True)
    # plain decode steps: after every prompt went in, before the first request finishes
    return host_waits(run.census.steps[3:15], skip=0)


@pytest.mark.parametrize("logprobs", [None, 5])
def test_census_one_host_wait_per_plain_decode_step(logprobs):
    with_syncs = _census(WITH_SYNCS, logprobs)
    assert (with_syncs["total"], with_syncs["mean"]) == (1, 1.0), with_syncs
    (only,) = with_syncs["sites"]
    assert only["label"] == "save event", only
    backport = _census(BACKPORT, logprobs)
    labels = {s["label"] for s in backport["sites"]}
    assert {"S1", "S2", "S3/S7", "T"} <= labels, backport
    assert backport["total"] == 6 and backport["long"] == 2, backport  # T waits for the forward
    unpatched = _census(None, logprobs)
    assert unpatched["total"] == (7 if logprobs is None else 10), unpatched


@pytest.mark.parametrize("cfg", [config(8, use_v1_scheduler=False, chunk_size=None),
                                 dataclasses.replace(BLOCKY, use_v1_scheduler=False, chunk_size=None)],
                         ids=["plain", "block-steps"])
def test_non_v1_scheduler_stands_down_and_answers_as_fastdeploy(cfg):
    """Issue 25 item 3: with ENABLE_V1_KVCACHE_SCHEDULER=0, ``step_cuda`` rewrites the step state on
    the device, so no shadow answer may be served: ``exist_prefill()`` after every step is FD's own
    answer, the runner keeps FastDeploy's seed (nothing touched) and the feature says why."""
    from fd_async_copy_plugin.registry.patch import Junction
    from fd_async_copy_plugin.testing.reference.fd24.worker import gpu_model_runner as runner_module

    requests = [_req(i, 4 + 3 * i, 30, top_p=0.8, seed=i, bad_words=[5, 6]) for i in range(6)]
    answers, entries = [], []

    def on_step(step, runner):
        fd_own = Junction.at(runner_module.GPUModelRunner, "exist_prefill").original
        answers.append((step, runner.exist_prefill(), fd_own(runner)))
        assert part(runner, "syncs") is None  # nothing made: FastDeploy's seed and state untouched
        entries.append(fd_async_copy_plugin.status()["features"]["step_syncs"])

    base = run_variant(Variant("fd24-unpatched", FD24, False), cfg, requests, backend="sim", max_steps=200)
    with device_for("sim"), plugin_state(Variant("p", FD24, True, WITH_SYNCS), "sim"), collecting():
        plugin = run_decode(FD24, cfg, requests, max_steps=200, on_step=on_step)
    base.result.assert_same(plugin)
    assert answers and [a for a in answers if a[1] != a[2]] == [], answers
    entry = entries[-1]
    assert entry["state"] == "passthrough" and "non-V1 scheduler" in entry["reason"], entry


def test_dummy_run_takes_fastdeploys_path_then_the_shadow_resumes():
    requests, arrivals = workload(7, steps=10)
    cfg = config(7, warmup=True)
    _, served, fallbacks = run_pair(cfg, requests, arrivals, "sim")
    assert fallbacks["dummy/profile run"] > 0, fallbacks
    assert served["S1 token count"] > 0, served


def test_without_stop_flag_step_syncs_is_skipped_with_the_reason():
    with device_for("host"), plugin_state(Variant("p", FD24, True, ("step_syncs",)), "host") as status:
        decision = status["features"]["step_syncs"]
    assert decision["state"] == "skipped" and "needs stop_flag" in decision["reason"], decision


def test_a_runner_stop_flag_leaves_alone_keeps_fastdeploys_path(monkeypatch):
    """A runner stop_flag does not patch (here: as if it were a DCU/Iluvatar runner) keeps
    FastDeploy's path under step_syncs too (per runner, with the reason); outputs identical."""
    from fd_async_copy_plugin.patches.fd24 import stop_flag

    monkeypatch.setattr(stop_flag, "is_cuda_runner", lambda module: False)
    requests = [_req(i, 4 + i, 6) for i in range(3)]
    cfg = config(8, chunk_size=None)
    base = run_variant(Variant("u", FD24, False), cfg, requests, backend="host")
    with device_for("host"), plugin_state(Variant("p", FD24, True, WITH_SYNCS), "host"), collecting():
        reports = []
        plugin = run_decode(FD24, cfg, requests,
                            on_step=lambda s, r: reports.append(fd_async_copy_plugin.status()["features"]["step_syncs"]))
    base.result.assert_same(plugin)
    assert reports[-1]["state"] == "passthrough" and "needs stop_flag" in reports[-1]["reason"], reports[-1]


# -- planted bugs: each must be caught ------------------------------------------------------------


def test_planted_lost_insert_write_is_caught(monkeypatch):
    """A shadow that misses FastDeploy's insert writes computes a wrong token count: the replica's
    get_padding_offset (sized by the count, like the 2.4 op) refuses it."""
    monkeypatch.setattr(step_syncs._Mirror, "setitem", lambda self, key, value: NotImplemented)
    requests, arrivals = workload(7, steps=8)
    with pytest.raises(RuntimeError, match="token_num"):
        run_pair(config(7), requests, arrivals, "sim")


def test_planted_missing_recover_replay_is_caught(monkeypatch):
    original = step_syncs.StepShadow.recover_and_count

    def no_recover(self, n):
        blocked = self.arrays["block_step"].copy()
        count = original(self, n)
        if (blocked != self.arrays["block_step"]).any():
            return count - int((blocked != self.arrays["block_step"]).sum())  # recovered slots not counted
        return count

    monkeypatch.setattr(step_syncs.StepShadow, "recover_and_count", no_recover)
    requests, arrivals = block_step_workload()
    with pytest.raises(RuntimeError, match="token_num"):
        run_pair(BLOCKY, requests, arrivals, "sim", max_steps=300)


def test_planted_unflushed_block_table_rows_change_outputs(monkeypatch):
    """Block-table rows written into the pinned mirror but never copied to the device: the device
    keeps stale rows, block steps resolve differently: the host's count disagrees with the device
    (refused, or a poisoned padding tail) or the outputs differ."""
    monkeypatch.setattr(step_syncs.StepShadow, "flush", lambda self: None)
    requests, arrivals = block_step_workload()
    with pytest.raises((AssertionError, RuntimeError, IndexError)):
        run_pair(BLOCKY, requests, arrivals, "sim", max_steps=300)


def test_planted_stale_snapshot_is_caught(monkeypatch):
    """Skipping the per-step snapshot leaves the shadow at the previous step: caught."""
    monkeypatch.setattr(step_syncs.StepShadow, "refresh", lambda self, reader: None)
    requests, arrivals = workload(7, steps=8)
    with pytest.raises((RuntimeError, IndexError), match="token_num|1073741823"):
        run_pair(config(7), requests, arrivals, "sim")


def test_count_mismatch_stands_s1_down_for_the_runner():
    """The device count copied under the step's event disagrees with the host's: S1 is disabled
    for that runner (logged, reported) and FastDeploy's synchronous count is used from then on."""
    requests, arrivals = workload(7, steps=10)
    cfg = config(7)
    base = run_variant(Variant("u", FD24, False), cfg, requests, arrivals=arrivals, backend="sim")
    seen, reports = {}, []

    def on_step(step, runner):
        shadow = part(runner, "syncs").shadow
        if step == 3:
            original = shadow.refresh

            def tampered(reader):  # the next check sees a host count one off the device's
                if shadow.snap_pending and shadow.snap_expect is not None:
                    shadow.snap_expect = (shadow.snap_expect[0] + 1, False)
                    shadow.refresh = original
                original(reader)

            shadow.refresh = tampered
        seen[step] = (shadow.s1_off, shadow.served["S1 token count"], shadow.fallbacks["S1 stood down"])
        reports.append(fd_async_copy_plugin.status()["features"]["step_syncs"])

    with device_for("sim"), plugin_state(Variant("p", FD24, True, WITH_SYNCS), "sim"), collecting():
        plugin = run_decode(FD24, cfg, requests, arrivals=arrivals, on_step=on_step)
    base.result.assert_same(plugin)
    report = reports[-1]
    last = max(seen)
    assert "did not hold" in seen[last][0], seen
    assert seen[last][1] <= seen[5][1] and seen[last][2] >= last - 5, seen  # no host count after it
    (runner,) = report["runners"]
    assert "did not hold" in runner["reason"] and runner["fallbacks"]["S1 stood down"] > 0, report


# -- the H2D staging contract ---------------------------------------------------------------------


def test_sim_refuses_a_host_write_into_a_staging_buffer_still_being_copied():
    from fd_async_copy_plugin.runtime.backend import host_view
    from fd_async_copy_plugin.runtime.simulated import SimulatedBackend

    backend = SimulatedBackend()
    src = backend.new_pinned([4], "int32", "staging")
    host_view(src, backend.glue)[...] = [1, 2, 3, 4]
    dst = np.zeros([4], dtype=np.int32)
    backend.copy_h2d(dst.ctypes.data, None, src, 0, 16, "rows")
    assert dst.tolist() == [1, 2, 3, 4]  # stream order: later device work sees the data
    with pytest.raises(BufferInUseError, match="staging"):
        backend.before_host_write(src, "next insert")
    backend.wait(backend.record("save"), "save")
    backend.before_host_write(src, "next insert")  # covered: the write may go ahead


def test_host_backend_waits_before_rewriting_a_staging_buffer():
    from fd_async_copy_plugin.runtime.backend import host_view
    from fd_async_copy_plugin.runtime.host import HostBackend

    backend = HostBackend()
    src = backend.new_pinned([2], "int64", "staging")
    host_view(src, backend.glue)[...] = [7, 8]
    dst = np.zeros([2], dtype=np.int64)
    backend.copy_h2d(dst.ctypes.data, None, src, 8, 8, "row")
    assert dst.tolist() == [8, 0]
    with collecting() as census:
        census.begin_step()
        backend.before_host_write(src, "next insert")  # waits on the H2D copy's own event
    assert census.steps[-1].count("event_wait") == 1 and census.steps[-1].count("stream_sync") == 0
    with collecting() as census:
        census.begin_step()
        backend.before_host_write(src, "next insert")  # already waited: free
    assert census.steps[-1].count("event_wait") == 0
    with pytest.raises(ValueError, match="outside"):
        backend.copy_h2d(dst.ctypes.data, None, src, 8, 16, "too long")


def test_the_non_v1_switch_is_found_without_the_runner_modules_envs_name(monkeypatch):
    """FD's runner module imports ``envs`` by that name today; where it does not (a renamed import),
    the switch is still read from ``<root>.envs`` - the shadow never runs under the non-V1 scheduler."""
    import importlib
    import types

    importlib.import_module(f"{FD24}.envs")
    renamed = types.ModuleType(f"{FD24}.worker.gpu_model_runner")  # no global named envs
    monkeypatch.setenv("ENABLE_V1_KVCACHE_SCHEDULER", "0")
    assert "non-V1 scheduler" in step_syncs.feature.own_path_reason(object(), renamed)
    monkeypatch.setenv("ENABLE_V1_KVCACHE_SCHEDULER", "1")
    assert step_syncs.feature.own_path_reason(object(), renamed) == ""
