"""Feature ``overlap`` (FD 2.4, opt-in) and ``flag_race`` (FD 2.5): the save one step later.

Real CPU Paddle, the fd24/fd25 replicas, ``host`` and ``sim``. Two comparisons with unpatched
FastDeploy 2.4, each asserting that overlapped steps ran:

- per request (``run_pair``): tokens, logprobs and stop reasons identical, each request finished at
  most one step later;
- exact (``run_exact``): against unpatched FD 2.4 whose engine takes each message one step after
  it was sent (``DriverConfig(engine_lag=1)``, a token processor one step behind), every saved
  message, every output and the step it arrived, every preemption and the schedule are identical;
  only the flush steps that run when the batch drains (they send nothing) are added. This is the
  check that holds under preemption, where the engine's later view changes which request is
  preempted when.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest

from fd_async_copy_plugin.patches.fd24 import overlap as overlap_patch
from fd_async_copy_plugin.patches.fd24 import methods as fd24_methods
from fd_async_copy_plugin.patches.runner import part
from fd_async_copy_plugin.patches.fd24 import stop_flag as stop_flag_patch
from fd_async_copy_plugin.runtime import collecting
from fd_async_copy_plugin.testing.harness import Variant, device_for, host_waits, plugin_state, run_variant
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

pytestmark = pytest.mark.usefixtures("plugin_off")

FD24, FD25 = ROOTS["fd24"], ROOTS["fd25"]
OVERLAP = ("logprobs", "stop_flag", "sampled_tokens", "step_syncs", "overlap")
EOS = [2]


def _req(i, n_prompt, max_tokens, **kw):
    prompt = [(17 * i + 5 * j) % 200 + 3 for j in range(n_prompt)]
    return Request(f"o{i}", prompt, max_tokens=max_tokens, eos_token_ids=EOS, **kw)


def workload(steps=14, logprobs=(None,), arrivals_every_step=True, seeds=True):
    def make(i):
        kw = dict(logprobs=logprobs[i % len(logprobs)])
        if seeds and i % 2 == 0:
            kw.update(top_p=0.75, seed=77 + i)
        if i % 5 == 2:
            kw.update(stop_seqs=[[(17 * i) % 200 + 3, 9]])
        return _req(i, 3 + (i * 5) % 19, 1 if i % 6 == 4 else steps - i % 4, **kw)

    requests = [make(i) for i in range(4)]
    arrivals = {s: [make(3 + s)] for s in range(1, steps)} if arrivals_every_step else {}
    return requests, arrivals


def config(**kw):
    kw.setdefault("max_num_seqs", 32)
    kw.setdefault("vocab_size", 256)
    kw.setdefault("max_model_len", 64)
    kw.setdefault("chunk_size", 8)
    return DriverConfig(**kw)


def assert_same_per_request(base, plugin):
    assert set(base.outputs) == set(plugin.outputs)
    for rid, a in base.outputs.items():
        b = plugin.outputs[rid]
        assert (a.token_ids, a.stop_reason, a.finished) == (b.token_ids, b.stop_reason, b.finished), rid
        assert [(x.token_ids, x.logprobs, x.rank) for x in a.logprobs] == \
               [(x.token_ids, x.logprobs, x.rank) for x in b.logprobs], rid
        assert a.prompt_logprobs is None or all((a.prompt_logprobs[k] == b.prompt_logprobs[k]).all()
                                                for k in a.prompt_logprobs), rid
        if a.finish_step is not None:  # delivered one step later at most
            assert 0 <= b.finish_step - a.finish_step <= 1, (rid, a.finish_step, b.finish_step)


@pytest.fixture(params=["exact", "prepare", "bound"])
def count_mode(request, monkeypatch):
    """``FD_ASYNC_COPY_OVERLAP_COUNT``: the exact count, waited for at the forward's launch (default)
    or before the prepare, or FD 2.5's padded upper bound."""
    monkeypatch.setenv("FD_ASYNC_COPY_OVERLAP_COUNT", request.param)
    return request.param


