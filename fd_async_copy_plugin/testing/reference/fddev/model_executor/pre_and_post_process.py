"""Mirrors ``fastdeploy/model_executor/pre_and_post_process.py`` (develop) at the patch points: the
2.5 replica's functions, with develop's one change at a census site.

- ``pre_process(token_num_cpu, ...)`` (:148): the host token count comes from the runner;
- ``post_process_normal`` (:250): no saving; ``update_inputs_v1`` gets ``not_need_stop_device``
  (:341-355);
- ``save_output_normal`` (:369-429): called by ``GPUModelRunner._save_model_output`` after
  ``post_process_event`` was waited on. The V1 (ZMQ) path now sends the **pinned**
  ``share_inputs["sampled_token_ids"]`` (``recover_batch_index_for_output(..., ["sampled_token_ids"])``,
  :380-394; 2.5 handed the device ``sampler_output.sampled_token_ids`` to
  ``_build_stream_transfer_data``, a blocking copy there); ``save_output`` / ``save_output_topk``
  read the pinned buffer as in 2.5;
- ``post_process`` (:588), ``rebuild_padding`` (:832), ``post_process_pooling`` (:927), ``step_cuda``
  as in the 2.5 replica.
"""

from __future__ import annotations

import queue
from typing import Dict, List, Optional, Union

import numpy as np
import paddle

from .. import envs
from ..config import SpeculativeConfig
from ..output.pooler import PoolerOutput, PoolingSequenceGroupOutput
from ..output.stream_transfer_data import DecoderState, StreamTransferData
from ..platforms import current_platform
from ..worker.input_batch import (
    InputBatch,
    recover_batch_index_for_output,
    recover_batch_index_for_sampler_output,
)
from ..worker.output import LogprobsTensors, ModelOutputData, SamplerOutput
from .layers.sample.meta_data import SamplingMetadata
from .ops.gpu import (  # noqa: F401  (FastDeploy's import list)
    get_padding_offset,
    limit_thinking_content_length,
    save_output,
    save_output_topk,
    set_stop_value_multi_ends,
    speculate_get_seq_lens_output,
    speculate_limit_thinking_content_length,
    speculate_save_output,
    speculate_save_output_topk,
    speculate_set_stop_value_multi_seqs,
    speculate_set_value_by_flags_and_idx,
    speculate_step_paddle,
    speculate_step_reschedule,
    speculate_step_system_cache,
    speculate_update,
    step_paddle,
    step_reschedule,
    step_system_cache,
    update_inputs,
    update_inputs_v1,
)
from ...placement import as_device, host_view, paddle_op_inputs

DISABLE_RECOVER = envs.FD_DISABLED_RECOVER == "1"


def pre_process(
    token_num_cpu: int,
    input_ids: paddle.Tensor,
    seq_lens_this_time: paddle.Tensor,
    speculative_decoding: bool,
    draft_tokens: Optional[paddle.Tensor] = None,
    seq_lens_encoder: Optional[paddle.Tensor] = None,
    seq_lens_decoder: Optional[paddle.Tensor] = None,
):
    if current_platform.is_cuda() and not speculative_decoding:
        ids_remove_padding, batch_id_per_token, cu_seqlens_q, cu_seqlens_k = get_padding_offset(
            input_ids, seq_lens_this_time, None, None, token_num_cpu
        )
        return ids_remove_padding, batch_id_per_token, cu_seqlens_q, cu_seqlens_k, None, None
    raise NotImplementedError("speculative pre_process is not modelled by the replica")


