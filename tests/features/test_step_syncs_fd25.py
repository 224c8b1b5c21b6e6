"""Feature ``step_syncs`` on FastDeploy 2.5: the sampling seed on the device (T), outputs bit-identical.

FD 2.5 keeps ``infer_seed`` and its increment on the host, so ``top_p_sampling`` makes Paddle
synchronize the stream every step - its one long wait, and under 2.5's own overlap schedule the wait
for the forward being prepared. Real CPU Paddle, the fd25 replica, ``host`` and ``sim`` backends.
Every comparison asserts that the plugin's path ran (the sampler got the device seed each step), so
a run that quietly kept FastDeploy's host seed cannot pass as identical.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.patches.fd25 import step_syncs
from fd_async_copy_plugin.patches.runner import part
from fd_async_copy_plugin.testing.harness import Variant, device_for, host_waits, plugin_state, run_variant
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.device_tracking import tracking
from fd_async_copy_plugin.testing.reference.driver import Request, run_decode
from fd_async_copy_plugin.testing.reference.placement import is_device
from test_step_syncs import config  # the same small model: vocabulary 256, 64 tokens, chunks of 8

pytestmark = pytest.mark.usefixtures("plugin_off")

FD25 = ROOTS["fd25"]
EOS = [2]


def workload(batch: int, steps: int = 14, logprobs=(None,)):
    """Seeded and default-seeded top-p rows (the seed decides the token), greedy rows, long prompts
    (chunked prefill), max_tokens=1, and an arrival on every step."""
    def make(i):
        kw = dict(logprobs=logprobs[i % len(logprobs)])
        if i % 3 == 0:
            kw.update(top_p=0.8, seed=1000 + i)
        elif i % 3 == 1:
            kw.update(top_p=0.6)  # FastDeploy's default seed, incremented every step
        max_tokens = 1 if i % 7 == 3 else steps - i % 5
        prompt = [(13 * i + 7 * j) % 200 + 3 for j in range(3 + (i * 7) % 23)]
        return Request(f"q{i}", prompt, max_tokens=max_tokens, eos_token_ids=EOS, **kw)

    first = min(batch, 6)
    requests = [make(i) for i in range(first)]
    arrivals = {step: [make(first + step - 1)] for step in range(1, steps)}
    return requests, arrivals


#: every FD 2.5 feature but step_syncs: the reference where unpatched FD 2.5 itself goes wrong
WITHOUT_SYNCS = ("logprobs", "sync_scope", "flag_race")


def run_pair(cfg, requests, arrivals, backend, *, features=None, on_step=None, max_steps=120):
    """FD 2.5 with the plugin compared bit for bit with unpatched FD 2.5 - or, with 2.5's overlap
    schedule on the simulator, with the plugin minus step_syncs: there unpatched 2.5 loses a
    chunk to its own stop-flag race (what ``flag_race`` fixes), so only the seed differs between the
    two. Returns the plugin's run and its runner's counters (asserting the device seed was in use)."""
    racy = cfg.overlap and backend == "sim"
    reference = Variant("fd25-plugin-without-step_syncs", FD25, True, WITHOUT_SYNCS) if racy else \
        Variant("fd25-native", FD25, False)
    base = run_variant(reference, cfg, requests, backend=backend, arrivals=arrivals, max_steps=max_steps)
    counts = {"served": collections.Counter(), "fallbacks": collections.Counter(), "steps": 0, "truth": 0}

    def step(n, runner):
        state = part(runner, "syncs")
        if state is not None:
            before = counts["served"]["token_num _prepare_inputs"]
            counts["served"], counts["fallbacks"] = collections.Counter(state.served), collections.Counter(state.fallbacks)
            counts["steps"] += 1
            if not cfg.overlap and state.shadow is not None and counts["served"]["token_num _prepare_inputs"] > before:
                # device truth: FD's own pinned copy of this step (landed: the save waited on a later
                # event) holds what the shadow answered instead of FD's wait
                pinned = np.array(runner.share_inputs["seq_lens_this_time_cpu"].numpy())
                answered = state.shadow.last_answers["_prepare_inputs.this_time"]
                assert pinned.shape == answered.shape and (pinned == answered).all(), (n, pinned, answered)
                counts["truth"] += 1
            # T: the seed the sampler reads, and its increment, are device tensors
            assert runner.share_inputs["infer_seed"] is state.seed and is_device(state.seed)
            assert runner.infer_seed_increment is state.increment and is_device(state.increment)
        if on_step is not None:
            on_step(n, runner)

    variant = Variant("p", FD25, True, features)
    # device marks on (nothing recorded): a tensor made on FastDeploy's device is told from a host one
    with device_for(backend), plugin_state(variant, backend) as status, tracking(recording=False):
        assert status["features"]["step_syncs"]["state"] == "applied", status["features"]["step_syncs"]
        plugin = run_decode(FD25, cfg, requests, arrivals=arrivals, max_steps=max_steps, on_step=step)
    base.result.assert_same(plugin)
    return plugin, counts


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
@pytest.mark.parametrize("batch", [1, 7, 128])
def test_bit_identical_to_fastdeploy_25_with_the_seed_on_the_device(backend, overlap, batch):
    requests, arrivals = workload(batch)
    result, counts = run_pair(config(batch, overlap=overlap), requests, arrivals, backend)
    assert result.executed_steps > 5 and counts["steps"] == result.executed_steps
    assert counts["served"]["T device seed"] >= result.executed_steps, counts  # the patched path ran
    assert_token_num_served(result, counts, overlap, backend)


#: FD 2.5's overlap schedule, a step with a prefill: FastDeploy waits in _prepare_inputs for the exact
#: count, and the last step's snapshot is still in flight (its save comes after this forward): FD's wait
IN_FLIGHT = "token_num _prepare_inputs: the last step's snapshot has not landed"


def assert_token_num_served(result, counts, overlap, backend):
    """The token-count reads were answered by the shadow (the patched path ran, not a stand-down),
    every fallback has a named cause, and (plain schedule) every answer equals FastDeploy's copy."""
    served, fallbacks = counts["served"], counts["fallbacks"]
    allowed = {"shadow loaded (construction)"} | ({IN_FLIGHT} if overlap and backend == "sim" else set())
    assert set(fallbacks) <= allowed and fallbacks["shadow loaded (construction)"] == 1, counts
    if overlap:  # plain decode steps: _postprocess's two reads, from the shadow
        assert served["token_num _postprocess"] > 0, counts
    else:  # every step's count from the shadow; _postprocess reads nothing: its wait is not needed
        assert served["token_num _prepare_inputs"] == result.executed_steps, counts
        assert served["token_num _postprocess: wait not needed (no read)"] == result.executed_steps, counts
        assert counts["truth"] == result.executed_steps, counts


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
def test_logprobs_including_minus_one_stay_bit_identical(overlap):
    requests, arrivals = workload(7, logprobs=(None, 0, 5, -1))
    cfg = config(7, overlap=overlap, enable_logprob=True)
    result, counts = run_pair(cfg, requests, arrivals, "sim")
    assert counts["served"]["T device seed"] >= result.executed_steps
    assert_token_num_served(result, counts, overlap, "sim")


