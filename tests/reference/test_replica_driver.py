"""The decode driver on the unpatched FastDeploy 2.4 replica: determinism, FastDeploy's stop
semantics, chunked prefill, block steps, mid-run insertion, batch sizes and logprob widths."""

from __future__ import annotations

import numpy as np
import pytest
from replica_cases import EOS, FD24, mixed_logprob_requests, request

from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode
from fd_async_copy_plugin.testing.reference.message_queue import MessageOverflowError


def _tokens(result):
    return {rid: out.token_ids for rid, out in result.outputs.items()}


def test_two_runs_are_bit_identical():
    config = DriverConfig(max_num_seqs=8, enable_logprob=True, chunk_size=5)
    first = run_decode(FD24, config, mixed_logprob_requests())
    second = run_decode(FD24, config, mixed_logprob_requests())
    assert first.differences(second) == []
    assert len(first.messages) == first.executed_steps and first.messages[0].kind == "topk"


def test_zmq_path_runs_are_bit_identical_and_carry_the_same_tokens():
    config = DriverConfig(max_num_seqs=8, enable_logprob=True, save_output_v1=True)
    first = run_decode(FD24, config, mixed_logprob_requests())
    second = run_decode(FD24, config, mixed_logprob_requests())
    assert first.differences(second) == []
    assert first.messages == [] and len(first.zmq_payloads) == first.executed_steps
    via_queue = run_decode(FD24, DriverConfig(max_num_seqs=8, enable_logprob=True), mixed_logprob_requests())
    assert _tokens(first) == _tokens(via_queue)


def test_max_tokens_replaces_the_last_token_by_eos():
    result = run_decode(FD24, DriverConfig(), [request("a", [3, 4, 5], max_tokens=6)])
    out = result.outputs["a"]
    assert out.finished and out.stop_reason == "length"
    assert len(out.token_ids) == 6 and out.token_ids[-1] == EOS
    assert EOS not in out.token_ids[:-1]


def test_max_tokens_one_yields_only_eos():
    out = run_decode(FD24, DriverConfig(), [request("a", [3, 4, 5], max_tokens=1)]).outputs["a"]
    assert out.token_ids == [EOS] and out.stop_reason == "length" and out.finish_step == 0


def test_generated_eos_finishes_early():
    free = run_decode(FD24, DriverConfig(), [request("a", [3, 4, 5], max_tokens=10)]).outputs["a"].token_ids
    eos = free[3]
    out = run_decode(FD24, DriverConfig(), [Request("a", [3, 4, 5], 10, [eos])]).outputs["a"]
    assert out.token_ids == free[:4] and out.stop_reason == "eos"


def test_stop_sequence_is_matched_one_step_late_then_eos():
    free = run_decode(FD24, DriverConfig(), [request("a", [3, 4, 5], max_tokens=10)]).outputs["a"].token_ids
    stop = free[2:4]
    out = run_decode(FD24, DriverConfig(), [request("a", [3, 4, 5], max_tokens=10, stop_seqs=[[999], stop])])
    out = out.outputs["a"]
    assert out.token_ids == free[:4] + [EOS] and out.stop_reason == "stop"


def test_chunked_prefill_gives_the_same_tokens_and_voids_chunk_steps():
    prompts = [request(f"c{i}", range(1 + i, 24 + i), max_tokens=4) for i in range(3)]
    whole = run_decode(FD24, DriverConfig(), prompts)
    chunked = run_decode(FD24, DriverConfig(chunk_size=5), [request(f"c{i}", range(1 + i, 24 + i), max_tokens=4) for i in range(3)])
    assert _tokens(whole) == _tokens(chunked)
    # 23 prompt tokens in chunks of 5: four voided chunk steps before the first token.
    assert [int(m.tokens()[0]) for m in chunked.messages[:4]] == [-1] * 4
    assert all(out.first_token_step == 4 for out in chunked.outputs.values())


