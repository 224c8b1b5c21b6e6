"""The FastDeploy 2.5 replica: 2.5 signatures and containers, the #6176/#6259/#6362 copy scheme
(pinned buffers, one event per step, per-step pinned logprob buffers), outputs identical to 2.4,
and a schedule that stays correct under the race-detecting simulator."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import paddle
import pytest
from replica_cases import FD24, FD25, mixed_logprob_requests, request

from fd_async_copy_plugin.testing.reference.driver import DriverConfig, run_decode
from fd_async_copy_plugin.runtime import census


def mod(name: str):
    return importlib.import_module(f"{FD25}.{name}")


def params(fn) -> list:
    return list(inspect.signature(fn).parameters)


def test_op_and_post_process_signatures_are_2_5():
    ops = mod("model_executor.ops.gpu")
    assert len(params(ops.update_inputs_v1)) == 13 and "stop_nums" not in params(ops.update_inputs_v1)
    assert params(ops.save_output) == ["x", "not_need_stop", "preempted_idx", "rank_id", "save_each_rank"]
    assert len(params(ops.save_output_topk)) == 7
    assert callable(ops.get_stop) and callable(ops.set_stop)
    pp = mod("model_executor.pre_and_post_process")
    assert params(pp.save_output_normal) == ["model_output", "sampler_output", "share_inputs", "async_output_queue", "save_each_rank"]
    assert "line_break_id" not in params(pp.post_process)
    assert params(pp.pre_process)[0] == "token_num_cpu"
    assert pp.update_inputs_v1 is ops.update_inputs_v1 and mod("worker.gpu_model_runner").post_process is pp.post_process


def test_runner_and_output_shapes_are_2_5():
    runner = mod("worker.gpu_model_runner").GPUModelRunner
    for name in ("execute_model_normal", "execute_model_overlap", "_preprocess_and_execute_model", "_postprocess", "_save_model_output"):
        assert hasattr(runner, name)
    assert not hasattr(runner, "_init_share_inputs")
    fields = [f.name for f in dataclasses.fields(mod("worker.output").ModelOutputData)]
    assert fields[-1] == "not_need_stop_device" and "min_tokens" in fields
    assert "pin_memory" in inspect.getsource(mod("model_executor.layers.sample.sampler").Sampler.gather_logprobs)


def test_input_batch_is_dict_like_and_reset_keeps_the_pinned_flag(host_backend):
    holder = {}
    run_decode(FD25, DriverConfig(max_num_seqs=3), [request("a", [3, 4], max_tokens=2)], on_step=lambda s, r: holder.setdefault("r", r))
    si = holder["r"].share_inputs
    assert type(si).__name__ == "InputBatch" and "not_need_stop_device" in si and "nope" not in si
    assert host_backend.is_pinned(si["not_need_stop"]) and host_backend.is_pinned(si["sampled_token_ids"])
    si["not_need_stop"][0] = True
    si.reset_share_inputs()
    assert bool(si["not_need_stop"].numpy()[0]) and not bool(si["not_need_stop_device"].numpy()[0])
    assert holder["r"].not_need_stop() in (True, False) and isinstance(holder["r"].not_need_stop(), bool)


@pytest.mark.parametrize("save_output_v1", [False, True])
def test_outputs_are_bit_identical_to_2_4(save_output_v1):
    config = DriverConfig(enable_logprob=True, save_output_v1=save_output_v1, chunk_size=6)
    arrivals = {3: [request("late", [9, 9, 9], max_tokens=3)]}
    fd24 = run_decode(FD24, config, mixed_logprob_requests(), arrivals=arrivals)
    fd25 = run_decode(FD25, config, mixed_logprob_requests(), arrivals=arrivals)
    assert fd24.differences(fd25) == []


def test_overlap_schedule_saves_one_step_late_with_the_same_messages():
    normal = run_decode(FD25, DriverConfig(enable_logprob=True), mixed_logprob_requests())
    overlap = run_decode(FD25, DriverConfig(enable_logprob=True, overlap=True), mixed_logprob_requests())
    for rid, out in normal.outputs.items():
        late = overlap.outputs[rid]
        assert late.token_ids == out.token_ids and late.logprobs == out.logprobs
        assert late.first_token_step == out.first_token_step + 1
    assert all(a.same_as(b) for a, b in zip(normal.messages, overlap.messages))
    assert overlap.steps == normal.steps + 1


def test_census_shows_pinned_allocs_per_step_and_no_blocking_update():
    with census.collecting() as c:
        result = run_decode(FD25, DriverConfig(enable_logprob=True), mixed_logprob_requests())
    for step in c.steps[: result.executed_steps]:
        assert sorted(step.sites("pinned_alloc")) == [
            "Sampler.gather_logprobs.logprob_token_ids",
            "Sampler.gather_logprobs.logprobs",
            "Sampler.gather_logprobs.selected_token_ranks",
        ]
        assert "update_inputs_v1.not_need_stop" not in step.sites("blocking_d2h")
        assert "_postprocess.not_need_stop" in step.sites("async_d2h")
        assert "_save_model_output<-post_process_event" in step.sites("event_wait")
        # 2.5 still hands pinned buffers to the PD_BUILD op save_output_topk.
        assert step.count("op_on_pinned") >= 4


def test_prompt_logprobs_synchronize_the_whole_device():
    with census.collecting() as c:
        run_decode(FD25, DriverConfig(enable_logprob=True, save_output_v1=True), [request("p", range(2, 12), max_tokens=2, prompt_logprobs=1)])
    assert c.steps[0].sites("device_sync") == ["paddle.device.synchronize"]


def test_slice_rows_copies_whole_fields_per_call(host_backend):
    out = mod("worker.output")
    dev = importlib.import_module("fd_async_copy_plugin.testing.reference.placement").as_device
    t = out.LogprobsTensors(*(dev(x) for x in (paddle.zeros([4, 3], "int64"), paddle.zeros([4, 3]), paddle.zeros([4], "int64"))))
    with census.collecting() as c:
        c.begin_step()
        rows = [t.slice_rows(i, i + 1) for i in range(4)]
    assert c.steps[0].count("blocking_d2h") == 12 and list(rows[0][0].shape) == [1, 3]


def _simulated_and_synchronous(config, make_requests):
    from fd_async_copy_plugin import runtime
    from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend

    previous = replica_backend.use(runtime.SimulatedBackend())
    try:
        simulated = run_decode(FD25, config, make_requests())
    finally:
        replica_backend.use(previous)
    return simulated, run_decode(FD25, config, make_requests())


def test_native_2_5_is_race_free_under_the_simulator():
    config = DriverConfig(enable_logprob=True, save_output_v1=True, chunk_size=5)
    simulated, synchronous = _simulated_and_synchronous(
        config, lambda: mixed_logprob_requests() + [request("pl", range(3, 15), max_tokens=3, prompt_logprobs=2)]
    )
    assert simulated.differences(synchronous) == []


def test_native_2_5_overlap_loses_a_step_when_set_stop_races_the_flag_copy():
    """2.5 with the overlap schedule: a prefill chunk inserted right after the batch went idle
    sets the pinned flag with ``set_stop(True)`` while the copy of ``not_need_stop_device``
    (False) from the previous step may still be in flight; when it lands later, ``_postprocess``
    sees False and drops that step (here: the second chunk's prompt logprobs). The simulator
    lands copies as late as allowed, so it shows the race deterministically."""
    config = DriverConfig(enable_logprob=True, overlap=True, save_output_v1=True, chunk_size=5)
    simulated, synchronous = _simulated_and_synchronous(
        config, lambda: [request("pl", range(3, 15), max_tokens=3, prompt_logprobs=2)]
    )
    assert "pl.prompt_logprobs differ" in simulated.differences(synchronous)
    lost = simulated.outputs["pl"].prompt_logprobs["token_ids"][5:10, 0]
    assert lost.tolist() != list(range(9, 14))


def test_profile_detection_reads_the_replica_as_fastdeploy_2_5():
    from fd_async_copy_plugin import profile

    markers = profile.read_markers(profile.root_directory(FD25))
    assert profile.classify(markers)[0] == "fastdeploy-2.5"


def test_batch_of_1024_with_the_overlap_schedule():
    reqs = [request(f"x{i}", [1 + i % 1000, 5], max_tokens=2) for i in range(1024)]
    config = DriverConfig(max_num_seqs=1024, max_model_len=8, block_size=8, save_output_v1=True, overlap=True)
    result = run_decode(FD25, config, reqs)
    assert sum(out.finished for out in result.outputs.values()) == 1024


def test_preempted_insert_writes_what_2_5_writes(host_backend):
    # gpu_model_runner.py (2.5) :851-870; preempted_idx cleared by PREFILL :723 / DECODE :849
    cfg = DriverConfig(max_num_seqs=2, vocab_size=64, max_model_len=32, num_gpu_blocks=3, preemption=True)
    reqs = [request(f"r{i}", range(3, 8 + i), max_tokens=20) for i in range(2)]
    result = run_decode(FD25, cfg, reqs, max_steps=200)
    assert result.preemptions > 0 and not result.truncated
    assert any(-9 in m.tokens().tolist() for m in result.messages)
    R = mod("engine.request")
    runner_mod = mod("worker.gpu_model_runner")
    # a direct insert: prefill a slot, then preempt it
    from fd_async_copy_plugin.testing.reference import driver as d
    with d._environment(cfg), d.paddle_device.routed():
        runner = runner_mod.GPUModelRunner(d._fd_config(d._Modules(FD25), cfg, 7999), "gpu", 0, 0, 0)
        runner.load_model()
        fd_req = d._fd_request(d._Modules(FD25), reqs[0])
        fd_req.idx, fd_req.task_type, fd_req.block_tables = 0, R.RequestType.PREFILL, [0, 1]
        fd_req.prefill_start_index, fd_req.prefill_end_index = 0, 5
        runner.insert_tasks_v1([fd_req], 1)
        si = runner.share_inputs
        si["preempted_idx"][0:1, :] = 1
        runner.insert_tasks_v1([fd_req], 1)
        assert int(si["preempted_idx"].numpy()[0, 0]) == 0  # PREFILL clears it (:723)
        task = R.Request(fd_req.request_id, fd_req.prompt_token_ids, [2], fd_req.sampling_params, idx=0,
                         task_type=R.RequestType.PREEMPTED)
        runner.insert_tasks_v1([task], 1)
        assert int(si["preempted_idx"].numpy()[0, 0]) == 1
        assert (si["block_tables"].numpy()[0] == -1).all()
        assert bool(si["stop_flags"].numpy().reshape(-1)[0])
        for key in ("seq_lens_this_time_buffer", "seq_lens_decoder", "seq_lens_encoder"):
            assert int(si[key].numpy().reshape(-1)[0]) == 0, key
        assert not bool(si["is_block_step"].numpy().reshape(-1)[0])
        assert runner.forward_batch_reqs_list[0] is None
        close = getattr(runner, "close", None)
        if close:
            close()