def test_without_stop_flag_it_still_applies_on_25_but_not_on_24():
    # 2.5 moves the seed only: nothing rides on stop_flag's event (native on 2.5 anyway)
    with device_for("host"), plugin_state(Variant("p", FD25, True, ("step_syncs",)), "host") as status:
        assert status["features"]["step_syncs"]["state"] == "applied", status["features"]["step_syncs"]
    with device_for("host"), plugin_state(Variant("p", ROOTS["fd24"], True, ("step_syncs",)), "host") as status:
        assert status["features"]["step_syncs"]["state"] == "skipped"
        assert "needs stop_flag" in status["features"]["step_syncs"]["reason"]


def _plain_waits(variant, backend="sim"):
    requests = [Request(f"q{i}", [3 + i, 5, 7], max_tokens=12, eos_token_ids=EOS, top_p=0.7) for i in range(4)]
    run = run_variant(variant, dataclasses.replace(config(4), chunk_size=None, block_size=64), requests,
                      backend=backend, max_steps=40, track=True)
    return host_waits(run.census.steps), run


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
def test_t_is_gone_from_the_step_and_a_planted_host_seed_brings_it_back(monkeypatch, overlap):
    native, _ = _plain_waits(Variant("n", FD25, False, overlap=overlap))
    plugin, _ = _plain_waits(Variant("p", FD25, True, overlap=overlap))
    labels = lambda waits: [s["label"] for s in waits["sites"]]  # noqa: E731
    assert "T" in labels(native) and "T" not in labels(plugin), (native, plugin)
    assert plugin["long"] == native["long"] - 1
    if overlap:  # FD 2.5's own overlap schedule: nothing waits for the forward being prepared
        assert plugin["long"] == 0, plugin
    # planted: the seed cannot move - the runner keeps FD's host seed, and the census finds T again
    monkeypatch.setattr(step_syncs, "_move_seed", lambda runner, state: (_ for _ in ()).throw(ValueError("planted")))
    planted, _ = _plain_waits(Variant("p", FD25, True, overlap=overlap))
    assert "T" in labels(planted) and "T" in labels(native), planted
    assert planted["total"] == native["total"], planted  # (a runner without the seed part has no shadow either)


