"""Mirrors ``fastdeploy/model_executor/pre_and_post_process.py`` (2.4).

- ops are bound with ``from .ops.gpu import ...`` like FastDeploy's CUDA branch (:66-89), so a
  patch must rebind this module's names, not only the ops package's;
- ``pre_process`` (:106), ``_build_stream_transfer_data`` (:198), ``post_process_normal`` (:242,
  2.4 order: thinking limit, step_idx/stop_flags, ``set_stop_value_multi_ends``,
  ``update_inputs_v1``/``update_inputs``, KSM renormalisation, then saving the output inside
  post-processing), ``post_process_specualate`` (:428, present, not modelled), ``post_process``
  (:578, the dispatcher, full 2.4 signature), ``step_cuda`` (:641), ``rebuild_padding`` (:828),
  ``post_process_pooling`` (:926).
"""

from __future__ import annotations

import queue
from typing import Dict, List, Optional, Union

import numpy as np
import paddle

from .. import envs
from ..config import SpeculativeConfig
from ..inter_communicator import ZmqIpcClient
from ..output.pooler import PoolerOutput, PoolingSequenceGroupOutput
from ..output.stream_transfer_data import DecoderState, StreamTransferData
from ..platforms import current_platform
from ..worker.output import LogprobsTensors, ModelOutputData, SamplerOutput
from .layers.sample.meta_data import SamplingMetadata
from .ops.gpu import (  # noqa: F401  (FastDeploy's import list)
    get_padding_offset,
    limit_thinking_content_length,
    save_output,
    save_output_topk,
    set_stop_value_multi_ends,
    speculate_get_output_padding_offset,
    speculate_get_padding_offset,
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
    input_ids: paddle.Tensor,
    seq_lens_this_time: int,
    speculative_decoding: bool,
    draft_tokens: Optional[paddle.Tensor] = None,
    seq_lens_encoder: Optional[paddle.Tensor] = None,
    seq_lens_decoder: Optional[paddle.Tensor] = None,
):
    """Remove padding: returns ``ids_remove_padding, batch_id_per_token, cu_seqlens_q,
    cu_seqlens_k, output_cum_offsets, output_padding_offset``."""
    token_num = as_device(paddle.sum(seq_lens_this_time))
    if current_platform.is_cuda() and not speculative_decoding:
        ids_remove_padding, batch_id_per_token, cu_seqlens_q, cu_seqlens_k = get_padding_offset(
            input_ids, token_num, seq_lens_this_time
        )
        return ids_remove_padding, batch_id_per_token, cu_seqlens_q, cu_seqlens_k, None, None
    raise NotImplementedError("speculative pre_process is not modelled by the replica")


def _build_stream_transfer_data(
    output_tokens: paddle.Tensor,
    pooler_outputs: List[PoolingSequenceGroupOutput] = None,
    logprobs: Optional[LogprobsTensors] = None,
    prompt_logprobs_list: Optional[LogprobsTensors] = None,
    sampling_mask: Optional[List[np.ndarray]] = None,
):
    """Split the step's output per batch row for the ZMQ output thread."""
    stream_transfer_datas = []
    if output_tokens is not None:
        # ``output_tokens.reshape([-1]).numpy()``: a Paddle op, then a blocking D2H of device data.
        paddle_op_inputs("_build_stream_transfer_data.reshape", output_tokens)
        output_tokens = host_view(output_tokens, "_build_stream_transfer_data.output_tokens").reshape(-1)
        output_tokens_lists = np.split(output_tokens, output_tokens.shape[0])

        sampling_mask_list = sampling_mask
        for bid, output_token_per_sample in enumerate(output_tokens_lists):
            stream_transfer_data = StreamTransferData(
                decoder_state=DecoderState.TEXT, tokens=output_token_per_sample, batch_id=bid
            )
            if logprobs:
                stream_transfer_data.logprobs = logprobs.slice_rows(bid, bid + 1)
            if prompt_logprobs_list:
                stream_transfer_data.prompt_logprobs = prompt_logprobs_list[bid]
            if sampling_mask_list is not None:
                stream_transfer_data.sampling_mask = sampling_mask_list[bid]
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


