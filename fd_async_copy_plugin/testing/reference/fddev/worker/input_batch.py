"""Mirrors ``fastdeploy/worker/input_batch.py`` (develop): the 2.5 replica's ``InputBatch`` with
develop's placements at the census sites of ``init_share_inputs``:

- ``infer_seed`` is a **device** tensor (#6765, input_batch.py:175; 2.5 had ``.cpu()``), so the
  sampler's ``topp_seed`` no longer makes Paddle transform a host tensor (T);
- ``not_need_stop`` is a pageable host tensor (input_batch.py:155) that nothing writes any more
  (#6356: no ``not_need_stop()``, no copy from ``not_need_stop_device``); the save ops still send it;
- pinned ``sampled_token_ids`` / ``seq_lens_this_time_cpu`` / ``is_block_step_cpu`` (:156-158)
  and the device ``not_need_stop_device`` (:159), as in 2.5.

Pinned buffers are allocated through the copy backend (``.pin_memory()`` in FastDeploy). Batch
reordering (``swap_states``/``condense``, PD reorder) is not modelled: ``enable_pd_reorder`` stays
False and the ``recover_batch_index_*`` helpers are identities.
"""

from __future__ import annotations

import paddle

from ...placement import as_device, pin_memory
from ..utils import fill_paddle_tensor

#: Attributes allocated in host memory (pageable ``.cpu()`` or pinned); the rest live on the GPU.
HOST_BUFFERS = frozenset(
    {
        "not_need_stop",
        "sampled_token_ids",
        "seq_lens_this_time_cpu",
        "is_block_step_cpu",
        "is_chunk_step",
        "preempted_idx",
        "last_preempted_idx",
    }
)