def test_a_runner_whose_seed_cannot_move_keeps_fastdeploys_and_status_says_why(monkeypatch):
    monkeypatch.setattr(step_syncs, "_move_seed", lambda runner, state: (_ for _ in ()).throw(ValueError("planted")))
    requests, arrivals = workload(4, steps=6)
    reports = []
    with device_for("sim"), plugin_state(Variant("p", FD25, True), "sim"), tracking(recording=False):
        plugin = run_decode(FD25, config(4), requests, arrivals=arrivals, max_steps=60,
                            on_step=lambda n, r: reports.append((part(r, "syncs"), r.share_inputs["infer_seed"],
                                                                 fd_async_copy_plugin.status()["features"]["step_syncs"])))
    base = run_variant(Variant("n", FD25, False), config(4), requests, arrivals=arrivals, backend="sim", max_steps=60)
    base.result.assert_same(plugin)
    state, seed, entry = reports[-1]
    assert state is None and not is_device(seed)  # FastDeploy's host seed, untouched
    assert entry["state"] == "passthrough" and "cannot move the seed to the device" in entry["reason"], entry


def test_a_seed_fastdeploy_recreates_on_the_host_is_moved_again_and_counted():
    """A path the plugin does not know rebinds ``infer_seed`` to a new host tensor mid-run: the next
    step moves seed and increment again (never a host seed with a device increment), counted."""
    requests, arrivals = workload(7)

    def recreate(n, runner):
        if n == 4:
            si = runner.share_inputs
            si["infer_seed"] = paddle.to_tensor(np.array(si["infer_seed"].numpy()), place=paddle.CPUPlace())

    result, counts = run_pair(config(7), requests, arrivals, "sim", on_step=recreate)
    assert counts["fallbacks"] == {"T: FastDeploy re-created the seed; moved to the device again": 1,
                                   "shadow loaded (construction)": 1}, counts
    assert counts["served"]["T device seed"] >= result.executed_steps


def test_a_failing_move_of_a_recreated_seed_puts_both_back_on_the_host_and_stands_down(monkeypatch):
    requests, arrivals = workload(7)
    real = step_syncs._move_seed

    def failing(runner, state, place=None):
        if place is None:
            raise ValueError("planted")
        real(runner, state, place)

    def recreate(n, runner):  # a re-created host seed whose move to the device then fails
        if n == 3:
            si = runner.share_inputs
            si["infer_seed"] = paddle.to_tensor(np.array(si["infer_seed"].numpy()), place=paddle.CPUPlace())
            monkeypatch.setattr(step_syncs, "_move_seed", failing)

    seen = []
    result, _ = run_pair(config(7), requests, arrivals, "host",
                         on_step=lambda n, r: (recreate(n, r), seen.append((part(r, "syncs"), r))))
    assert seen[3][0] is not None and seen[-1][0] is None  # stood down after the failed move
    runner = seen[-1][1]  # FastDeploy's own path: host seed and host increment, outputs identical
    assert not is_device(runner.share_inputs["infer_seed"]) and not is_device(runner.infer_seed_increment)