def _build_stream_transfer_data(
    output_tokens: paddle.Tensor,
    pooler_outputs: List[PoolingSequenceGroupOutput] = None,
    logprobs: Optional[LogprobsTensors] = None,
    prompt_logprobs_list: Optional[LogprobsTensors] = None,
):
    """Split the step's output per batch row for the ZMQ output thread."""
    stream_transfer_datas = []
    if output_tokens is not None:
        paddle_op_inputs("_build_stream_transfer_data.reshape", output_tokens)
        output_tokens = host_view(output_tokens, "_build_stream_transfer_data.output_tokens").reshape(-1)
        for bid, output_token_per_sample in enumerate(np.split(output_tokens, output_tokens.shape[0])):
            stream_transfer_data = StreamTransferData(
                decoder_state=DecoderState.TEXT, tokens=output_token_per_sample, batch_id=bid
            )
            if logprobs:
                stream_transfer_data.logprobs = logprobs.slice_rows(bid, bid + 1)
            if prompt_logprobs_list:
                stream_transfer_data.prompt_logprobs = prompt_logprobs_list[bid]
            stream_transfer_datas.append(stream_transfer_data)
    elif pooler_outputs is not None:
        for bid, pooler_output in enumerate(pooler_outputs):
            if pooler_output is None:
                continue
            if pooler_output.dtype == paddle.bfloat16:
                pooler_output = pooler_output.astype("float32")
            pooler_output = host_view(pooler_output, "_build_stream_transfer_data.pooler_output")
            stream_transfer_datas.append(
                StreamTransferData(decoder_state=DecoderState.TEXT, pooler_output=pooler_output, batch_id=bid)
            )
    return stream_transfer_datas


def post_process_normal(
    sampler_output: SamplerOutput,
    model_output: ModelOutputData,
    share_inputs: InputBatch,
    sampling_metadata: SamplingMetadata,
    block_size: int = 64,
    think_end_id: int = -1,
    splitwise_role_is_decode: bool = False,
    enable_entropy: bool = False,
    routing_replay_manager=None,
):
    """Post-processing after one token per request; the save happens later (save_output_normal)."""
    if think_end_id > 0:
        limit_thinking_content_length(
            sampler_output.sampled_token_ids,
            share_inputs["max_think_lens"],
            share_inputs["max_reply_lens"],
            share_inputs["step_idx"],
            share_inputs["limit_think_status"],
            share_inputs["stop_flags"],
            share_inputs["eos_token_id"],
            share_inputs["inject_token_ids"],
            think_end_id,
            splitwise_role_is_decode,
        )
    paddle.assign(
        paddle.where(model_output.stop_flags, model_output.step_idx, model_output.step_idx + 1),
        model_output.step_idx,
    )
    length_cond = paddle.greater_equal(model_output.step_idx, model_output.max_dec_len)
    paddle.assign(paddle.logical_or(model_output.stop_flags, length_cond), model_output.stop_flags)
    set_stop_value_multi_ends(
        sampler_output.sampled_token_ids,
        model_output.stop_flags,
        model_output.seq_lens_this_time,
        model_output.eos_token_id,
        model_output.next_tokens,
        model_output.pre_ids,
        model_output.step_idx,
        model_output.stop_token_ids,
        model_output.stop_seqs_len,
        model_output.min_tokens,
        False,
    )
    if enable_entropy:
        raise NotImplementedError("logits entropy is not modelled by the replica")
    if routing_replay_manager is not None:
        raise NotImplementedError("routing replay is not modelled by the replica")

    with paddle.framework._no_check_dy2st_diff():
        if envs.ENABLE_V1_KVCACHE_SCHEDULER:
            update_inputs_v1(
                model_output.stop_flags,
                model_output.not_need_stop_device,
                model_output.seq_lens_this_time,
                model_output.seq_lens_encoder,
                model_output.seq_lens_decoder,
                share_inputs["step_seq_lens_decoder"],
                share_inputs["prompt_lens"],
                sampler_output.sampled_token_ids,
                model_output.input_ids,
                share_inputs["block_tables"],
                model_output.next_tokens,
                model_output.is_block_step,
                block_size,
            )
        else:
            update_inputs(
                model_output.stop_flags,
                model_output.not_need_stop_device,
                model_output.seq_lens_this_time,
                model_output.seq_lens_encoder,
                model_output.seq_lens_decoder,
                model_output.input_ids,
                sampler_output.sampled_token_ids,
                model_output.is_block_step,
            )


