"""Mirrors ``fastdeploy.model_executor.ops.gpu`` (2.5) at the patch points, with 2.5 signatures:

- ``update_inputs_v1``: 12 tensors (no ``stop_nums``) + ``block_size``; the kernel writes the
  **device** flag it is given (``not_need_stop_device``) and the op does no host copies (#6176).
  ``update_inputs`` likewise (8 tensors).
- ``save_output``: 5 arguments (``preempted_idx`` third; preempted rows are sent as -9), pybind:
  a pinned input is read through its host pointer without any stream wait.
  ``save_output_topk``: 7 arguments, a ``PD_BUILD_STATIC_OP`` only (pinned inputs are moved to the
  GPU by Paddle's data transform; the census counts each).
- ``get_stop`` / ``set_stop``: pybind functions (``set_stop.cu``) reading/writing the pinned flag
  through its host pointer; no Paddle op, no wait.
- ``get_padding_offset`` takes the host token count (``token_num_cpu``): no D2H in the op.
- ``set_stop_value_multi_ends`` takes ``min_tokens``.
"""

from __future__ import annotations

import numpy as np
import paddle

from ..... import kernels
from .....message_queue import get_queue, pack_tokens, pack_topk
from .....placement import as_device, device_ops, host_view, is_pinned, paddle_op_inputs, write_back
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from .....fd24.model_executor.ops.gpu import (  # noqa: F401  (unchanged in 2.5)
    _env_flag,
    _not_modelled,
    recover_decode_task,
    run_update_inputs_kernel,
    run_update_inputs_v1_kernel,
    set_value_by_flags_and_idx,
    step_paddle,
    step_reschedule,
    step_system_cache,
)


def get_padding_offset(input_ids, seq_len, draft_tokens, seq_lens_encoder, token_num_cpu):
    """Outputs sized by the host ``token_num_cpu``; with the overlap schedule it is last step's
    count, an upper bound: the tail is filled with id 2 / batch id -1, as the op does."""
    if draft_tokens is not None:
        raise NotImplementedError("speculative get_padding_offset is not modelled")
    ids, batch_ids, cu_q, cu_k = kernels.get_padding_offset(input_ids.numpy(), seq_len.numpy())
    token_num = int(token_num_cpu)
    if token_num < ids.shape[0]:
        raise RuntimeError(f"token_num_cpu={token_num} < {ids.shape[0]} running tokens: the op would overrun")
    tail = token_num - ids.shape[0]
    ids = np.concatenate([ids, np.full([tail], 2, dtype=np.int64)])
    batch_ids = np.concatenate([batch_ids, np.full([tail], -1, dtype=np.int32)])
    return (
        as_device(paddle.to_tensor(ids, dtype="int64")),
        as_device(paddle.to_tensor(batch_ids, dtype="int32")),
        as_device(paddle.to_tensor(cu_q, dtype="int32")),
        as_device(paddle.to_tensor(cu_k, dtype="int32")),
    )


def rebuild_padding(
    tmp_out,
    cu_seqlens_q,
    seq_len_this_time,
    seq_lens_decoder,
    seq_lens_encoder,
    batch_id_per_token_output,
    cu_seqlens_q_output,
    first_token_out,
    enable_logprob,
):
    if batch_id_per_token_output is not None:
        raise NotImplementedError("rebuild_padding for speculative outputs is not modelled")
    rows = kernels.rebuild_padding_rows(
        cu_seqlens_q.numpy(), seq_len_this_time.numpy(), seq_lens_decoder.numpy(), seq_lens_encoder.numpy()
    )
    gathered = paddle.gather(tmp_out, paddle.to_tensor(np.maximum(rows, 0), dtype="int64"))
    keep = paddle.to_tensor((rows >= 0).astype(np.float32)).unsqueeze(-1).astype(tmp_out.dtype)
    return as_device(gathered * keep)


def set_stop_value_multi_ends(
    topk_ids, stop_flags, seq_lens, end_ids, next_tokens, pre_ids, step_idx, stop_seqs, stop_seqs_len, min_tokens,
    beam_search,
):
    topk, stop, nxt = topk_ids.numpy(), stop_flags.numpy(), next_tokens.numpy()
    kernels.set_stop_value_multi_ends(
        topk,
        stop,
        seq_lens.numpy(),
        end_ids.numpy(),
        nxt,
        pre_ids.numpy(),
        step_idx.numpy(),
        stop_seqs.numpy(),
        stop_seqs_len.numpy(),
        beam_search,
        _env_flag("PREFILL_NODE_ONE_STEP_STOP"),
        min_tokens=min_tokens.numpy(),
    )
    write_back(topk_ids, topk)
    write_back(stop_flags, stop)
    write_back(next_tokens, nxt)


