"""Mirrors ``fastdeploy.model_executor.ops.gpu`` (2.4): Python stand-ins for the compiled ops the
patch points call, with 2.4 names, signatures and semantics (``custom_ops/gpu_ops/*.cu``,
fastdeploy-surface.md sections 4-5).

Per-slot logic lives in ``reference/kernels.py`` and ``reference/update_inputs_semantics.py``;
these wrappers add what the compiled ops do around their kernels with host memory, which is what
the plugin changes:

- ``update_inputs_v1`` / ``update_inputs``: copy the host ``not_need_stop`` to the GPU, run the
  kernel, then a **blocking** D2H of the flag and a host write (``update_inputs_v1.cu:142-166``).
  A device flag would be dereferenced on the host: the replica raises where FastDeploy crashes.
- ``save_output`` (pybind in 2.4) / ``save_output_topk`` (``PD_BUILD_STATIC_OP`` only, so Paddle's
  data transform applies to pinned inputs): ``copy_to(CPUPlace)`` of device inputs (blocking),
  host reads, then one message to the queue ``INFERENCE_MSG_QUEUE_ID``.
- ``get_padding_offset``: the blocking ``token_num`` D2H (S1 in the surface's table).

Ops imported by ``pre_and_post_process`` / ``gpu_model_runner`` that the replica does not model
(speculative decoding, thinking limits, ...) exist and raise ``NotImplementedError``.
"""

from __future__ import annotations

import os

import numpy as np
import paddle

from .... import envs  # noqa: F401  (FastDeploy's ops package imports envs too)
from ..... import kernels
from .....message_queue import get_queue, pack_tokens, pack_topk
from .....placement import (
    as_device,
    device_ops,
    blocking_d2h,
    device_array,
    host_view,
    is_device,
    paddle_op_inputs,
    write_back,
)
from .....update_inputs_semantics import update_inputs_np, update_inputs_v1_np


def _not_modelled(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(f"op {name!r} is not modelled by the FastDeploy replica")

    op.__name__ = name
    return op


def _env_flag(name: str) -> bool:
    return os.getenv(name, "")[:1] == "1"


def _column0(input_ids: paddle.Tensor) -> np.ndarray:
    """``input_ids[:, :1]`` as a contiguous array: the update kernels only write column 0."""
    return np.ascontiguousarray(input_ids.numpy()[:, :1])


# --- pre-process ------------------------------------------------------------------------------


#: what the uninitialised tail of get_padding_offset's outputs holds in the replica
POISON_TOKEN_ID = 0x3FFFFFFF
POISON_BATCH_ID = 0x3FFFFFFF


def get_padding_offset(input_ids, token_num, seq_len):
    """Pack the running tokens. The op copies ``token_num`` to pageable host memory to size its
    outputs: a blocking D2H every step."""
    # ``token_num.copy_to(CPUPlace, false)``: blocking for a device count, a memcpy for a host one.
    count = int((blocking_d2h(token_num, "get_padding_offset.token_num") if is_device(token_num) else token_num)
                .numpy().reshape(-1)[0])
    ids, batch_ids, cu_q, cu_k = kernels.get_padding_offset(input_ids.numpy(), seq_len.numpy())
    if count < ids.shape[0]:
        # The op sizes its outputs by token_num (paddle::empty): too small a count writes out of
        # bounds on the GPU. The replica refuses it loudly.
        raise RuntimeError(f"get_padding_offset: token_num={count} but the running slots hold {ids.shape[0]} tokens")
    if count > ids.shape[0]:
        # Too large a count: the outputs' tail is uninitialised memory (paddle::empty). Poison it so
        # that a consumer of the tail fails (an id past any vocabulary, a batch id past any slot).
        pad = count - ids.shape[0]
        ids = np.concatenate([ids, np.full([pad], POISON_TOKEN_ID, dtype=ids.dtype)])
        batch_ids = np.concatenate([batch_ids, np.full([pad], POISON_BATCH_ID, dtype=batch_ids.dtype)])
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
    output_padding_offset,
    first_token_out,
    max_input_length,
    enable_logprob,
):
    """One hidden row per running slot: the last token of a prefill chunk, the token of a decode
    step, zeros for an idle slot."""
    if output_padding_offset is not None:
        raise NotImplementedError("rebuild_padding with output_padding_offset (speculative) is not modelled")
    rows = kernels.rebuild_padding_rows(
        cu_seqlens_q.numpy(), seq_len_this_time.numpy(), seq_lens_decoder.numpy(), seq_lens_encoder.numpy()
    )
    gathered = paddle.gather(tmp_out, paddle.to_tensor(np.maximum(rows, 0), dtype="int64"))
    keep = paddle.to_tensor((rows >= 0).astype(np.float32)).unsqueeze(-1).astype(tmp_out.dtype)
    return as_device(gathered * keep)