def save_output_normal(
    model_output: ModelOutputData,
    sampler_output: SamplerOutput,
    share_inputs: Dict[str, paddle.Tensor],
    async_output_queue: queue.Queue = None,
    save_each_rank: bool = False,
):
    """Transmit the output and the stop signal (after ``post_process_event`` was waited on)."""
    if envs.FD_USE_GET_SAVE_OUTPUT_V1:
        if save_each_rank or model_output.mp_rank == 0:
            recover_share_inputs_map = recover_batch_index_for_output(
                share_inputs,
                model_output.index_to_batch_id,
                model_output.enable_pd_reorder,
                ["sampled_token_ids"],
            )
            recover_batch_index_for_sampler_output(
                sampler_output, model_output.index_to_batch_id, model_output.enable_pd_reorder
            )
            output = _build_stream_transfer_data(
                recover_share_inputs_map["sampled_token_ids"],
                logprobs=sampler_output.logprobs_tensors,
                prompt_logprobs_list=model_output.prompt_logprobs_list,
            )
            async_output_queue.put(output)
    else:
        if sampler_output.logprobs_tensors is None:
            recover_share_inputs_map = recover_batch_index_for_output(
                share_inputs,
                model_output.index_to_batch_id,
                model_output.enable_pd_reorder,
                ["last_preempted_idx", "sampled_token_ids"],
            )
            save_output(
                recover_share_inputs_map["sampled_token_ids"],
                model_output.not_need_stop,
                recover_share_inputs_map["last_preempted_idx"],
                model_output.mp_rank,
                save_each_rank,
            )
        else:
            recover_share_inputs_map = recover_batch_index_for_output(
                share_inputs,
                model_output.index_to_batch_id,
                model_output.enable_pd_reorder,
                ["last_preempted_idx"],
            )
            recover_batch_index_for_sampler_output(
                sampler_output, model_output.index_to_batch_id, model_output.enable_pd_reorder
            )
            save_output_topk(
                share_inputs["sampled_token_ids"],
                sampler_output.logprobs_tensors.logprob_token_ids,
                sampler_output.logprobs_tensors.logprobs,
                sampler_output.logprobs_tensors.selected_token_ranks,
                model_output.not_need_stop,
                recover_share_inputs_map["last_preempted_idx"],
                model_output.mp_rank,
            )
    share_inputs["last_preempted_idx"][:] = 0


def post_process_specualate(
    sampler_output: SamplerOutput,
    model_output: ModelOutputData,
    share_inputs: InputBatch,
    sampling_metadata: SamplingMetadata,
    save_each_rank: bool = False,
    skip_save_output: bool = False,
    think_end_id: int = -1,
    splitwise_role_is_decode: bool = False,
    enable_entropy: bool = False,
    routing_replay_manager=None,
):
    """Speculative decoding post-processing (present with 2.5's signature; not modelled)."""
    raise NotImplementedError("speculative decoding is not modelled by the replica")


def post_process(
    sampler_or_pooler_output: Union[SamplerOutput, PoolerOutput],
    model_output: ModelOutputData,
    share_inputs: InputBatch,
    sampling_metadata: SamplingMetadata = None,
    block_size: int = 64,
    save_each_rank: bool = False,
    speculative_decoding: bool = False,
    skip_save_output: bool = False,
    async_output_queue: queue.Queue = None,
    think_end_id: int = -1,
    splitwise_role_is_decode: bool = False,
    enable_entropy: bool = False,
    routing_replay_manager=None,
) -> None:
    """Dispatch: pooling, speculative or normal post-processing (no saving on the normal path)."""
    if isinstance(sampler_or_pooler_output, PoolerOutput):
        post_process_pooling(
            sampler_or_pooler_output,
            model_output,
            share_inputs,
            block_size,
            save_each_rank,
            skip_save_output,
            async_output_queue,
            routing_replay_manager,
        )
    elif speculative_decoding:
        post_process_specualate(
            sampler_or_pooler_output,
            model_output,
            share_inputs,
            sampling_metadata,
            save_each_rank,
            skip_save_output,
            think_end_id,
            splitwise_role_is_decode,
            enable_entropy,
            routing_replay_manager,
        )
    else:
        post_process_normal(
            sampler_or_pooler_output,
            model_output,
            share_inputs,
            sampling_metadata,
            block_size,
            think_end_id,
            splitwise_role_is_decode,
            enable_entropy,
            routing_replay_manager,
        )
        # FastDeploy passes no ``blocking`` argument here (a host-to-host copy); the replica passes
        # it positionally because Paddle 3.3 reads it out of bounds otherwise (platform-facts.md).
        share_inputs["last_preempted_idx"].copy_(share_inputs["preempted_idx"], True)
    share_inputs["preempted_idx"][:] = 0