def test_prompt_logprobs_across_chunks_match_a_single_prefill():
    def run(chunk_size):
        reqs = [request("p", range(2, 30), max_tokens=3, prompt_logprobs=3), request("q", range(5, 14), max_tokens=3, prompt_logprobs=0)]
        config = DriverConfig(enable_logprob=True, save_output_v1=True, chunk_size=chunk_size)
        return run_decode(FD24, config, reqs).outputs

    whole, chunked = run(None), run(6)
    for rid, width in (("p", 4), ("q", 1)):
        a, b = whole[rid].prompt_logprobs, chunked[rid].prompt_logprobs
        assert a["token_ids"].shape == (len(whole[rid].prompt_logprobs["ranks"]), width)
        assert np.array_equal(a["token_ids"], b["token_ids"]) and np.array_equal(a["ranks"], b["ranks"])
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], rtol=0, atol=1e-5)
    prompt = list(range(2, 30))
    assert whole["p"].prompt_logprobs["token_ids"][:, 0].tolist() == prompt[1:]


def test_block_step_stops_a_slot_until_a_block_frees_and_resumes_it():
    reqs = lambda: [  # noqa: E731
        request("b0", [3, 4, 10], max_tokens=4),
        request("b1", [3, 4, 11], max_tokens=9),
        request("b2", [3, 4, 12], max_tokens=9),
    ]
    block_steps = []

    def watch(step, runner):
        block_steps.append(bool(runner.share_inputs["is_block_step"].numpy().any()))

    tight = run_decode(FD24, DriverConfig(block_size=4, num_gpu_blocks=5, max_model_len=32), reqs(), on_step=watch)
    ample = run_decode(FD24, DriverConfig(block_size=4, max_model_len=32), reqs())
    assert any(block_steps) and not block_steps[-1]
    assert _tokens(tight) == _tokens(ample)
    assert tight.outputs["b2"].finish_step > ample.outputs["b2"].finish_step
    waiting = [int(m.tokens()[2]) for m in tight.messages]
    assert -1 in waiting[1:-1]  # the blocked slot emits no token while it waits


def test_kv_pool_too_small_for_any_progress_is_reported():
    reqs = [request(f"d{i}", [3, 4, 10 + i], max_tokens=12) for i in range(3)]
    with pytest.raises(RuntimeError, match="KV block"):
        run_decode(FD24, DriverConfig(block_size=4, num_gpu_blocks=6, max_model_len=32), reqs)


def test_requests_inserted_mid_run_wait_for_a_free_slot():
    arrivals = {2: [request("b", [6, 8], max_tokens=3), request("c", [6, 9], max_tokens=3)], 12: [request("d", [9], max_tokens=2)]}
    result = run_decode(FD24, DriverConfig(max_num_seqs=2), [request("a", [3, 4, 5], max_tokens=5)], arrivals=arrivals)
    out = result.outputs
    assert out["b"].first_token_step == 2
    assert out["c"].first_token_step == out["a"].finish_step + 1  # took a's slot once a finished
    assert out["d"].first_token_step == 12 and all(o.finished for o in out.values())
    assert result.executed_steps < result.steps  # idle steps between the bursts


def test_all_requests_finishing_clears_not_need_stop():
    flags = []
    result = run_decode(
        FD24, DriverConfig(), [request("a", [3, 4], max_tokens=3)], on_step=lambda s, r: flags.append(bool(r.not_need_stop()))
    )
    assert flags == [True, True, False]
    assert [m.not_need_stop for m in result.messages] == [True, True, False]


@pytest.mark.parametrize("batch", [1, 7, 128])
def test_batch_sizes(batch):
    reqs = [request(f"r{i}", [1 + i % 900, 5, 6], max_tokens=4, logprobs=5) for i in range(batch)]
    result = run_decode(FD24, DriverConfig(max_num_seqs=batch, max_model_len=16, enable_logprob=True), reqs)
    assert all(out.finished and len(out.token_ids) == 4 for out in result.outputs.values())
    assert result.messages[0].bsz == batch


def test_batch_of_1024_runs_on_the_zmq_path_and_overflows_the_message_queue():
    reqs = lambda: [request(f"x{i}", [1 + i % 1000, 5], max_tokens=2) for i in range(1024)]  # noqa: E731
    config = DriverConfig(max_num_seqs=1024, max_model_len=8, block_size=8, save_output_v1=True)
    result = run_decode(FD24, config, reqs())
    assert sum(out.finished for out in result.outputs.values()) == 1024
    assert len(result.zmq_payloads[0]) == 1024
    with pytest.raises(MessageOverflowError):
        run_decode(FD24, DriverConfig(max_num_seqs=1024, max_model_len=8, block_size=8), reqs(), max_steps=1)