def _run_plugin(cfg, requests, arrivals, backend, features, max_steps):
    """The plugin's run, with overlap's counters (``served`` also holds step_syncs' token-count
    counters, prefixed ``syncs:``) as they stood after the last step."""
    served, fallbacks = collections.Counter(), collections.Counter()

    def on_step(step, runner):
        state = part(runner, "overlap")
        if state is not None:
            served.clear(), served.update(state.served)
            served.update({f"syncs: {k}": v for k, v in part(runner, "syncs").shadow.served.items()
                           if k.startswith("S1")})
            fallbacks.clear(), fallbacks.update(state.fallbacks)
            served.update({f"launch: {k}": v for k, v in state.launch.items()})
            served["count mode: " + state.count_mode] = 1
            served["launch fallback: " + state.report().get("launch", {}).get("fallback", "")] = 1  # status()'s

    with device_for(backend), plugin_state(Variant("p", FD24, True, features), backend), collecting():
        plugin = run_decode(FD24, cfg, requests, arrivals=arrivals, max_steps=max_steps, on_step=on_step)
    if served["count mode: prepare"]:  # never sized by a bound: every step waited for the last one's count
        assert not served["syncs: S1 upper bound (tail filled)"], served
    return plugin, served, fallbacks


def run_pair(cfg, requests, arrivals, backend, features=OVERLAP, max_steps=200):
    base = run_variant(Variant("fd24-unpatched", FD24, False), cfg, requests, backend=backend,
                       arrivals=arrivals, max_steps=max_steps)
    plugin, served, fallbacks = _run_plugin(cfg, requests, arrivals, backend, features, max_steps)
    assert_same_per_request(base.result, plugin)
    return plugin, served, fallbacks


def run_exact(cfg, requests, arrivals, backend, features=OVERLAP, max_steps=300):
    """``cfg.engine_lag`` steps behind under overlap is FD 2.4 with the engine one step further behind."""
    base = run_variant(Variant("fd24-unpatched", FD24, False), dataclasses.replace(cfg, engine_lag=cfg.engine_lag + 1),
                       requests, backend=backend, arrivals=arrivals, max_steps=max_steps).result
    plugin, served, fallbacks = _run_plugin(cfg, requests, arrivals, backend, features, max_steps)
    diffs = [d for d in base.differences(plugin) if not d.startswith("executed_steps")]
    assert not diffs, diffs[:10]
    assert not plugin.truncated and served["overlap steps"] > 0 and not fallbacks, (served, fallbacks)
    assert base.executed_steps == len(base.messages)  # FD 2.4: one message per executed step
    assert plugin.executed_steps - base.executed_steps == served["flush step (batch drained)"], served
    return plugin, served


def _preemption(blocks):
    from fd_async_copy_plugin.testing.harness import preemption_workload

    return preemption_workload(num_gpu_blocks=blocks)


EXACT = {
    "arrivals every step": lambda: (config(), *workload()),
    "logprobs 0/5/20, arrivals": lambda: (config(enable_logprob=True), *workload(logprobs=(0, 5, 20, None))),
    "all ending together": lambda: (config(chunk_size=None), [_req(i, 4, 6) for i in range(5)], {}),
    "max_tokens=1, 2-chunk prompts": lambda: (
        config(chunk_size=8), [_req(0, 14, 1), _req(1, 15, 3), _req(2, 3, 1)], {2: [_req(3, 12, 2)]}),
    "block steps": lambda: (
        config(max_num_seqs=8, max_model_len=128, vocab_size=1024, num_gpu_blocks=14),
        [_req(0, 5, 40, top_p=0.7, seed=3), _req(1, 9, 20), _req(2, 20, 1), _req(3, 13, 40), _req(4, 3, 35),
         _req(5, 30, 14)], {3: [_req(7, 11, 20)], 9: [_req(8, 4, 3)]}),
    "preemption mid-flight (12 blocks)": lambda: _preemption(12),
    "preemption right after admission (10 blocks)": lambda: _preemption(10),
    "heavy preemption churn (5 blocks)": lambda: _preemption(5),
    "empty batches between arrivals": lambda: (config(chunk_size=None), [_req(0, 4, 3), _req(1, 5, 2)],
                                               {7: [_req(2, 6, 3)], 8: [_req(3, 3, 2)], 15: [_req(4, 4, 2)]}),
}


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("name", list(EXACT))
def test_identical_to_fastdeploy_24_with_the_engine_one_step_behind(name, backend, count_mode):
    cfg, requests, arrivals = EXACT[name]()
    result, served = run_exact(cfg, requests, arrivals, backend, max_steps=400)
    assert served["count mode: " + count_mode]
    if count_mode == "bound" and name != "all ending together":  # a step after a finish ran padded
        assert served["syncs: S1 upper bound (tail filled)"] > 0, served
    if cfg.preemption:
        pairs = [p for o in result.outputs.values() for p in o.preemptions]
        assert result.preemptions >= 4 and len(pairs) == result.preemptions
        # preempted while a step of its was still to be saved: that token reached the engine first
        assert any(p[1] is None or p[1] > p[0] for p in pairs), pairs
        if "admission" in name:
            assert any(p[0] == 0 for p in pairs), pairs
        elif "churn" in name:
            assert result.preemptions >= 20, result.preemptions
        else:
            assert [[1, None]] in [o.preemptions for o in result.outputs.values()]  # its eos was in flight