class InputBatch:
    def __getitem__(self, key):
        if hasattr(self, key):
            return getattr(self, key)
        raise KeyError(f"'{key}' is not a valid attribute of InputBatch")

    def __setitem__(self, key, value):
        setattr(self, key, value)

    def __contains__(self, key):
        return hasattr(self, key)

    def update(self, values: dict):
        for key, value in values.items():
            setattr(self, key, value)

    def pop(self, key, default=None):
        if hasattr(self, key):
            value = getattr(self, key)
            delattr(self, key)
            return value
        if default is not None:
            return default
        raise KeyError(f"'{key}' is not a valid attribute of InputBatch")

    def __delitem__(self, key):
        if not hasattr(self, key):
            raise KeyError(f"'{key}' is not a valid attribute of InputBatch")
        delattr(self, key)

    def __init__(self, fd_config) -> None:
        self.num_running_requests = 0
        self.running_requests_ids = []
        self.fd_config = fd_config
        self.model_config = fd_config.model_config
        self.cache_config = fd_config.cache_config
        self.scheduler_config = fd_config.scheduler_config
        self.speculative_config = fd_config.speculative_config
        self.speculative_decoding = self.speculative_config.method is not None
        self.enable_mm = self.model_config.enable_mm
        self.enable_expert_parallel = fd_config.parallel_config.enable_expert_parallel
        self.index_to_batch_id = {}
        self.enable_pd_reorder = False

    def init_share_inputs(self):
        max_num_seqs = self.scheduler_config.max_num_seqs
        mc, cc = self.model_config, self.cache_config
        self.pre_ids = paddle.full([max_num_seqs, mc.max_model_len], -1, dtype="int64")
        self.input_ids = paddle.full([max_num_seqs, mc.max_model_len], mc.pad_token_id, dtype="int64")
        self.prompt_ids = paddle.full([max_num_seqs, mc.max_model_len], mc.pad_token_id, dtype="int64")
        self.eos_token_id = paddle.full([mc.eos_tokens_lens, 1], 0, dtype="int64")
        self.top_p = paddle.full([max_num_seqs, 1], mc.top_p, dtype="float32")
        self.top_k = paddle.full([max_num_seqs, 1], 0, dtype="int64")
        self.top_k_list = [0] * max_num_seqs
        self.min_p = paddle.full([max_num_seqs, 1], 0.0, dtype="float32")
        self.min_p_list = [0.0] * max_num_seqs
        self.temperature = paddle.full([max_num_seqs, 1], mc.temperature, dtype="float32")
        self.penalty_score = paddle.full([max_num_seqs, 1], mc.penalty_score, dtype="float32")
        self.frequency_score = paddle.full([max_num_seqs, 1], mc.frequency_score, dtype="float32")
        self.presence_score = paddle.full([max_num_seqs, 1], mc.presence_score, dtype="float32")
        self.temp_scaled_logprobs = paddle.full([max_num_seqs, 1], False, dtype="bool")
        self.top_p_normalized_logprobs = paddle.full([max_num_seqs, 1], False, dtype="bool")
        self.min_dec_len = paddle.full([max_num_seqs, 1], mc.min_length, dtype="int64")
        self.max_dec_len = paddle.full([max_num_seqs, 1], mc.max_model_len, dtype="int64")
        self.seq_lens_this_time_buffer = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        self.seq_lens_encoder = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        self.seq_lens_decoder = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        self.step_seq_lens_encoder = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        self.step_seq_lens_decoder = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        self.prompt_lens = paddle.full([max_num_seqs, 1], 0, dtype="int64")
        self.step_idx = paddle.full([max_num_seqs, 1], 0, dtype="int64")
        # #6176 / #6259: pinned host mirrors, filled by async copies; the flag's device twin.
        self.not_need_stop = paddle.full([1], False, dtype="bool").cpu()  # develop :155, never written
        self.sampled_token_ids = pin_memory(
            paddle.full([max_num_seqs, 1], -1, dtype="int64"), "input_batch.sampled_token_ids"
        )
        self.seq_lens_this_time_cpu = pin_memory(
            paddle.full([max_num_seqs, 1], 0, dtype="int32"), "input_batch.seq_lens_this_time_cpu"
        )
        self.is_block_step_cpu = pin_memory(
            paddle.full([max_num_seqs], False, dtype="bool"), "input_batch.is_block_step_cpu"
        )
        self.not_need_stop_device = paddle.full([1], False, dtype="bool")
        self.stop_flags = paddle.full([max_num_seqs, 1], True, dtype="bool")
        self.bad_tokens = paddle.full([max_num_seqs, mc.vocab_size], -1, dtype="int64")
        self.bad_tokens_len = paddle.full([max_num_seqs], 1, dtype="int64")
        self.next_tokens = paddle.full([max_num_seqs, 1], -1, dtype="int64")
        self.is_block_step = paddle.full([max_num_seqs], False, dtype="bool")
        self.is_chunk_step = paddle.full([max_num_seqs], False, dtype="bool").cpu()
        self.encoder_block_lens = paddle.full([max_num_seqs], 0, dtype="int32")
        self.infer_seed = paddle.full([max_num_seqs, 1], 0, dtype="int64")  # on the device (#6765, :175)
        self.first_token_ids = paddle.full([max_num_seqs, 1], -1, dtype="int64")
        self.ids_remove_padding = paddle.full([max_num_seqs * mc.max_model_len], 0, dtype="int64")
        self.batch_id_per_token = paddle.full([max_num_seqs * mc.max_model_len, 1], 0, dtype="int32")
        self.cu_seqlens_q = paddle.full([max_num_seqs + 1, 1], 0, dtype="int32")
        self.cu_seqlens_k = paddle.full([max_num_seqs + 1, 1], 0, dtype="int32")
        self.max_think_lens = paddle.full([max_num_seqs, 1], -1, dtype="int32")
        self.max_reply_lens = paddle.full([max_num_seqs, 1], -1, dtype="int32")
        self.limit_think_status = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        self.inject_token_ids = paddle.to_tensor(mc.think_truncate_prompt_ids, dtype="int64").reshape([-1, 1])
        pre_max_block_num = (mc.max_model_len + cc.block_size - 1) // cc.block_size + cc.enc_dec_block_num
        self.block_tables = paddle.full([max_num_seqs, pre_max_block_num], -1, dtype="int32")
        self.stop_seqs_len = paddle.full([max_num_seqs, mc.max_stop_seqs_num], 0, dtype="int32")
        self.stop_seqs = paddle.full([max_num_seqs, mc.max_stop_seqs_num, mc.stop_seqs_max_len], -1, dtype="int64")
        self.req_ids = [""] * max_num_seqs
        self.logits_processors = []
        self.logits_processors_args = [{} for _ in range(max_num_seqs)]
        self.mask_rollback = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        self.preempted_idx = paddle.full([max_num_seqs, 1], 0, dtype="int32").cpu()
        self.last_preempted_idx = paddle.full([max_num_seqs, 1], 0, dtype="int32").cpu()
        for key, value in list(vars(self).items()):
            if isinstance(value, paddle.Tensor) and key not in HOST_BUFFERS:
                as_device(value)

    def reset_share_inputs(self):
        """Refill the buffers; ``not_need_stop`` is left alone (commented out in develop, :561)."""
        mc = self.model_config
        max_num_seqs = self.scheduler_config.max_num_seqs
        for key, value in (
            ("pre_ids", -1), ("input_ids", mc.pad_token_id), ("prompt_ids", mc.pad_token_id),
            ("eos_token_id", 0), ("top_p", mc.top_p), ("top_k", 0), ("min_p", 0.0),
            ("temperature", mc.temperature), ("temp_scaled_logprobs", False),
            ("top_p_normalized_logprobs", False), ("min_dec_len", mc.min_length),
            ("max_dec_len", mc.max_model_len), ("seq_lens_this_time_buffer", 0),
            ("seq_lens_encoder", 0), ("seq_lens_decoder", 0), ("step_seq_lens_encoder", 0),
            ("step_seq_lens_decoder", 0), ("prompt_lens", 0), ("step_idx", 0),
            # ("not_need_stop", False) is commented out in FastDeploy develop
            ("not_need_stop_device", False), ("sampled_token_ids", -1), ("stop_flags", True),
            ("bad_tokens", -1), ("bad_tokens_len", 1), ("next_tokens", -1), ("is_block_step", False),
            ("is_chunk_step", False), ("encoder_block_lens", 0), ("infer_seed", 0),
            ("first_token_ids", -1), ("block_tables", -1), ("stop_seqs_len", 0), ("stop_seqs", -1),
            ("mask_rollback", 0), ("preempted_idx", 0), ("last_preempted_idx", 0),
        ):
            fill_paddle_tensor(self, key, value)
        self.top_k_list = [0] * max_num_seqs
        self.min_p_list = [0.0] * max_num_seqs
        self.req_ids = [""] * max_num_seqs
        self.logits_processors_args = [{} for _ in range(max_num_seqs)]
        self.index_to_batch_id = {}
        self.enable_pd_reorder = False

    def get_index_by_batch_id(self, batch_id):
        """The row of ``batch_id`` (a new identity mapping when it has none yet)."""
        for index, bid in self.index_to_batch_id.items():
            if bid == batch_id:
                return index
        self.index_to_batch_id[batch_id] = batch_id
        return batch_id

    def swap_states(self, i1, i2) -> None:
        raise NotImplementedError("PD reorder is not modelled by the replica")

    def condense(self) -> None:
        raise NotImplementedError("PD reorder is not modelled by the replica")


def recover_batch_index_for_output(output_cls, index_to_batch_id, enable_pd_reorder, recover_list):
    """The named fields, in batch order (identity without PD reorder, as here)."""
    if enable_pd_reorder and not all(i == v for i, v in index_to_batch_id.items()):
        raise NotImplementedError("PD reorder is not modelled by the replica")
    return {name: (output_cls[name] if isinstance(output_cls, (dict, InputBatch)) else getattr(output_cls, name))
            for name in recover_list}


def recover_batch_index_for_sampler_output(sampler_output, index_to_batch_id, enable_pd_reorder):
    if enable_pd_reorder and not all(i == v for i, v in index_to_batch_id.items()):
        raise NotImplementedError("PD reorder is not modelled by the replica")