def set_value_by_flags_and_idx(pre_ids, input_ids, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, step_idx, stop_flags):
    pre = pre_ids.numpy()
    kernels.set_value_by_flags_and_idx(
        pre,
        input_ids.numpy(),
        seq_lens_encoder.numpy(),
        seq_lens_decoder.numpy(),
        step_idx.numpy(),
        stop_flags.numpy(),
        seq_lens_this_time.shape[0],
    )
    write_back(pre_ids, pre)


def recover_decode_task(
    stop_flags,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    step_seq_lens_decoder,
    block_tables,
    is_block_step,
    draft_tokens,
    step_draft_tokens,
    step_seq_lens_this_time,
    block_size,
    speculate_step,
):
    if draft_tokens is not None:
        raise NotImplementedError("recover_spec_decode_task is not modelled")
    arrays = [t.numpy() for t in (stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, is_block_step)]
    stop, this_time, enc, dec, block_step = arrays
    kernels.recover_decode_task(
        stop, this_time, enc, dec, step_seq_lens_decoder.numpy(), block_tables.numpy(), block_step, block_size
    )
    for t, a in zip((stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, is_block_step), arrays):
        write_back(t, a)


# --- post-process -----------------------------------------------------------------------------


def set_stop_value_multi_ends(
    topk_ids, stop_flags, seq_lens, end_ids, next_tokens, pre_ids, step_idx, stop_seqs, stop_seqs_len, beam_search
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
    )
    write_back(topk_ids, topk)
    write_back(stop_flags, stop)
    write_back(next_tokens, nxt)


def run_update_inputs_v1_kernel(
    stop_flags,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    step_seq_lens_decoder,
    prompt_lens,
    topk_ids,
    input_ids,
    block_tables,
    stop_nums: np.ndarray | None,
    next_tokens,
    is_block_step,
    block_size,
) -> bool:
    """The ``update_inputs_v1`` kernel as both versions launch it: updates the tensors in place
    (only column 0 of ``input_ids``) and returns the new flag; where the flag goes, and whether
    ``stop_nums`` exists, is each version's op's business."""
    written = {
        "stop_flags": stop_flags,
        "seq_lens_this_time": seq_lens_this_time,
        "seq_lens_encoder": seq_lens_encoder,
        "seq_lens_decoder": seq_lens_decoder,
        "step_seq_lens_decoder": step_seq_lens_decoder,
        "topk_ids": topk_ids,
        "is_block_step": is_block_step,
    }
    arrays = {name: np.ascontiguousarray(t.numpy()) for name, t in written.items()}
    ids0 = _column0(input_ids)
    flag = update_inputs_v1_np(
        arrays["stop_flags"],
        None,
        arrays["seq_lens_this_time"],
        arrays["seq_lens_encoder"],
        arrays["seq_lens_decoder"],
        arrays["step_seq_lens_decoder"],
        np.ascontiguousarray(prompt_lens.numpy()),
        arrays["topk_ids"],
        ids0,
        np.ascontiguousarray(block_tables.numpy()),
        stop_nums,
        np.ascontiguousarray(next_tokens.numpy()),
        arrays["is_block_step"],
        int(block_size),
        prefill_one_step_stop=_env_flag("PREFILL_NODE_ONE_STEP_STOP_V1"),
    )
    _write_back_kernel_outputs(written, arrays, input_ids, ids0)
    return flag


def run_update_inputs_kernel(
    stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, input_ids,
    stop_nums: np.ndarray | None, next_tokens, is_block_step,
) -> bool:
    """The (non-V1) ``update_inputs`` kernel as both versions launch it; see the V1 runner."""
    written = {
        "seq_lens_this_time": seq_lens_this_time,
        "seq_lens_encoder": seq_lens_encoder,
        "seq_lens_decoder": seq_lens_decoder,
    }
    arrays = {name: np.ascontiguousarray(t.numpy()) for name, t in written.items()}
    ids0 = _column0(input_ids)
    flag = update_inputs_np(
        stop_flags.numpy(),
        None,
        arrays["seq_lens_this_time"],
        arrays["seq_lens_encoder"],
        arrays["seq_lens_decoder"],
        ids0,
        stop_nums,
        next_tokens.numpy(),
        is_block_step.numpy(),
    )
    _write_back_kernel_outputs(written, arrays, input_ids, ids0)
    return flag