ROWS_DEPENDENT = ["logprobs 0/5/20, arrivals", "preemption mid-flight (12 blocks)"]


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("name", ROWS_DEPENDENT)
@pytest.mark.parametrize("mode", ["exact", "prepare"])
def test_exact_count_stays_bit_identical_when_a_gemms_bits_depend_on_the_row_count(mode, name, backend, monkeypatch):
    """A model whose per-token GEMM rounds differently for another row count (as cuBLAS does on the
    H200: benchmarks/results/padded_gemm_check.txt): the exact count, waited for at the launch or
    before the prepare, runs every forward on FD 2.4's rows, so every logprob bit and message is FD 2.4's."""
    monkeypatch.setenv("FD_ASYNC_COPY_OVERLAP_COUNT", mode)
    cfg, requests, arrivals = EXACT[name]()
    run_exact(dataclasses.replace(cfg, rows_dependent_gemm=True), requests, arrivals, backend, max_steps=400)


@pytest.mark.parametrize("name", ROWS_DEPENDENT)
def test_bound_count_changes_bits_after_a_finish_as_fastdeploy_25s_own_overlap_does(name, monkeypatch):
    """The upper bound pads the step after a request finished: with that model the real rows' bits
    move (logprobs, saved top-k messages). FD 2.5's overlap schedule sizes its steps the same way
    (``last_token_num``) and moves logprob bits too; with a row-independent model both are identical."""
    monkeypatch.setenv("FD_ASYNC_COPY_OVERLAP_COUNT", "bound")
    cfg, requests, arrivals = EXACT[name]()
    cfg = dataclasses.replace(cfg, rows_dependent_gemm=True)
    with pytest.raises(AssertionError, match="logprobs differ"):
        run_exact(cfg, requests, arrivals, "sim", max_steps=400)
    if cfg.preemption:  # the FD 2.5 replica does not model preemption
        return
    off = run_variant(Variant("a", FD25, False), cfg, requests, arrivals=arrivals, backend="sim", max_steps=400).result
    on = run_variant(Variant("b", FD25, False, overlap=True), cfg, requests, arrivals=arrivals, backend="sim",
                     max_steps=400).result
    moved = [rid for rid in off.outputs
             if [x.logprobs for x in off.outputs[rid].logprobs] != [x.logprobs for x in on.outputs[rid].logprobs]]
    assert moved


@pytest.mark.parametrize("blocks", [10, 12])
def test_an_engine_further_behind_is_still_fastdeploy_24_one_step_further_behind(blocks, count_mode):
    cfg, requests, arrivals = _preemption(blocks)
    result, _ = run_exact(dataclasses.replace(cfg, engine_lag=1), requests, arrivals, "sim", max_steps=400)
    assert result.preemptions >= 3


# ---- a running batch emptied by preemption (issue 25: all-preempted and empty batches) ----------
#
# The driver's preemption (FD 2.4's ``_trigger_preempt``) takes victims from the end of the running
# list and stops at the request that needs the blocks; the requests admitted before it are never its
# victims. So a step preempts every running request only if the first admitted one cannot fit with
# every other block free, i.e. needs more blocks than the pool has - and it never needs more than its
# prompt + max_tokens, which ``_validate_request`` requires to fit (KV blocks are held by running
# requests only), so no step preempts them all. The closest case it can run: every running
# request but one preempted in the same step; the survivor finishes while the victims wait for
# blocks, so no request is running and every unfinished one is a preempted victim (with the engine
# one step behind, the device runs an empty batch meanwhile); then the victims are rescheduled,
# prefilled again with prompt + received tokens, and finish, one of them preempted a second time.


def emptied_by_preemption_workload():
    """5 KV blocks of 4 tokens: o0's 16-token prompt in 8-token chunks needs all 5 for its last
    chunk at step 1 and preempts o2 and o1 (admitted after it, 1 block each) at once."""
    cfg = config(max_num_seqs=4, block_size=4, num_gpu_blocks=5, preemption=True, enable_logprob=True)
    return cfg, [_req(0, 16, 3), _req(1, 2, 17, logprobs=5), _req(2, 2, 17, top_p=0.7, seed=9)], {}