def step_cuda(
    share_inputs: Dict[str, paddle.Tensor],
    block_size: int,
    enc_dec_block_num: int,
    speculative_config: SpeculativeConfig,
    enable_prefix_caching: bool = False,
) -> None:
    """Non-V1 block recycling (the replica's scheduler preallocates blocks on that path)."""
    if speculative_config.method is not None:
        raise NotImplementedError("speculative step_cuda is not modelled by the replica")
    step = step_reschedule if DISABLE_RECOVER else step_system_cache if enable_prefix_caching else step_paddle
    step(share_inputs, block_size, enc_dec_block_num)


def rebuild_padding(
    tmp_out: paddle.Tensor,
    cu_seqlens_q: paddle.Tensor,
    seq_len_this_time: paddle.Tensor,
    seq_lens_decoder: paddle.Tensor,
    seq_lens_encoder: paddle.Tensor,
    batch_id_per_token_output: Optional[paddle.Tensor] = None,
    cu_seqlens_q_output: Optional[paddle.Tensor] = None,
    first_token_out: Optional[paddle.Tensor] = None,
    enable_logprob: Optional[bool] = False,
):
    if current_platform.is_cuda():
        from .ops.gpu import rebuild_padding

        return rebuild_padding(
            tmp_out,
            cu_seqlens_q,
            seq_len_this_time,
            seq_lens_decoder,
            seq_lens_encoder,
            batch_id_per_token_output,
            cu_seqlens_q_output,
            first_token_out,
            enable_logprob,
        )
    raise RuntimeError("Not supported platform")


def post_process_pooling(
    pooler_output: PoolerOutput,
    model_output: ModelOutputData,
    share_inputs: InputBatch,
    block_size: int = 64,
    save_each_rank: bool = False,
    skip_save_output: bool = False,
    async_output_queue: queue.Queue = None,
    routing_replay_manager=None,
) -> None:
    """Pooling models (2.5 passes the pinned ``not_need_stop`` to ``update_inputs_v1`` here)."""
    paddle.assign(
        paddle.where(model_output.stop_flags, model_output.step_idx, model_output.step_idx + 1),
        model_output.step_idx,
    )
    length_cond = paddle.greater_equal(model_output.step_idx, model_output.max_dec_len)
    paddle.assign(paddle.logical_or(model_output.stop_flags, length_cond), model_output.stop_flags)
    if routing_replay_manager is not None:
        raise NotImplementedError
    with paddle.framework._no_check_dy2st_diff():
        if envs.ENABLE_V1_KVCACHE_SCHEDULER:
            dummy_sampled_tokens = as_device(paddle.full_like(model_output.next_tokens, -1, dtype="int64"))
            paddle.assign(paddle.ones_like(model_output.stop_flags, dtype="bool"), model_output.stop_flags)
            update_inputs_v1(
                model_output.stop_flags,
                model_output.not_need_stop,
                model_output.seq_lens_this_time,
                model_output.seq_lens_encoder,
                model_output.seq_lens_decoder,
                share_inputs["step_seq_lens_decoder"],
                share_inputs["prompt_lens"],
                dummy_sampled_tokens,
                model_output.input_ids,
                share_inputs["block_tables"],
                model_output.next_tokens,
                model_output.is_block_step,
                block_size,
            )
    if not skip_save_output:
        if save_each_rank or model_output.mp_rank == 0:
            output = _build_stream_transfer_data(output_tokens=None, pooler_outputs=pooler_output.outputs)
            async_output_queue.put(output)