def test_a_speculative_decoding_runner_keeps_the_host_seed_and_status_says_why():
    import importlib

    from fd_async_copy_plugin.testing.reference.driver import _fd_config, _Modules

    fd_config = _fd_config(_Modules(FD25), config(4), 7390)
    fd_config.speculative_config.method = "mtp"
    runner_module = importlib.import_module(FD25 + ".worker.gpu_model_runner")
    with device_for("host"), plugin_state(Variant("p", FD25, True), "host"), tracking(recording=False):
        runner = runner_module.GPUModelRunner(fd_config, device="gpu", device_id=0, rank=0, local_rank=0)
        entry = fd_async_copy_plugin.status()["features"]["step_syncs"]
        assert part(runner, "syncs") is None and not is_device(runner.share_inputs["infer_seed"])
        assert entry["state"] == "passthrough" and "speculative decoding" in entry["reason"], entry


def test_disable_restores_fastdeploys_init_and_prepare_inputs():
    import importlib

    runner_module = importlib.import_module(FD25 + ".worker.gpu_model_runner")
    cls = runner_module.GPUModelRunner
    before = (vars(cls)["__init__"], vars(cls)["_prepare_inputs"])
    with device_for("host"), plugin_state(Variant("p", FD25, True), "host"):
        assert (vars(cls)["__init__"], vars(cls)["_prepare_inputs"]) != before
    assert (vars(cls)["__init__"], vars(cls)["_prepare_inputs"]) == before
    assert vars(cls)["__init__"] is before[0] and vars(cls)["_prepare_inputs"] is before[1]


def test_a_runner_on_another_platform_keeps_the_host_seed(monkeypatch):
    """DCU and Iluvatar runners subclass 2.5's GPUModelRunner on their own platforms: untouched."""
    import importlib

    runner_module = importlib.import_module(FD25 + ".worker.gpu_model_runner")

    class NotCuda:
        def is_cuda(self):
            return False

    monkeypatch.setattr(runner_module, "current_platform", NotCuda(), raising=False)
    requests, arrivals = workload(4, steps=6)
    seen = []
    with device_for("sim"), plugin_state(Variant("p", FD25, True), "sim"), tracking(recording=False):
        run_decode(FD25, config(4), requests, arrivals=arrivals, max_steps=60,
                   on_step=lambda n, r: seen.append((part(r, "syncs"), is_device(r.share_inputs["infer_seed"]),
                                                     fd_async_copy_plugin.status()["features"]["step_syncs"])))
    state, on_device, entry = seen[-1]
    assert state is None and not on_device
    assert entry["state"] == "passthrough" and "not a CUDA platform" in entry["reason"], entry


# --- the token_num waits: what makes them removable, and what shows when that breaks ----------


def _token_pair(backend, overlap, **kw):
    requests, arrivals = workload(7)
    return run_pair(config(7, overlap=overlap), requests, arrivals, backend, **kw)


def _differs(backend, overlap) -> str:
    """Run the pair; "" when the plugin's run was bit-identical, else what broke."""
    try:
        _token_pair(backend, overlap)
    except Exception as exc:  # a mismatch (AssertionError) or FastDeploy failing on a wrong count
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return ""


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
def test_a_planted_wrong_shadow_count_breaks_bit_identity(monkeypatch, overlap):
    """The shadow's answer is what FastDeploy's count becomes: one token too few in the served
    ``seq_lens_this_time`` (the last running slot with tokens) and the outputs differ."""
    real = step_syncs.TokenShadow.answer

    def wrong(self, name, site, like):
        out = real(self, name, site, like)
        if out is not None and name == "this_time":
            rows = np.flatnonzero(out.reshape(-1) > 0)
            if rows.size:
                out.reshape(-1)[rows[-1]] -= 1
        return out

    monkeypatch.setattr(step_syncs.TokenShadow, "answer", wrong)
    assert _differs("sim", overlap)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