@pytest.fixture
def schedule_log(monkeypatch):
    """One list per driver run (in run order), one entry per step: the running requests before and
    after scheduling, the step's PREEMPTED tasks, the preempted requests not finished (nor prefilled
    again) before scheduling, and whether the step executed. Read from the driver's scheduler; the
    wrappers change nothing it does."""
    from fd_async_copy_plugin.testing.reference import driver

    runs = []
    init, schedule, after = (driver._Scheduler.__init__, driver._Scheduler.schedule,
                             driver._Scheduler.after_execute)

    def _init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runs.append([])
        self._test_log = runs[-1]

    def _schedule(self):
        before = [t.user.request_id for t in self.running]
        waiting = sorted(rid for rid, t in self.tracked.items() if t.preempted and not t.done)
        tasks = schedule(self)
        preempted = self.mod.request.RequestType.PREEMPTED
        self._test_log.append(dict(
            before=before, after=[t.user.request_id for t in self.running],
            preempted=[t.request_id for t in tasks if t.task_type == preempted],
            victims=waiting, executed=False))
        return tasks

    def _after(self, *args, **kwargs):
        self._test_log[-1]["executed"] = True
        return after(self, *args, **kwargs)

    monkeypatch.setattr(driver._Scheduler, "__init__", _init)
    monkeypatch.setattr(driver._Scheduler, "schedule", _schedule)
    monkeypatch.setattr(driver._Scheduler, "after_execute", _after)
    return runs


def assert_emptied_by_preemption(log, result):
    """The moment happened: all but one running request preempted in one step, later a step with no
    request running and only preempted victims unfinished; every victim rescheduled and finished.
    Returns the steps between the two moments that ran no batch (the device idle)."""
    mass = [s for s, e in enumerate(log) if len(e["preempted"]) >= 2 and len(e["after"]) == 1
            and len(e["before"]) == len(e["preempted"]) + 1]
    assert mass, log
    first = mass[0]
    victims = log[first]["preempted"]
    emptied = [s for s, e in enumerate(log) if s > first and not e["before"] and e["victims"]]
    assert emptied, log[first:]
    assert log[emptied[0]]["victims"] == sorted(victims), (victims, log[emptied[0]])
    for rid in victims:
        out = result.outputs[rid]
        assert out.finished and out.preemptions and all(p[1] is not None for p in out.preemptions), (rid, out)
        assert len(out.token_ids) > out.preemptions[-1][1], (rid, out)  # tokens after its second prefill
    return [s for s in range(first + 1, emptied[0]) if not log[s]["executed"]]


def _schedule_only(log):
    return [{k: v for k, v in e.items() if k != "executed"} for e in log]


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_a_batch_emptied_by_preemption_is_fastdeploy_24_one_step_behind(backend, count_mode, schedule_log):
    cfg, requests, arrivals = emptied_by_preemption_workload()
    result, served = run_exact(cfg, requests, arrivals, backend, max_steps=200)
    base_log, plugin_log = schedule_log  # the unpatched run (engine one step behind), then the plugin's
    assert _schedule_only(base_log) == _schedule_only(plugin_log)
    # FD 2.4 one step behind ran an empty batch (nothing executed) while only victims were left ...
    idle = assert_emptied_by_preemption(base_log, result)
    assert idle and assert_emptied_by_preemption(plugin_log, result) == [], idle
    # ... where overlap ran a flush step: it sent the survivor's last save, which was still pending
    assert all(plugin_log[s]["executed"] for s in idle)
    assert served["flush step (batch drained)"] > 0 and served["overlap steps"] > 0, served
    assert result.preemptions >= 3