def _renormalize_logprobs(logprobs_tensors: LogprobsTensors, logz_per_batch: np.ndarray) -> LogprobsTensors:
    """KSM: ``log pi_masked = log pi_full - log Z_K`` where finite, else -inf (:374-392)."""
    logprobs = logprobs_tensors.logprobs
    paddle_op_inputs("post_process_normal.keep_sampling_mask_renormalize", logprobs)
    logz = paddle.to_tensor(logz_per_batch, dtype=logprobs.dtype)
    valid_mask = paddle.isfinite(logprobs)
    normalized_logprobs = paddle.where(
        valid_mask,
        logprobs - logz.unsqueeze(1),
        paddle.full_like(logprobs, float("-inf")),
    )
    return LogprobsTensors(
        logprob_token_ids=logprobs_tensors.logprob_token_ids,
        logprobs=normalized_logprobs,
        selected_token_ranks=logprobs_tensors.selected_token_ranks,
    )


def post_process_normal(
    sampler_output: SamplerOutput,
    model_output: ModelOutputData,
    share_inputs: Dict[str, paddle.Tensor],
    sampling_metadata: SamplingMetadata,
    block_size: int = 64,
    save_each_rank: bool = False,
    skip_save_output: bool = False,
    async_output_queue: queue.Queue = None,
    think_end_id: int = -1,
    splitwise_role_is_decode: bool = False,
    enable_entropy: bool = False,
    routing_replay_manager=None,
    sampling_mask_zmq_client: ZmqIpcClient = None,
):
    """Post-processing after one token per request, saving the output at the end (2.4)."""
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
    # 1. Set stop value
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
        False,
    )

    if enable_entropy:
        raise NotImplementedError("logits entropy is not modelled by the replica")
    if routing_replay_manager is not None:
        raise NotImplementedError("routing replay is not modelled by the replica")

    # 2. Update the input buffer of the model
    with paddle.framework._no_check_dy2st_diff():
        if envs.ENABLE_V1_KVCACHE_SCHEDULER:
            update_inputs_v1(
                model_output.stop_flags,
                model_output.not_need_stop,
                model_output.seq_lens_this_time,
                model_output.seq_lens_encoder,
                model_output.seq_lens_decoder,
                share_inputs["step_seq_lens_decoder"],
                share_inputs["prompt_lens"],
                sampler_output.sampled_token_ids,
                model_output.input_ids,
                share_inputs["block_tables"],
                model_output.stop_nums,
                model_output.next_tokens,
                model_output.is_block_step,
                block_size,
            )
        else:
            update_inputs(
                model_output.stop_flags,
                model_output.not_need_stop,
                model_output.seq_lens_this_time,
                model_output.seq_lens_encoder,
                model_output.seq_lens_decoder,
                model_output.input_ids,
                model_output.stop_nums,
                sampler_output.sampled_token_ids,
                model_output.is_block_step,
            )
    # 3. KSM: renormalise logprobs to the truncated sampling distribution.
    if sampler_output.logprobs_tensors is not None and sampler_output.logz_per_batch is not None:
        sampler_output.logprobs_tensors = _renormalize_logprobs(
            sampler_output.logprobs_tensors, sampler_output.logz_per_batch
        )

    # 4. Transmit the output and the stop signal.
    if not skip_save_output:
        if envs.FD_USE_GET_SAVE_OUTPUT_V1:
            if save_each_rank or model_output.mp_rank == 0:
                output = _build_stream_transfer_data(
                    sampler_output.sampled_token_ids,
                    logprobs=sampler_output.logprobs_tensors,
                    prompt_logprobs_list=model_output.prompt_logprobs_list,
                    sampling_mask=sampler_output.sampling_mask,
                )
                async_output_queue.put(output)
        else:
            if sampler_output.logprobs_tensors is None:
                save_output(
                    sampler_output.sampled_token_ids,
                    model_output.not_need_stop,
                    model_output.mp_rank,
                    save_each_rank,
                )
            else:
                save_output_topk(
                    sampler_output.sampled_token_ids,
                    sampler_output.logprobs_tensors.logprob_token_ids,
                    sampler_output.logprobs_tensors.logprobs,
                    sampler_output.logprobs_tensors.selected_token_ranks,
                    model_output.not_need_stop,
                    model_output.mp_rank,
                )
            if sampler_output.sampling_mask is not None and model_output.mp_rank == 0:
                mask_dict = {i: arr.tolist() for i, arr in enumerate(sampler_output.sampling_mask)}
                sampling_mask_zmq_client.send_pyobj(mask_dict)