def _write_back_kernel_outputs(written: dict, arrays: dict, input_ids, ids0: np.ndarray) -> None:
    for name, t in written.items():
        write_back(t, arrays[name])
    input_ids[:, 0] = paddle.to_tensor(ids0[:, 0], dtype=input_ids.dtype)


def _host_flag_from_kernel(not_need_stop, value: bool, site: str) -> None:
    """2.4's host side of the update ops: the kernel wrote a GPU temporary; copy it back to
    pageable memory (blocking) and store it through ``not_need_stop``'s host pointer."""
    if is_device(not_need_stop):
        raise RuntimeError(
            f"{site}: FastDeploy 2.4 dereferences not_need_stop on the host; a device tensor would crash"
        )
    flag_on_device = as_device(paddle.to_tensor([value], dtype="bool"))
    flag_host = blocking_d2h(flag_on_device, site)
    write_back(not_need_stop, flag_host.numpy())


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
    stop_nums,
    next_tokens,
    is_block_step,
    block_size,
):
    """2.4 signature: 13 tensors (with ``stop_nums``) and ``block_size``."""
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
        device_array(stop_nums),
        next_tokens,
        is_block_step,
        block_size,
    )
    _host_flag_from_kernel(not_need_stop, flag, "update_inputs_v1.not_need_stop")


def update_inputs(
    stop_flags,
    not_need_stop,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    input_ids,
    stop_nums,
    next_tokens,
    is_block_step,
):
    flag = run_update_inputs_kernel(
        stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, input_ids,
        device_array(stop_nums), next_tokens, is_block_step,
    )
    _host_flag_from_kernel(not_need_stop, flag, "update_inputs.not_need_stop")


def _host_bool(not_need_stop, site: str) -> bool:
    """``not_need_stop.data<bool>()[0]``: a host pointer read."""
    return bool(host_view(not_need_stop, site).reshape(-1)[0])


def save_output(x, not_need_stop, rank_id, save_each_rank):
    """2.4: 4 arguments. Ranks above 0 send nothing."""
    if rank_id > 0:
        return
    tokens = host_view(x, "save_output.x")
    get_queue().send(pack_tokens(tokens, _host_bool(not_need_stop, "save_output.not_need_stop")))


def save_output_topk(x, topk_ids, logprob_scores, ranks, not_need_stop, rank_id):
    """2.4: 6 arguments; K fixed at 20 columns, ``MAX_BSZ`` 512 rows.

    A ``PD_BUILD_STATIC_OP`` with no pybind twin: every tensor input goes through Paddle's data
    transform (pinned inputs are moved to the GPU).
    """
    paddle_op_inputs("save_output_topk", x, topk_ids, logprob_scores, ranks, not_need_stop)
    if rank_id > 0:
        return
    message = pack_topk(
        host_view(x, "save_output_topk.x"),
        host_view(topk_ids, "save_output_topk.topk_ids"),
        host_view(logprob_scores, "save_output_topk.logprob_scores"),
        host_view(ranks, "save_output_topk.ranks"),
        _host_bool(not_need_stop, "save_output_topk.not_need_stop"),
    )
    get_queue().send(message)


# --- the non-V1 scheduler's block management --------------------------------------------------


def step_paddle(*args):
    """Non-V1 block recycling (``step.cu``). The replica's scheduler gives each request all its
    KV blocks up front on the non-V1 path, so no slot ever needs recovery: nothing to do."""


step_system_cache = step_paddle
step_reschedule = step_paddle


# --- imported by FastDeploy at the patch points, not modelled ---------------------------------

limit_thinking_content_length = _not_modelled("limit_thinking_content_length")
speculate_limit_thinking_content_length = _not_modelled("speculate_limit_thinking_content_length")
speculate_get_output_padding_offset = _not_modelled("speculate_get_output_padding_offset")
speculate_get_padding_offset = _not_modelled("speculate_get_padding_offset")
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