def test_planted_dropping_the_pending_step_of_a_preempted_slot_is_caught(monkeypatch):
    """A plausible wrong design: "the slot was preempted, so its pending output is stale" - the
    pending save is dropped at an insert that preempts. The victim's in-flight token (and the other
    rows of that step) never reach the engine."""
    dropped = []

    real = fd24_methods.insert_tasks_v1

    def insert_tasks_v1(fd, on, self, tasks, *args, **kwargs):
        state = part(self, "overlap")
        if state is not None and any(t.task_type.name == "PREEMPTED" for t in tasks) and state.pending:
            state.pending = []
            dropped.append(len(tasks))
        return real(fd, on, self, tasks, *args, **kwargs)

    monkeypatch.setattr(fd24_methods, "insert_tasks_v1", insert_tasks_v1)  # FD 2.4's line function
    with pytest.raises(AssertionError, match=r"pre\d+\.token_ids"):
        run_exact(*_preemption(12), "sim", max_steps=400)
    assert dropped


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("logprobs", [(None,), (0, 5, 20, None)])
def test_outputs_identical_one_step_later(backend, logprobs, count_mode):
    requests, arrivals = workload(logprobs=logprobs)
    result, served, fallbacks = run_pair(config(enable_logprob=logprobs != (None,)), requests, arrivals, backend)
    assert served["overlap steps"] >= result.executed_steps - 2, served
    assert served["save one step later (after forward)"] > 0, served
    assert not fallbacks, fallbacks


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_all_requests_ending_together_are_flushed(backend, count_mode):
    requests = [_req(i, 4, 6) for i in range(5)]
    result, served, _ = run_pair(config(chunk_size=None), requests, {}, backend)
    assert all(o.finished for o in result.outputs.values())
    assert served["overlap steps"] >= 5


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_max_tokens_one_and_two_chunk_prompts(backend, count_mode):
    requests = [_req(0, 14, 1), _req(1, 15, 3), _req(2, 3, 1)]
    result, served, _ = run_pair(config(chunk_size=8), requests, {2: [_req(3, 12, 2)]}, backend)
    assert all(o.finished for o in result.outputs.values()) and served["overlap steps"] > 0


def test_block_steps_with_greedy_sampling():
    """KV blocks run out: block steps and recovery under the overlap schedule (greedy sampling, so
    the engine's one-step-later view of finished requests cannot change a token)."""
    def req(i, n, m):
        return _req(i, n, m)

    requests = [req(0, 5, 40), req(1, 9, 20), req(2, 20, 1), req(3, 13, 40), req(4, 3, 35), req(5, 30, 14)]
    cfg = config(max_num_seqs=8, max_model_len=128, vocab_size=1024, num_gpu_blocks=14)
    _, served, _ = run_pair(cfg, requests, {3: [req(7, 11, 20)], 9: [req(8, 4, 3)]}, "sim", max_steps=400)
    assert served["overlap steps"] > 0


def test_census_one_wait_per_step_on_the_previous_steps_event(count_mode):
    """Bound: the wait comes after this step's forward was launched (0 long). Exact: it comes at
    this step's launch, prepare: before this step is prepared; either way the GPU drains step N
    before N+1 is launched (1 long) - what the exact count costs; the save still runs under the
    next forward."""
    requests = [_req(i, 4 + i, 24, logprobs=5, top_p=0.9, seed=i) for i in range(6)]
    # KV blocks of 64 tokens: no DECODE task (an insert) falls in the run
    cfg = config(max_num_seqs=8, chunk_size=None, enable_logprob=True, block_size=64)
    run = run_variant(Variant("p", FD24, True, OVERLAP), cfg, requests, backend="sim", max_steps=60, track=True)
    waits = host_waits(run.census.steps[3:18], skip=0)
    long = {"bound": 0, "exact": 1, "prepare": 1}[count_mode]
    assert (waits["total"], waits["long"], waits["mean"]) == (1, long, 1.0), waits
    (only,) = waits["sites"]
    where = {"bound": "after forward", "exact": "launch wait", "prepare": "exact count"}[count_mode]
    assert only["label"] == "save event" and where in only["what"], only


def test_the_count_mode_defaults_to_exact_and_a_bad_value_is_refused():
    from fd_async_copy_plugin.config import AsyncCopyConfig, ConfigError

    with pytest.raises(ConfigError, match="FD_ASYNC_COPY_OVERLAP_COUNT='fast'.*exact.*prepare.*bound"):
        AsyncCopyConfig.from_env({"FD_ASYNC_COPY_OVERLAP_COUNT": "fast"})
    assert AsyncCopyConfig.from_env({}).overlap_count == "exact"
    for value, mode in (("exact", "exact"), ("prepare", "prepare"), ("bound", "bound"), (" launch ", "exact")):
        assert AsyncCopyConfig.from_env({"FD_ASYNC_COPY_OVERLAP_COUNT": value}).overlap_count == mode  # launch: old name