def test_a_planted_early_read_of_the_pinned_count_shows_under_the_simulator(monkeypatch, overlap):
    """The waits are really skipped: when the shadow does not answer and the owed wait is dropped,
    FastDeploy reads its pinned buffer while the copy is in flight - the simulator's poison."""
    from fd_async_copy_plugin.patches import _tensor_watch

    monkeypatch.setattr(step_syncs.TokenShadow, "answer", lambda self, name, site, like: None)
    monkeypatch.setattr(_tensor_watch.DeferredEvent, "settle", lambda self: None)
    assert _differs("sim", overlap)


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
def test_without_answers_fastdeploys_own_waits_run_and_stay_bit_identical(monkeypatch, overlap):
    """The counted fallback: the shadow answers nothing, the owed wait runs before FastDeploy's read."""
    monkeypatch.setattr(step_syncs.TokenShadow, "answer", lambda self, name, site, like: None)
    result, counts = _token_pair("sim", overlap)
    assert counts["served"]["token_num _prepare_inputs"] == 0 and counts["served"]["token_num _postprocess"] == 0



def _views_by_call(monkeypatch) -> collections.Counter:
    """How many ``share_inputs`` views are made, in ``_postprocess`` and elsewhere."""
    from fd_async_copy_plugin.patches import _tensor_watch
    from fd_async_copy_plugin.patches.step import current

    made, real = collections.Counter(), _tensor_watch.ScopedInputs.__init__

    def counting(self, *args):
        step = current()
        made["_postprocess" if step is not None and step.posting else "other"] += 1
        real(self, *args)

    monkeypatch.setattr(_tensor_watch.ScopedInputs, "__init__", counting)
    return made


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
def test_postprocess_gets_a_view_only_where_it_can_read_the_pinned_count(monkeypatch, overlap):
    """FastDeploy's ``_postprocess`` reads the pinned counts only under its overlap schedule: without
    it the call runs on FastDeploy's own ``share_inputs`` (no view), its wait still not needed."""
    made = _views_by_call(monkeypatch)
    result, counts = _token_pair("sim", overlap)
    assert made["other"] >= result.executed_steps, made  # _prepare_inputs' view, every step
    assert_token_num_served(result, counts, overlap, "sim")
    assert (made["_postprocess"] > 0) == overlap, made


def test_a_postprocess_not_known_to_read_only_under_overlap_keeps_its_view(monkeypatch):
    monkeypatch.setattr(step_syncs, "reads_only_with_overlap", lambda method: False)
    made = _views_by_call(monkeypatch)
    result, counts = _token_pair("sim", False)
    assert made["_postprocess"] == result.executed_steps, made
    assert counts["served"]["token_num _postprocess: wait not needed (no read)"] == result.executed_steps


def test_which_postprocess_reads_the_pinned_count_only_under_overlap():
    import importlib

    def guarded(self):
        if (not self.enable_overlap_schedule) or self.exist_prefill():
            n = -1
        else:
            n = self.share_inputs["seq_lens_this_time_cpu"].numpy().sum() + self.share_inputs.is_block_step_cpu.sum()
        return n

    def also_unguarded(self):
        guarded(self)
        if (not self.enable_overlap_schedule) or self.exist_prefill():
            return -1
        return self.share_inputs["seq_lens_this_time_cpu"].numpy().sum() + self.share_inputs["is_block_step_cpu"]

    def other_condition(self):
        if self.exist_prefill() or (not self.enable_overlap_schedule):
            return -1
        return self.share_inputs["seq_lens_this_time_cpu"].numpy().sum()

    runner = importlib.import_module(f"{FD25}.worker.gpu_model_runner").GPUModelRunner
    assert step_syncs.reads_only_with_overlap(runner._postprocess)
    assert step_syncs.reads_only_with_overlap(guarded)
    for method in (also_unguarded, other_condition, lambda self: None, len):
        assert not step_syncs.reads_only_with_overlap(method), method

#: FD 2.5 block steps: few KV blocks, requests block (is_block_step), get DECODE tasks, are recovered
BLOCKY_25 = config(8, max_model_len=128, vocab_size=1024, num_gpu_blocks=14)


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
def test_block_steps_and_recovery_are_followed_by_the_token_shadow(backend, overlap):
    from test_step_syncs import block_step_workload

    requests, arrivals = block_step_workload()
    recovered = []

    def watch(n, runner):
        shadow = part(runner, "syncs").shadow
        recovered.append(bool(np.any(shadow.arrays["block_step"])) if shadow.known("block_step") else False)

    result, counts = run_pair(dataclasses.replace(BLOCKY_25, overlap=overlap), requests, arrivals, backend,
                              on_step=watch, max_steps=300)
    assert any(recovered), "no block step happened: the workload does not test recovery"
    assert_token_num_served(result, counts, overlap, backend)