def test_logprob_widths_on_the_message_queue_and_the_zmq_path():
    queue = run_decode(FD24, DriverConfig(enable_logprob=True), mixed_logprob_requests()).outputs
    zmq = run_decode(FD24, DriverConfig(enable_logprob=True, save_output_v1=True), mixed_logprob_requests()).outputs
    for k, queue_width, zmq_width in ((0, 1, 1), (1, 2, 2), (5, 6, 6), (20, 21, 21), (-1, 21, 1025)):
        for outputs, width in ((queue, queue_width), (zmq, zmq_width)):
            out = outputs[f"k{k}"]
            assert len(out.logprobs) == len(out.token_ids)
            for token, lp in zip(out.token_ids[:-1], out.logprobs):
                assert len(lp.token_ids) == width and lp.token_ids[0] == token and lp.rank >= 1
    top = queue["k20"].logprobs[0].logprobs[1:]
    assert top == sorted(top, reverse=True)
    assert queue["k20"].logprobs[0].token_ids[:6] == zmq["k20"].logprobs[0].token_ids[:6]
    assert np.allclose(queue["k20"].logprobs[0].logprobs, zmq["k20"].logprobs[0].logprobs[:21])


def test_warm_up_run_does_not_change_outputs():
    plain = run_decode(FD24, DriverConfig(), [request("a", [3, 4, 5])])
    warmed = run_decode(FD24, DriverConfig(warmup=True), [request("a", [3, 4, 5])])
    assert _tokens(plain) == _tokens(warmed) and len(plain.messages) == len(warmed.messages)


def test_legacy_scheduler_path_gives_the_same_tokens():
    reqs = lambda: [request(f"n{i}", [3 + i, 4, 5], max_tokens=5 + i) for i in range(3)]  # noqa: E731
    v1 = run_decode(FD24, DriverConfig(), reqs())
    legacy = run_decode(FD24, DriverConfig(use_v1_scheduler=False), reqs())
    assert _tokens(v1) == _tokens(legacy)


def test_keep_sampling_mask_renormalises_logprobs_and_sends_masks():
    reqs = lambda: [request("m", [3, 4, 5], max_tokens=3, logprobs=2, top_p=0.5)]  # noqa: E731
    plain = run_decode(FD24, DriverConfig(enable_logprob=True), reqs())
    ksm = run_decode(FD24, DriverConfig(enable_logprob=True, keep_sampling_mask=True), reqs())
    assert _tokens(plain) == _tokens(ksm)
    assert len(ksm.sampling_masks) == ksm.executed_steps
    token = ksm.outputs["m"].token_ids[0]
    assert token in ksm.sampling_masks[0][0].tolist()
    raw, renormalised = plain.outputs["m"].logprobs[0].logprobs[0], ksm.outputs["m"].logprobs[0].logprobs[0]
    assert renormalised > raw  # minus log Z_K, with Z_K < 1


def test_logprob_fallback_without_logprob_requests_is_deterministic():
    """enable_logprob with no request asking: 2.4 sends the sampled ids through save_output_topk
    with placeholder scores (zeros in the replica, so runs compare bit for bit)."""
    reqs = lambda: [request("a", [3, 4, 5], max_tokens=3), request("b", [6, 4], max_tokens=2)]  # noqa: E731
    first = run_decode(FD24, DriverConfig(enable_logprob=True), reqs())
    second = run_decode(FD24, DriverConfig(enable_logprob=True), reqs())
    assert first.differences(second) == []
    assert {m.kind for m in first.messages} == {"topk"}
    assert first.outputs["a"].logprobs == []


# -- preemption (FD 2.4's ResourceManagerV1._trigger_preempt and the TokenProcessor's reschedule) --


def _record_inserts(monkeypatch):
    import importlib

    cls = importlib.import_module(FD24 + ".worker.gpu_model_runner").GPUModelRunner
    original, seen = cls.insert_tasks_v1, []

    def insert_tasks_v1(self, tasks, num_running_requests=None):
        seen.append([(t.request_id, t.task_type.name, t.idx, t.prefill_start_index, t.prefill_end_index,
                      list(t.output_token_ids)) for t in tasks])
        return original(self, tasks, num_running_requests)

    monkeypatch.setattr(cls, "insert_tasks_v1", insert_tasks_v1)
    return seen