@pytest.mark.parametrize("why, cfg, request_kw", [
    ("prompt logprobs", config(enable_logprob=True, save_output_v1=True), {"prompt_logprobs": 2}),
    ("ZMQ output path", config(save_output_v1=True), {}),
    ("keep-sampling-mask", config(keep_sampling_mask=True), {}),
])
def test_overlap_turns_itself_off_where_fastdeploy_25_does(why, cfg, request_kw):
    requests = [_req(0, 10, 6, **request_kw), _req(1, 5, 8)]
    result, served, fallbacks = run_pair(cfg, requests, {}, "sim")
    assert fallbacks[why] > 0 and sum(fallbacks.values()) >= result.executed_steps - 1, fallbacks
    assert not served["overlap steps"], served


def test_the_worker_loop_does_not_spin_once_flushed(count_mode):
    """``not_need_stop()`` is True only while a step's save is pending: once flushed and drained,
    FastDeploy's loop sees False (it sleeps instead of spinning)."""
    seen = []
    with device_for("host"), plugin_state(Variant("p", FD24, True, OVERLAP), "host"), collecting():
        run_decode(FD24, config(), [_req(0, 4, 3)], on_step=lambda s, r: seen.append(
            (bool(part(r, "overlap").pending), bool(r.not_need_stop()))))
    assert seen[-1] == (False, False), seen
    assert all(flag for pending, flag in seen if pending), seen


@pytest.mark.parametrize("features, missing", [(("stop_flag", "overlap"), "logprobs"),
                                                (("logprobs", "stop_flag", "overlap"), "step_syncs")])
def test_needs_its_requirements(features, missing):
    with device_for("host"), plugin_state(Variant("p", FD24, True, features), "host") as status:
        decision = status["features"]["overlap"]
    assert decision["state"] == "skipped" and f"needs {missing}" in decision["reason"], decision


def test_overlap_is_opt_in():
    from fd_async_copy_plugin.config import parse_features as parse
    from fd_async_copy_plugin.registry.catalog import feature_catalog

    def parse_features(raw):
        return parse(raw, catalog=feature_catalog())

    assert "overlap" not in parse_features("all")
    assert parse_features("all,overlap")[-1] == "overlap" and "logprobs" in parse_features("all,overlap")


# -- the stop-flag race -------------------------------------------------------------------------


def test_planted_insert_without_waiting_for_the_flag_copy_stalls_a_two_chunk_prompt(monkeypatch, count_mode):
    """The race of FD 2.5's overlap schedule, reproduced on the 2.4 overlap path: an insert that
    writes the flag while the previous step's flag copy is in flight (here: stop_flag's wait before
    the insert and overlap's flush removed) is overwritten when the copy lands; a 2-chunk prompt
    whose first chunk made the batch idle never gets its first token."""
    monkeypatch.setattr(overlap_patch.OverlapState, "flush", _flush_without_refresh_at_insert)
    real_sync = stop_flag_patch.StopFlagState.sync

    def sync_but_not_at_inserts(self, reader):
        if reader not in ("insert_tasks_v1", "insert_prefill_inputs"):
            real_sync(self, reader)

    monkeypatch.setattr(stop_flag_patch.StopFlagState, "sync", sync_but_not_at_inserts)
    monkeypatch.setattr(stop_flag_patch.StopFlagState, "after_insert", lambda self: None)
    requests = [_req(0, 12, 3)]
    with device_for("sim"), plugin_state(Variant("p", FD24, True, OVERLAP), "sim"), collecting():
        stalled = run_decode(FD24, config(chunk_size=6), requests, max_steps=40)
    assert stalled.truncated and not stalled.outputs["o0"].token_ids  # no first token, ever


def _flush_without_refresh_at_insert(self, why):
    if why in ("insert_tasks_v1", "insert_prefill_inputs"):
        return  # the planted bug: the insert does not finish the pending step first
    pending, self.pending = self.pending, []
    for op, args, flag_index, flag in pending:
        args[flag_index] = self.backend.to_host(flag, f"overlap.{why}")
        op(*args)
    if pending:
        self.runner.step_saved(f"overlap.{why}")


def test_two_chunk_prompt_with_overlap_does_not_stall(count_mode):
    requests = [_req(0, 12, 3)]
    result, served, _ = run_pair(config(chunk_size=6), requests, {}, "sim", max_steps=40)
    assert result.outputs["o0"].finished and served["overlap steps"] > 0