def test_a_dummy_run_and_a_reset_reload_the_shadow_and_are_counted():
    """A dummy/profile run's _prepare_inputs keeps FastDeploy's waits and the shadow is lost; the next
    real step loads it again (one counted load); InputBatch.reset_share_inputs likewise."""
    requests, arrivals = workload(7)

    def disturb(n, runner):
        if n == 3:
            runner._prepare_inputs(is_dummy_or_profile_run=True)
        if n == 6:
            runner.share_inputs.reset_share_inputs()

    seen = []
    with device_for("sim"), plugin_state(Variant("p", FD25, True), "sim"), tracking(recording=False):
        run_decode(FD25, config(7), requests, arrivals=arrivals, max_steps=60,
                   on_step=lambda n, r: (disturb(n, r), seen.append(collections.Counter(part(r, "syncs").fallbacks))))
    last = seen[-1]
    assert last["token_num: dummy/profile run"] == 1, last
    assert last["shadow loaded (after a dummy run, a reset or an untracked write)"] == 2, last


def test_a_recreated_share_inputs_tensor_keeps_fastdeploys_waits_counted():
    requests, arrivals = workload(7)

    def recreate(n, runner):
        if n == 4:
            si = runner.share_inputs
            si["is_block_step"] = paddle.to_tensor(np.array(si["is_block_step"].numpy()))

    result, counts = run_pair(config(7), requests, arrivals, "sim", on_step=recreate)
    assert counts["fallbacks"]["token_num: share_inputs['is_block_step'] was re-created"] > 0, counts
    assert counts["served"]["token_num _prepare_inputs"] >= 4, counts


def test_a_write_through_the_seq_lens_this_time_view_loses_the_shadow_until_the_next_snapshot():
    """2.5 writes through the view only under speculative decoding (:834); any such write inside an
    insert is not followed: the next count is FastDeploy's own (counted), the snapshot brings it back."""
    requests, arrivals = workload(7)
    planted = []

    def plant(n, runner):
        if n == 3 and not planted:
            sampler, real = runner.sampler, runner.sampler.apply_logits_processor

            def writing(idx, *args, **kwargs):  # called inside insert_tasks_v1, once per prefill
                si = runner.share_inputs
                if not planted and si["seq_lens_this_time"].shape[0] > 0:
                    value = np.array(si["seq_lens_this_time"][0:1].numpy())
                    si["seq_lens_this_time"][0:1] = value  # the same value: outputs stay identical
                    planted.append(n)
                return real(idx, *args, **kwargs)

            sampler.apply_logits_processor = writing

    result, counts = run_pair(config(7), requests, arrivals, "sim", on_step=plant)
    assert planted, "no insert after the plant"
    cause = "token_num _prepare_inputs: the shadow of this_time is not known"
    assert counts["fallbacks"][cause] == 1, counts
    assert counts["served"]["token_num _prepare_inputs"] == result.executed_steps - 1, counts


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "fd25-overlap"])
def test_bit_identical_under_fd25_preemption(backend, overlap):
    # KV blocks for two requests: running ones are preempted (PREEMPTED tasks, -9 rows) and
    # prefilled again; the shadow follows the preempted insert's host writes (no fallback)
    requests = [Request(f"p{i}", [(11 * i + 5 * j) % 200 + 3 for j in range(9 + i)], max_tokens=30,
                        eos_token_ids=EOS, top_p=0.8 if i % 2 else 1.0, seed=50 + i) for i in range(4)]
    cfg = config(4, overlap=overlap, block_size=16, num_gpu_blocks=8, preemption=True)
    result, counts = run_pair(cfg, requests, {}, backend, max_steps=300)
    assert result.preemptions > 0 and not result.truncated
    assert any(o.preemptions for o in result.outputs.values())
    assert any(-9 in m.tokens().tolist() for m in result.messages)  # FD 2.5's sync rows were sent
    assert counts["steps"] == result.executed_steps
    assert_token_num_served(result, counts, overlap, backend)