def post_process_specualate(
    sampler_output: SamplerOutput,
    model_output: ModelOutputData,
    share_inputs: Dict[str, paddle.Tensor],
    sampling_metadata: SamplingMetadata,
    save_each_rank: bool = False,
    skip_save_output: bool = False,
    think_end_id: int = -1,
    splitwise_role_is_decode: bool = False,
    enable_entropy: bool = False,
    routing_replay_manager=None,
    sampling_mask_zmq_client: ZmqIpcClient = None,
):
    """Speculative decoding post-processing (present with 2.4's signature; not modelled)."""
    raise NotImplementedError("speculative decoding is not modelled by the replica")


def post_process(
    sampler_or_pooler_output: Union[SamplerOutput, PoolerOutput],
    model_output: ModelOutputData,
    share_inputs: Dict[str, paddle.Tensor],
    sampling_metadata: SamplingMetadata = None,
    block_size: int = 64,
    save_each_rank: bool = False,
    speculative_decoding: bool = False,
    skip_save_output: bool = False,
    async_output_queue: queue.Queue = None,
    think_end_id: int = -1,
    line_break_id: int = -1,
    splitwise_role_is_decode: bool = False,
    enable_entropy: bool = False,
    routing_replay_manager=None,
    sampling_mask_zmq_client: ZmqIpcClient = None,
) -> None:
    """Dispatch: pooling, speculative or normal post-processing (``line_break_id`` is unused)."""
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
            sampling_mask_zmq_client,
        )
    else:
        post_process_normal(
            sampler_or_pooler_output,
            model_output,
            share_inputs,
            sampling_metadata,
            block_size,
            save_each_rank,
            skip_save_output,
            async_output_queue,
            think_end_id,
            splitwise_role_is_decode,
            enable_entropy,
            routing_replay_manager,
            sampling_mask_zmq_client,
        )


def step_cuda(
    share_inputs: Dict[str, paddle.Tensor],
    block_size: int,
    enc_dec_block_num: int,
    speculative_config: SpeculativeConfig,
    enable_prefix_caching: bool = False,
) -> None:
    """Non-V1 block recycling after each step."""
    if speculative_config.method is not None:
        raise NotImplementedError("speculative step_cuda is not modelled by the replica")
    names = (
        "stop_flags", "seq_lens_this_time", "step_seq_lens_encoder", "seq_lens_encoder", "seq_lens_decoder",
        "block_tables", "encoder_block_lens", "is_block_step", "step_block_list", "step_lens",
        "recover_block_list", "recover_lens", "need_block_list", "need_block_len", "used_list_len",
        "free_list", "free_list_len", "input_ids", "pre_ids", "step_idx", "next_tokens", "first_token_ids",
    )
    args = [share_inputs[name] for name in names]
    if DISABLE_RECOVER:
        step_reschedule(*args, block_size, enc_dec_block_num)
    elif enable_prefix_caching:
        step_system_cache(*args, block_size, enc_dec_block_num)
    else:
        step_paddle(*args, block_size, enc_dec_block_num)


def rebuild_padding(
    tmp_out: paddle.Tensor,
    cu_seqlens_q: paddle.Tensor,
    seq_len_this_time: paddle.Tensor,
    seq_lens_decoder: paddle.Tensor,
    seq_lens_encoder: paddle.Tensor,
    output_padding_offset: Optional[paddle.Tensor] = None,
    max_input_length: Optional[int] = None,
    first_token_out: Optional[paddle.Tensor] = None,
    enable_logprob: Optional[bool] = False,
):
    """One hidden row per running request (the CUDA branch imports the op lazily, like FD)."""
    if current_platform.is_cuda():
        from .ops.gpu import rebuild_padding

        return rebuild_padding(
            tmp_out,
            cu_seqlens_q,
            seq_len_this_time,
            seq_lens_decoder,
            seq_lens_encoder,
            output_padding_offset,
            first_token_out,
            max_input_length,
            enable_logprob,
        )
    raise RuntimeError("Not supported platform")


def post_process_pooling(
    pooler_output: PoolerOutput,
    model_output: ModelOutputData,
    share_inputs: Dict[str, paddle.Tensor],
    block_size: int = 64,
    save_each_rank: bool = False,
    skip_save_output: bool = False,
    async_output_queue: queue.Queue = None,
    routing_replay_manager=None,
) -> None:
    """Pooling models: step bookkeeping, every slot stopped, pooler outputs on the V1 path."""
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
                model_output.stop_nums,
                model_output.next_tokens,
                model_output.is_block_step,
                block_size,
            )

    if not skip_save_output:
        if save_each_rank or model_output.mp_rank == 0:
            output = _build_stream_transfer_data(output_tokens=None, pooler_outputs=pooler_output.outputs)
            async_output_queue.put(output)