def test_fd25_flag_race_closed_by_the_hardening_patch():
    """FD 2.5's own overlap schedule under the simulator loses the second chunk's step (see
    tests/reference/test_replica_fd25.py); with ``flag_race`` applied it does not."""
    from fd_async_copy_plugin.testing.reference.driver import Request as R

    cfg = DriverConfig(enable_logprob=True, overlap=True, save_output_v1=True, chunk_size=5)
    make = lambda: [R("pl", list(range(3, 15)), max_tokens=3, eos_token_ids=[0], prompt_logprobs=2)]  # noqa: E731
    synchronous = run_decode(FD25, cfg, make())
    with device_for("sim"), plugin_state(Variant("p", FD25, True, ("flag_race",)), "sim") as status, collecting():
        assert status["features"]["flag_race"]["state"] in ("applied", "pending")
        fixed = run_decode(FD25, cfg, make())
    assert fixed.differences(synchronous) == []


def test_off_for_a_splitwise_role():
    """A decode node of a P/D split frees a preempted slot at schedule time (FD 2.4's engine): a late
    row of the old owner could reach the new one, so overlap stays off there (as 2.5's default)."""
    from types import SimpleNamespace

    runner = SimpleNamespace(scheduler_config=SimpleNamespace(splitwise_role="decode"))
    module = SimpleNamespace(__name__="fd.worker.gpu_model_runner")
    assert overlap_patch.off_reason(runner, module) == "splitwise (prefill/decode) role"
    runner.scheduler_config.splitwise_role = "mixed"
    assert overlap_patch.off_reason(runner, module) == ""


def test_the_worker_taking_a_task_batch_finishes_the_pending_save(monkeypatch):
    """FD 2.4's worker loop calls ``EngineWorkerQueue.get_tasks()`` before inserting: the pending save
    runs first, so the engine has step N's output before it sees the batch taken (2.4's order)."""
    import sys
    import types

    name = f"{FD24}.inter_communicator.engine_worker_queue"

    class EngineWorkerQueue:
        def get_tasks(self):
            return [], True

    fake = types.ModuleType(name)
    fake.EngineWorkerQueue = EngineWorkerQueue
    monkeypatch.setitem(sys.modules, name, fake)
    seen = []

    def on_step(step, runner):
        state = part(runner, "overlap")
        if state.pending:
            EngineWorkerQueue().get_tasks()
            seen.append(bool(state.pending))

    with device_for("sim"), plugin_state(Variant("p", FD24, True, OVERLAP), "sim"), collecting():
        assert EngineWorkerQueue.get_tasks.__wrapped__  # patched: the module was loaded at apply time
        run_decode(FD24, config(chunk_size=None), [_req(0, 4, 6), _req(1, 5, 6)], on_step=on_step)
    assert seen and not any(seen), seen
    assert not hasattr(EngineWorkerQueue.get_tasks, "__wrapped__")  # restored by disable()


def test_selftest_overlap_scenario_passes_and_fails_when_overlap_stands_down():
    """``fd-async-copy selftest``'s overlap scenario compares with FD 2.4 one engine step behind: a
    plugin that quietly ran FD's own schedule delivers every output a step early and fails it."""
    from fd_async_copy_plugin.testing.harness import run_scenario, selftest_scenarios

    (scenario,) = [s for s in selftest_scenarios() if s.features and "overlap" in s.features]
    base, plugin = run_scenario(scenario, "sim")
    assert scenario.differences(base.result, plugin.result) == [] and plugin.result.preemptions > 0
    without = dataclasses.replace(scenario, features=tuple(f for f in scenario.features if f != "overlap"))
    base, plugin = run_scenario(without, "sim")
    assert any("first_token_step" in d for d in without.differences(base.result, plugin.result))


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_staged_block_table_rows_after_an_idle_step_are_waited_for_before_a_rewrite(backend):
    """Issue 25 item 6: one slot, overlap: the engine (a step behind) sends a task for a request
    that already ended, that step is idle (no update op, no event), and the next insert would rewrite
    the staged rows while their copy may still read them. The insert waits for that copy first (one
    event wait, counted), never a stream synchronize, and the outputs are FD 2.4's."""
    cfg = config(max_num_seqs=1, max_model_len=128, num_gpu_blocks=8)
    requests = [Request(f"r{i}", [(7 * i + j) % 200 + 3 for j in range(3 + 5 * i)], max_tokens=3, eos_token_ids=EOS)
                for i in range(4)]
    base = run_variant(Variant("fd24-unpatched", FD24, False), cfg, requests, backend=backend).result
    waited = []

    def on_step(step, runner):
        fallbacks = part(runner, "syncs").shadow.fallbacks
        waited.append(fallbacks["I1: the last staged rows had no step event; their copy was waited for"])

    with device_for(backend), plugin_state(Variant("p", FD24, True, OVERLAP), backend), collecting() as census:
        plugin = run_decode(FD24, cfg, requests, on_step=on_step)
    assert not plugin.truncated and set(base.outputs) == set(plugin.outputs)
    for rid, a in base.outputs.items():  # one slot: each idle step delays the next request a step more
        b = plugin.outputs[rid]
        assert (a.token_ids, a.stop_reason, a.finished) == (b.token_ids, b.stop_reason, b.finished), rid
    assert waited[-1] > 0, waited
    assert not any(kind == "stream_sync" for step in census.steps for kind, _ in step.events), "a stream sync"