def update_inputs_v1(
    stop_flags,
    not_need_stop,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    step_seq_lens_decoder,
    prompt_lens,
    topk_ids,
    input_ids,
    block_tables,
    next_tokens,
    is_block_step,
    block_size,
):
    """2.5 signature: 12 tensors and ``block_size``; ``not_need_stop`` is written where it lives."""
    flag = run_update_inputs_v1_kernel(
        stop_flags,
        seq_lens_this_time,
        seq_lens_encoder,
        seq_lens_decoder,
        step_seq_lens_decoder,
        prompt_lens,
        topk_ids,
        input_ids,
        block_tables,
        None,
        next_tokens,
        is_block_step,
        block_size,
    )
    write_back(not_need_stop, np.array([flag]))


def update_inputs(
    stop_flags,
    not_need_stop,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    input_ids,
    next_tokens,
    is_block_step,
):
    flag = run_update_inputs_kernel(
        stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, input_ids, None, next_tokens,
        is_block_step,
    )
    write_back(not_need_stop, np.array([flag]))


def get_stop(not_need_stop) -> paddle.Tensor:
    """A new CPU [1] bool tensor holding the flag, read through the host pointer."""
    if is_pinned(not_need_stop):
        value = replica_backend.current().read(not_need_stop, "get_stop")
    else:
        value = host_view(not_need_stop, "get_stop")
    return paddle.to_tensor(np.asarray(value, dtype=bool).reshape([1]))


def set_stop(not_need_stop, flag: bool) -> None:
    """Writes the flag through the host pointer (no Paddle op)."""
    write_back(not_need_stop, np.array([bool(flag)]))


def _host_bool(not_need_stop, site: str) -> bool:
    return bool(host_view(not_need_stop, site).reshape(-1)[0])


def save_output(x, not_need_stop, preempted_idx, rank_id, save_each_rank):
    """2.5: 5 arguments; rows flagged in ``preempted_idx`` are sent as -9."""
    if rank_id > 0:
        return
    message = pack_tokens(
        host_view(x, "save_output.x"),
        _host_bool(not_need_stop, "save_output.not_need_stop"),
        host_view(preempted_idx, "save_output.preempted_idx"),
    )
    get_queue().send(message)


def save_output_topk(x, topk_ids, logprob_scores, ranks, not_need_stop, preempted_idx, rank_id):
    """2.5: 7 arguments; K fixed at 20 columns, ``MAX_BSZ`` 512 rows.

    Still a ``PD_BUILD_STATIC_OP`` with no pybind twin, while 2.5 hands it pinned buffers: Paddle's
    data transform moves each pinned input to the GPU (blocking) and re-points it there.
    """
    paddle_op_inputs("save_output_topk", x, topk_ids, logprob_scores, ranks, not_need_stop, preempted_idx)
    if rank_id > 0:
        return
    message = pack_topk(
        host_view(x, "save_output_topk.x"),
        host_view(topk_ids, "save_output_topk.topk_ids"),
        host_view(logprob_scores, "save_output_topk.logprob_scores"),
        host_view(ranks, "save_output_topk.ranks"),
        _host_bool(not_need_stop, "save_output_topk.not_need_stop"),
        host_view(preempted_idx, "save_output_topk.preempted_idx"),
    )
    get_queue().send(message)


limit_thinking_content_length = _not_modelled("limit_thinking_content_length")
speculate_limit_thinking_content_length = _not_modelled("speculate_limit_thinking_content_length")
speculate_get_seq_lens_output = _not_modelled("speculate_get_seq_lens_output")
speculate_save_output = _not_modelled("speculate_save_output")
speculate_save_output_topk = _not_modelled("speculate_save_output_topk")
speculate_set_value_by_flags_and_idx = _not_modelled("speculate_set_value_by_flags_and_idx")
speculate_step_paddle = _not_modelled("speculate_step_paddle")
speculate_step_system_cache = _not_modelled("speculate_step_system_cache")
speculate_step_reschedule = _not_modelled("speculate_step_reschedule")
speculate_update = _not_modelled("speculate_update")
speculate_set_stop_value_multi_seqs = _not_modelled("speculate_set_stop_value_multi_seqs")
speculate_schedule_cache = _not_modelled("speculate_schedule_cache")
share_external_data = _not_modelled("share_external_data")
set_data_ipc = _not_modelled("set_data_ipc")
unset_data_ipc = _not_modelled("unset_data_ipc")


# Every op above is compiled device code in FastDeploy: device tracking does not see the stand-ins'
# own reads of their inputs (the host sides they model record through ``placement``).
device_ops(globals())
