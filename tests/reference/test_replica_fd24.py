"""The FastDeploy 2.4 replica is faithful at the patch points: names, signatures, name bindings,
share_inputs, and the host<->device interactions the sync census counts."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os

import paddle
from replica_cases import FD24, mixed_logprob_requests, request

from fd_async_copy_plugin.testing.reference.driver import DriverConfig, run_decode
from fd_async_copy_plugin.runtime import census


def mod(name: str):
    return importlib.import_module(f"{FD24}.{name}")


def params(fn) -> list:
    return list(inspect.signature(fn).parameters)


def test_replica_is_not_importable_as_fastdeploy():
    spec = importlib.util.find_spec("fastdeploy")
    reference_dir = os.path.dirname(mod("envs").__file__)
    assert spec is None or not (spec.origin or "").startswith(os.path.dirname(reference_dir))
    assert mod("envs").__name__ == "fd_async_copy_plugin.testing.reference.fd24.envs"
    assert importlib.import_module(FD24).__version__ == "2.4.0"


def test_op_signatures_are_2_4():
    ops = mod("model_executor.ops.gpu")
    assert params(ops.update_inputs_v1) == [
        "stop_flags", "not_need_stop", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder",
        "step_seq_lens_decoder", "prompt_lens", "topk_ids", "input_ids", "block_tables", "stop_nums",
        "next_tokens", "is_block_step", "block_size",
    ]
    assert params(ops.update_inputs) == [
        "stop_flags", "not_need_stop", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder",
        "input_ids", "stop_nums", "next_tokens", "is_block_step",
    ]
    assert params(ops.save_output) == ["x", "not_need_stop", "rank_id", "save_each_rank"]
    assert params(ops.save_output_topk) == ["x", "topk_ids", "logprob_scores", "ranks", "not_need_stop", "rank_id"]
    assert not hasattr(ops, "get_stop") and not hasattr(ops, "set_stop")


def test_post_process_signatures_are_2_4():
    pp = mod("model_executor.pre_and_post_process")
    assert params(pp.post_process) == [
        "sampler_or_pooler_output", "model_output", "share_inputs", "sampling_metadata", "block_size",
        "save_each_rank", "speculative_decoding", "skip_save_output", "async_output_queue", "think_end_id",
        "line_break_id", "splitwise_role_is_decode", "enable_entropy", "routing_replay_manager",
        "sampling_mask_zmq_client",
    ]
    assert params(pp.post_process_normal)[:8] == [
        "sampler_output", "model_output", "share_inputs", "sampling_metadata", "block_size",
        "save_each_rank", "skip_save_output", "async_output_queue",
    ]
    assert not hasattr(pp, "save_output_normal")
    for name in ("post_process_specualate", "post_process_pooling", "_build_stream_transfer_data", "rebuild_padding", "step_cuda", "pre_process"):
        assert callable(getattr(pp, name))


def test_ops_and_post_process_are_bound_by_name_in_importing_modules():
    ops = mod("model_executor.ops.gpu")
    pp = mod("model_executor.pre_and_post_process")
    for name in ("update_inputs_v1", "update_inputs", "save_output", "save_output_topk", "set_stop_value_multi_ends"):
        assert getattr(pp, name) is getattr(ops, name)
    for runner in ("worker.gpu_model_runner", "worker.metax_model_runner", "worker.gcu_model_runner"):
        assert mod(runner).post_process is pp.post_process
        assert mod(runner).rebuild_padding is pp.rebuild_padding
    assert mod("worker.metax_model_runner").step_cuda is pp.step_cuda
    assert mod("worker.gpu_model_runner").step_cuda is pp.step_cuda


def test_output_dataclasses_are_2_4():
    out = mod("worker.output")
    names = [f.name for f in dataclasses.fields(out.ModelOutputData)]
    assert names[:8] == ["next_tokens", "stop_flags", "step_idx", "max_dec_len", "pre_ids", "seq_lens_this_time", "eos_token_id", "not_need_stop"]
    assert "not_need_stop_device" not in names and names[15] == "stop_nums"
    assert [f.name for f in dataclasses.fields(out.SamplerOutput)][-2:] == ["sampling_mask", "logz_per_batch"]
    assert out.LogprobsTensors._fields == ("logprob_token_ids", "logprobs", "selected_token_ranks")


def test_slice_rows_keeps_each_fields_place():
    out = mod("worker.output")
    t = out.LogprobsTensors.empty_cpu(3, 2)
    sliced = t.slice_rows(1, 2)
    assert [list(f.shape) for f in sliced] == [[1, 2], [1, 2], [1]]
    assert all(f.place.is_cpu_place() for f in sliced)


def test_sampler_gathers_on_device_then_blocks_three_times(host_backend):
    sampler_mod = mod("model_executor.layers.sample.sampler")
    sampler = sampler_mod.Sampler()
    assert sampler.forward == sampler.forward_cuda
    logits = paddle.to_tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 1.0]])
    tokens = paddle.to_tensor([[2], [0]], dtype="int64")
    with census.collecting() as c:
        c.begin_step()
        result = sampler.gather_logprobs(sampler.compute_logprobs(logits), 2, tokens)
    assert c.steps[0].sites("blocking_d2h") == [
        "Sampler.gather_logprobs.logprob_token_ids",
        "Sampler.gather_logprobs.logprobs",
        "Sampler.gather_logprobs.selected_token_ranks",
    ]
    assert result.logprob_token_ids.numpy().tolist() == [[2, 1, 2], [0, 0, 3]]
    assert result.selected_token_ranks.numpy().tolist() == [2, 1]
    spec = sampler_mod.SpeculativeSampler.gather_logprobs
    assert "cpu" not in inspect.getsource(spec) and "cpu" not in inspect.getsource(sampler_mod.MTPSampler.gather_logprobs)


def test_share_inputs_are_a_dict_with_2_4_shapes():
    runner_mod = mod("worker.gpu_model_runner")
    assert hasattr(runner_mod.GPUModelRunner, "_init_share_inputs")
    holder = {}
    run_decode(FD24, DriverConfig(max_num_seqs=4), [request("a", [3, 4])], on_step=lambda s, r: holder.setdefault("r", r))
    si = holder["r"].share_inputs
    assert type(si) is dict
    assert list(si["not_need_stop"].shape) == [1] and si["not_need_stop"].dtype == paddle.bool
    assert list(si["stop_flags"].shape) == [4, 1] and list(si["stop_nums"].shape) == [1]
    assert list(si["next_tokens"].shape) == [4, 1] and list(si["is_block_step"].shape) == [4]
    assert "not_need_stop_device" not in si and "sampled_token_ids" not in si
    assert isinstance(holder["r"].not_need_stop(), paddle.Tensor)  # 2.4 returns a 0-d Tensor


def test_reset_share_inputs_names_the_2_5_keys_without_failing():
    utils = mod("utils")
    holder = {}
    run_decode(FD24, DriverConfig(max_num_seqs=2), [request("a", [3, 4])], on_step=lambda s, r: holder.setdefault("r", r))
    utils.fill_failures.clear()
    holder["r"].reset_share_inputs()
    assert utils.fill_failures == []
    assert "not_need_stop_device" in inspect.getsource(holder["r"].reset_share_inputs)
    assert bool(holder["r"].share_inputs["stop_flags"].numpy().all())


def test_census_of_a_decode_step_with_logprobs():
    with census.collecting() as c:
        result = run_decode(FD24, DriverConfig(enable_logprob=True), mixed_logprob_requests())
    decode_steps = c.steps[1:result.executed_steps - 1]
    assert decode_steps
    for step in decode_steps:
        blocking = step.sites("blocking_d2h")
        assert sum(s.startswith("Sampler.gather_logprobs") for s in blocking) == 3
        assert blocking.count("update_inputs_v1.not_need_stop") == 1
        assert sum(s.startswith("save_output") for s in blocking) >= 1
        assert len(blocking) >= 5
        assert step.count("pinned_alloc") == 0 and step.count("async_d2h") == 0


def test_census_counts_the_zmq_path_copy_and_prompt_logprob_offsets():
    with census.collecting() as c:
        run_decode(
            FD24,
            DriverConfig(enable_logprob=True, save_output_v1=True),
            [request("p", range(2, 12), max_tokens=2, prompt_logprobs=2)],
        )
    first = c.steps[0].sites("blocking_d2h")
    assert "_build_stream_transfer_data.output_tokens" in first
    assert "_get_prompt_logprobs_list.offset" in first


def test_a_pinned_not_need_stop_is_an_op_on_pinned_in_save_output_topk(host_backend):
    ops = mod("model_executor.ops.gpu")
    pinned_flag = host_backend.new_pinned([1], "bool", "flag")
    with census.collecting() as c:
        c.begin_step()
        ops.save_output_topk(
            paddle.to_tensor([[5]], dtype="int64"),
            paddle.to_tensor([[5, 1]], dtype="int64"),
            paddle.to_tensor([[-0.5, -1.0]], dtype="float32"),
            paddle.to_tensor([1], dtype="int64"),
            pinned_flag,
            0,
        )
    assert c.steps[0].sites("op_on_pinned") == ["save_output_topk"]


def test_update_inputs_v1_refuses_a_device_flag_like_the_2_4_op_would_crash():
    import pytest

    from fd_async_copy_plugin.testing.reference.placement import as_device

    ops = mod("model_executor.ops.gpu")
    z = lambda shape, dtype="int32", v=0: paddle.full(shape, v, dtype=dtype)  # noqa: E731
    with pytest.raises(RuntimeError, match="dereferences not_need_stop"):
        ops.update_inputs_v1(
            z([2, 1], "bool", True), as_device(z([1], "bool")), z([1, 1]), z([2, 1]), z([2, 1]), z([2, 1]),
            z([2, 1], "int64"), z([1, 1], "int64"), z([2, 4], "int64"), z([2, 2], "int32", -1),
            z([1], "int64", 2), z([2, 1], "int64"), z([2], "bool"), 4,
        )


def test_profile_detection_reads_the_replica_as_fastdeploy_2_4():
    from fd_async_copy_plugin import profile

    markers = profile.read_markers(profile.root_directory(FD24))
    assert profile.classify(markers)[0] == "fastdeploy-2.4"