def test_reset_share_inputs_with_a_pending_step_saves_it_first():
    """A weight reload (``reset_share_inputs``) while a step's save is pending: the save goes out
    first, on the buffers it was captured with, then FD's reset runs (issue 25)."""
    import importlib

    from fd_async_copy_plugin.registry.patch import Junction

    postproc = importlib.import_module(f"{FD24}.model_executor.pre_and_post_process")
    importlib.import_module(f"{FD24}.worker.gpu_model_runner")  # applied at enable, not later
    saved, checked = [], []

    class Stop(Exception):
        pass

    def on_step(step, runner):
        state = part(runner, "overlap")
        if step >= 2 and state.pending:
            before = len(saved)
            runner.reset_share_inputs()
            checked.append((before, len(saved), bool(state.pending)))
            raise Stop

    with device_for("sim"), plugin_state(Variant("p", FD24, True, OVERLAP), "sim"), collecting():
        junction = Junction.at(postproc, "save_output")
        fd_save = junction.bottom
        junction.set_bottom(lambda *args, **kwargs: (saved.append(1), fd_save(*args, **kwargs))[1])
        try:
            run_decode(FD24, config(chunk_size=None), [_req(i, 4 + i, 8) for i in range(3)], on_step=on_step)
        except Stop:
            pass
        finally:
            junction.set_bottom(fd_save)
    assert checked and checked[0] == (checked[0][0], checked[0][0] + 1, False), checked



@pytest.mark.parametrize("backend", ["host", "sim"])
def test_status_reports_the_share_of_decode_steps_that_waited_for_the_last_steps_count(backend, count_mode):
    """``status()``: each decode step by whether the host waited for the last step's event before
    this step's forward. ``exact`` and ``prepare`` do for every step with a step in flight (the exact
    count: fraction 1.0), ``bound`` never (0.0); the first step (nothing in flight) and the flush step that saves the
    last one when the batch drains (not a decode step) are not in the fraction."""
    requests = [_req(i, 4 + i, 6 + 2 * i) for i in range(5)]  # finishing at different steps
    cfg = config(chunk_size=None, block_size=64)  # no insert after the first step
    run = run_variant(Variant("p", FD24, True, OVERLAP), cfg, requests, backend=backend, max_steps=60)
    (runner,) = run.final_status["features"]["overlap"]["runners"]
    waits, served = runner["count_waits"], runner["served"]
    assert runner["token_count"] == count_mode and served["overlap steps"] >= 10, runner
    assert served["flush step (batch drained)"] == 1, served
    assert sum(waits.values()) == served["overlap steps"], (waits, served)  # the flush step is not one
    assert waits["landed before"] == 1, waits  # the first step: no step before it
    expected = {"exact": "waited for the count", "prepare": "waited for the count", "bound": "not waited"}[count_mode]
    assert waits[expected] == served["overlap steps"] - 1, waits
    assert runner["waited_fraction"] == {"exact": 1.0, "prepare": 1.0, "bound": 0.0}[count_mode], runner


def test_a_step_after_an_insert_flushed_the_last_one_did_not_wait_for_its_count():
    """An insert finishes the pending save (its event waited) before the step is prepared: the last
    step had landed, so that step is not counted as one that waited for it."""
    requests, arrivals = workload()
    run = run_variant(Variant("p", FD24, True, OVERLAP), config(), requests, arrivals=arrivals, backend="sim",
                      max_steps=200)
    (runner,) = run.final_status["features"]["overlap"]["runners"]
    waits = runner["count_waits"]
    assert waits["landed before"] >= 10 and waits.get("waited for the count", 0) >= 1, waits
    assert "not waited" not in waits and runner["waited_fraction"] == 1.0, runner