@pytest.mark.parametrize("blocks, lag", [(10, 0), (12, 0), (10, 1), (12, 1)])
def test_preemption_keeps_the_slot_and_prefills_prompt_plus_received_tokens_again(monkeypatch, blocks, lag):
    import dataclasses

    from fd_async_copy_plugin.testing.harness import preemption_workload

    config, requests, arrivals = preemption_workload(num_gpu_blocks=blocks, engine_lag=lag)
    ample = run_decode(FD24, dataclasses.replace(config, num_gpu_blocks=None, preemption=False), requests,
                       arrivals=arrivals, max_steps=400)
    inserts = _record_inserts(monkeypatch)
    tight = run_decode(FD24, config, requests, arrivals=arrivals, max_steps=400)
    assert tight.preemptions >= 4 and not tight.truncated and all(o.finished for o in tight.outputs.values())
    assert ample.preemptions == 0
    prompts = {r.request_id: len(r.prompt_token_ids) for r in list(requests) + [r for v in arrivals.values() for r in v]}
    flat = [task for step in inserts for task in step]
    for rid, out in tight.outputs.items():
        if out.preemptions and rid != "pre0":  # greedy: prefilling prompt + outputs again changes no token
            assert out.token_ids == ample.outputs[rid].token_ids, rid
        preempted = [i for i, t in enumerate(flat) if t[0] == rid and t[1] == "PREEMPTED"]
        assert len(preempted) == len(out.preemptions), rid
        for i, (received_then, received_at_reschedule) in zip(preempted, out.preemptions):
            assert flat[i][2] == out.slot  # the victim keeps its slot
            if received_at_reschedule is None:  # finished while preempted: never prefilled again
                assert out.finished and not [t for t in flat[i + 1:] if t[0] == rid]
                continue
            assert received_at_reschedule >= received_then
            again = [t for t in flat[i + 1:] if t[0] == rid and t[1] == "PREFILL"]
            final = next(t for t in again if t[4] == prompts[rid] + received_at_reschedule)
            assert again[0][3] == 0 and again[0][2] == out.slot  # from position 0, same slot
            assert final[5] == out.token_ids[:received_at_reschedule]  # prompt + every token received


def test_engine_one_step_behind_takes_tokens_in_flight_at_preemption_and_a_last_eos():
    from fd_async_copy_plugin.testing.harness import preemption_workload

    config, requests, arrivals = preemption_workload(engine_lag=1)
    result = run_decode(FD24, config, requests, arrivals=arrivals, max_steps=400)
    pairs = [p for o in result.outputs.values() for p in o.preemptions]
    assert any(p[1] is not None and p[1] > p[0] for p in pairs)  # a token was in flight when preempted
    late = result.outputs["pre8"]  # preempted with its eos (max_tokens=2) in flight
    assert late.preemptions == [[1, None]] and late.finished and late.stop_reason == "length"


def test_engine_lag_delays_outputs_by_one_step_not_tokens():
    requests = [request(f"l{i}", [3 + i, 4, 5], max_tokens=4 + i) for i in range(3)]
    now = run_decode(FD24, DriverConfig(), requests)
    late = run_decode(FD24, DriverConfig(engine_lag=1), requests)
    for rid, out in now.outputs.items():
        other = late.outputs[rid]
        assert other.token_ids == out.token_ids
        assert (other.first_token_step, other.finish_step) == (out.first_token_step + 1, out.finish_step + 1)
    assert len(late.messages) == len(now.messages)


@pytest.mark.parametrize("settings, match", [
    (dict(preemption=True, use_v1_scheduler=False), "V1 scheduler"),
    (dict(preemption=True, save_output_v1=True), "msg-queue"),
    (dict(engine_lag=-1), "engine_lag"),
    (dict(engine_lag=1, save_output_v1=True), "engine_lag"),
])
def test_preemption_and_engine_lag_settings_are_checked(settings, match):
    with pytest.raises(ValueError, match=match):
        run_decode(FD24, DriverConfig(**settings), [request("x", [3, 4], max_tokens=2)])


def test_a_request_that_cannot_fit_alone_is_refused_when_preempting():
    with pytest.raises(ValueError, match="even alone"):
        run_decode(FD24, DriverConfig(block_size=4, num_gpu_blocks=3, max_model_len=32, preemption=True),
                   [request("big", [3, 4, 5, 6], max_tokens=12)])
