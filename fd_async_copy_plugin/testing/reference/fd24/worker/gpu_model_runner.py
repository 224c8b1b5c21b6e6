"""Mirrors ``fastdeploy/worker/gpu_model_runner.py`` (2.4) at the patch points.

- module imports: ``from ..model_executor.pre_and_post_process import post_process, pre_process,
  rebuild_padding, step_cuda`` (:80-85) - a patch must rebind these names here;
- ``GPUModelRunner.__init__`` (:111; sampler at :175, share inputs at :195, the V1 output thread
  at :216-226), ``_async_output_busy_loop`` (:264), ``exist_prefill`` (:273),
  ``insert_tasks_v1`` (:597; ``not_need_stop[0] = True`` at :832), ``insert_prefill_inputs``
  (:837, :1053), ``_dummy_prefill_inputs`` (:1147), ``_init_share_inputs`` (:1177, a plain dict),
  ``reset_share_inputs`` (:1412, which already names ``not_need_stop_device`` and
  ``sampled_token_ids``), ``_prepare_inputs`` (:1547), ``initialize_forward_meta`` (:1680),
  ``_dummy_sampler_run`` (:2004), ``_dummy_run`` (:2116), ``execute_model`` (:2396, order of
  surface section 2.4), ``not_need_stop`` (:2835, returns a Tensor), ``_get_prompt_logprobs_list``
  (:3107).

CUDA graphs (``DriverConfig(cuda_graph=True)``): decode-only steps replay on the static buffers'
first captured-size rows (``cuda_graph.GraphReplay``, what FD's graph backend puts around the
model's forward); ``padding_cudagraph_inputs`` (:2907) and the output's first ``real_token_num``
rows (:2448, :2175) as FD's.

Not modelled: multimodal inputs, guided decoding, speculative decoding, pooling models, graph
capture itself, attention backends, EP/TP (``paddle.distributed`` calls), routing replay.
"""

from __future__ import annotations

import os
from typing import List, Optional

import numpy as np
import paddle

from .. import envs
from ...cuda_graph import GraphReplay
from ...tiny_model import TinyModel
from ...zmq_sink import AsyncOutputThread
from ...placement import as_device, blocking_d2h, count_d2h, device_code, host_view, is_pinned, paddle_op_inputs
from ..engine.request import Request, RequestType
from ..inter_communicator import ZmqIpcClient
from ..model_executor.forward_meta import ForwardMeta
from ..model_executor.layers.sample.meta_data import SamplingMetadata
from ..model_executor.layers.sample.sampler import Sampler, SpeculativeSampler
from ..model_executor.ops.gpu import (  # noqa: F401  (FastDeploy's import list)
    recover_decode_task,
    set_data_ipc,
    set_value_by_flags_and_idx,
    share_external_data,
    speculate_schedule_cache,
    unset_data_ipc,
)
from ..model_executor.pre_and_post_process import (
    post_process,
    pre_process,
    rebuild_padding,
    step_cuda,
)
from ..platforms import current_platform  # noqa: F401
from ..utils import fill_paddle_tensor
from .model_runner_base import DistributedOut, DistributedStatus, ModelRunnerBase
from .output import LogprobsTensors, ModelOutputData, ModelRunnerOutput  # noqa: F401
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from .....runtime import census

#: share_inputs entries FastDeploy allocates on the host with ``.cpu()``; every other tensor
#: entry is a GPU buffer.
HOST_SHARE_INPUTS = frozenset({"not_need_stop", "is_chunk_step", "infer_seed"})


class GPUModelRunner(AsyncOutputThread, ModelRunnerBase):
    def __init__(
        self,
        fd_config,
        device: str,  # logic device
        device_id: int,  # physical device id
        rank: int,
        local_rank: int,
    ):
        super().__init__(fd_config=fd_config, device=device)
        self.enable_mm = self.model_config.enable_mm
        self.rank = rank
        self.local_rank = local_rank
        self.device_id = device_id
        self.speculative_method = self.fd_config.speculative_config.method
        self.speculative_decoding = self.speculative_method is not None
        self.enable_logprob = fd_config.model_config.enable_logprob
        self.enable_keep_sampling_mask = fd_config.model_config.enable_keep_sampling_mask
        self.enable_early_stop = self.fd_config.early_stop_config.enable_early_stop
        self.is_pooling_model = self.fd_config.model_config.runner_type == "pooling"
        self.ori_vocab_size = self.fd_config.model_config.ori_vocab_size
        self.max_logprobs = None
        if self.enable_logprob:
            self.max_logprobs = (
                self.ori_vocab_size
                if fd_config.model_config.max_logprobs == -1
                else fd_config.model_config.max_logprobs
            )
        self.temp_scaled_logprobs = True
        self.top_p_normalized_logprobs = True
        self.prompt_logprobs_reqs: dict[str, Request] = {}
        self.in_progress_prompt_logprobs: dict[str, LogprobsTensors] = {}
        self.forward_batch_reqs_list: list[Request] = [None for _ in range(self.scheduler_config.max_num_seqs)]

        # Sampler
        if not self.speculative_decoding:
            self.sampler = Sampler(fd_config)
        else:
            self.sampler = SpeculativeSampler(fd_config)
        self.guided_backend = None

        # CUDA Graph (``DriverConfig(cuda_graph=True)``: the replica's stand-in, load_model)
        self.use_cudagraph = self.graph_opt_config.use_cudagraph
        self.cudagraph_only_prefill = self.graph_opt_config.cudagraph_only_prefill

        # Initialize share inputs
        self._init_share_inputs(self.scheduler_config.max_num_seqs)
        increment_value = (
            4 if not self.speculative_decoding else (self.speculative_config.num_speculative_tokens + 1) * 4
        )
        self.infer_seed_increment = paddle.full(
            shape=[self.scheduler_config.max_num_seqs, 1], fill_value=increment_value, dtype="int64"
        ).cpu()
        self.restore_chunked_prefill_request = dict()
        self.forward_meta: Optional[ForwardMeta] = None
        self.model = None

        # Postprocess env params: the save ops find their message queue through this variable.
        os.environ["INFERENCE_MSG_QUEUE_ID"] = str(self.parallel_config.engine_worker_queue_port)

        self.routing_replay_manager = None

        # ZMQ side-channel for sampling_mask in the non-FD_USE_GET_SAVE_OUTPUT_V1 path (KSM, 2.4)
        self.sampling_mask_zmq_client = None
        if not envs.FD_USE_GET_SAVE_OUTPUT_V1 and self.enable_keep_sampling_mask:
            rank_id = self.parallel_config.local_data_parallel_id
            port = self.parallel_config.engine_worker_queue_port
            self.sampling_mask_zmq_client = ZmqIpcClient(name=f"sampling_mask_output_rank_{rank_id}_{port}")
            self.sampling_mask_zmq_client.connect()

        self.zmq_client = None
        self.async_output_queue = None
        if envs.FD_USE_GET_SAVE_OUTPUT_V1:
            self._start_async_output_thread(local_rank, self.fd_config.parallel_config.engine_worker_queue_port)

        self.enable_entropy = self.model_config.enable_entropy
        self.exist_prefill_flag = False

    def exist_prefill(self):
        """Whether a prefill is in flight: ``seq_lens_encoder.numpy()``, a blocking D2H (S3 from
        ``collect_distributed_status``, S7 from the worker loop through ``gpu_worker``)."""
        count_d2h("exist_prefill.seq_lens_encoder")
        return np.any(self.share_inputs["seq_lens_encoder"].numpy() > 0)

    def exist_decode(self):
        return np.any(host_view(self.share_inputs["seq_lens_decoder"], "exist_decode.seq_lens_decoder") > 0)

    def collect_distributed_status(self):
        """Single rank, no EP: only ``exist_prefill()`` is consulted."""
        dist_status_obj = DistributedStatus()
        if_only_decode = True
        prefill_exists = self.exist_prefill()
        dist_status_obj.only_decode = not prefill_exists
        return DistributedOut(if_only_decode=if_only_decode and not prefill_exists)

    # ---- task insertion ------------------------------------------------------------------------

    def _set_sampling_inputs(self, request: Request, idx: int) -> None:
        """The part of both insert functions that copies a request's sampling settings."""
        assert len(request.eos_token_ids) == self.model_config.eos_tokens_lens
        self.share_inputs["eos_token_id"][:] = np.array(request.eos_token_ids, dtype="int64").reshape(-1, 1)
        self.share_inputs["top_p"][idx : idx + 1] = request.get("top_p", 0.7)
        self.share_inputs["top_k"][idx : idx + 1] = request.get("top_k", 0)
        self.share_inputs["top_k_list"][idx] = request.get("top_k", 0)
        self.share_inputs["min_p"][idx : idx + 1] = request.get("min_p", 0.0)
        self.share_inputs["min_p_list"][idx] = request.get("min_p", 0.0)
        self.share_inputs["temperature"][idx : idx + 1] = request.get("temperature", 0.95)
        self.share_inputs["penalty_score"][idx : idx + 1] = request.get("repetition_penalty", 1.0)
        self.share_inputs["frequency_score"][idx : idx + 1] = request.get("frequency_penalty", 0.0)
        self.share_inputs["presence_score"][idx : idx + 1] = request.get("presence_penalty", 0.0)
        self.share_inputs["temp_scaled_logprobs"][idx : idx + 1] = request.get("temp_scaled_logprobs", False)
        self.share_inputs["top_p_normalized_logprobs"][idx : idx + 1] = request.get(
            "top_p_normalized_logprobs", False
        )
        self.share_inputs["min_dec_len"][idx : idx + 1] = request.get("min_tokens", 1)
        self.share_inputs["max_dec_len"][idx : idx + 1] = request.get("max_tokens", self.model_config.max_model_len)
        self.share_inputs["first_token_ids"][idx : idx + 1] = self.share_inputs["input_ids"][idx : idx + 1, :1]
        if request.get("seed") is not None:
            self.share_inputs["infer_seed"][idx : idx + 1] = request.get("seed")
        bad_words = request.get("bad_words_token_ids")
        if bad_words is not None and len(bad_words) > 0:
            self.share_inputs["bad_tokens_len"][idx : idx + 1] = len(bad_words)
            self.share_inputs["bad_tokens"][idx : idx + 1, : len(bad_words)] = np.array(bad_words, dtype="int64")
        else:
            self.share_inputs["bad_tokens_len"][idx : idx + 1] = 1
            self.share_inputs["bad_tokens"][idx : idx + 1, :] = np.array([-1], dtype="int64")
        if request.get("stop_token_ids") is not None and request.get("stop_seqs_len") is not None:
            stop_seqs_num = len(request.get("stop_seqs_len"))
            for _ in range(stop_seqs_num, self.model_config.max_stop_seqs_num):
                request.sampling_params.stop_seqs_len.append(0)
            self.share_inputs["stop_seqs_len"][idx : idx + 1, :] = np.array(
                request.sampling_params.stop_seqs_len, dtype="int32"
            )
            self.share_inputs["stop_seqs"][idx : idx + 1, :stop_seqs_num, : len(request.get("stop_token_ids")[0])] = (
                np.array(request.get("stop_token_ids"), dtype="int64")
            )
        else:
            self.share_inputs["stop_seqs_len"][idx : idx + 1, :] = 0
        self.share_inputs["logits_processors_args"][idx] = request.get("logits_processors_args") or {}

    def _set_thinking_defaults(self, idx: int) -> None:
        self.share_inputs["max_think_lens"][idx : idx + 1, :] = -1
        self.share_inputs["max_reply_lens"][idx : idx + 1, :] = -1
        self.share_inputs["limit_think_status"][idx : idx + 1, :] = 0

    def _set_not_need_stop(self) -> None:
        """``share_inputs["not_need_stop"][0] = True``: a Paddle ``set_value`` on the host flag."""
        paddle_op_inputs("insert_tasks.not_need_stop", self.share_inputs["not_need_stop"])
        self.share_inputs["not_need_stop"][0] = True

    def insert_tasks_v1(self, req_dicts: List[Request], num_running_requests: int = None):
        """Process scheduler output tasks (``ENABLE_V1_KVCACHE_SCHEDULER=1``)."""
        has_prefill_task = False
        has_decode_task = False
        for request in req_dicts:
            idx = request.idx
            if request.task_type.value == RequestType.PREFILL.value:
                self.share_inputs["req_ids"][idx] = str(request.request_id)
                prefill_start_index = request.prefill_start_index
                prefill_end_index = request.prefill_end_index
                length = prefill_end_index - prefill_start_index
                self._set_thinking_defaults(idx)
                prompt_token_ids = list(request.prompt_token_ids)
                input_ids = prompt_token_ids + request.output_token_ids
                prompt_len = len(prompt_token_ids)
                self.share_inputs["prompt_ids"][idx : idx + 1, :prompt_len] = np.array(prompt_token_ids, dtype="int64")
                self.share_inputs["input_ids"][idx : idx + 1, :length] = np.array(
                    input_ids[prefill_start_index:prefill_end_index]
                )
                encoder_block_num = len(request.block_tables)
                self.share_inputs["encoder_block_lens"][idx : idx + 1] = encoder_block_num
                self.share_inputs["block_tables"][idx : idx + 1, :] = -1
                self.share_inputs["block_tables"][idx : idx + 1, :encoder_block_num] = np.array(
                    request.block_tables, dtype="int32"
                )
                self.share_inputs["stop_flags"][idx : idx + 1] = False
                self.share_inputs["seq_lens_decoder"][idx : idx + 1] = prefill_start_index
                self.seq_lens_this_time_buffer[idx : idx + 1] = length
                self.share_inputs["seq_lens_encoder"][idx : idx + 1] = length
                self.share_inputs["step_seq_lens_decoder"][idx : idx + 1] = 0
                self.share_inputs["prompt_lens"][idx : idx + 1] = len(input_ids)
                self.share_inputs["is_block_step"][idx : idx + 1] = False
                self.share_inputs["is_chunk_step"][idx : idx + 1] = prefill_end_index < len(input_ids)
                self.share_inputs["step_idx"][idx : idx + 1] = (
                    len(request.output_token_ids) if prefill_end_index >= len(input_ids) else 0
                )
                self.share_inputs["pre_ids"][idx : idx + 1] = -1
                if request.sampling_params is not None and request.sampling_params.prompt_logprobs is not None:
                    self.prompt_logprobs_reqs[request.request_id] = request
                self.forward_batch_reqs_list[idx] = request
                has_prefill_task = True
            elif request.task_type.value == RequestType.DECODE.value:
                encoder_block_num = len(request.block_tables)
                self.share_inputs["encoder_block_lens"][idx : idx + 1] = encoder_block_num
                self.share_inputs["block_tables"][idx : idx + 1, :] = -1
                self.share_inputs["block_tables"][idx : idx + 1, :encoder_block_num] = np.array(
                    request.block_tables, dtype="int32"
                )
                count_d2h("insert_tasks_v1.is_block_step")
                if self.share_inputs["is_block_step"][idx]:  # a device scalar read on the host (I1)
                    has_decode_task = True
                continue
            else:  # preempted task
                self.share_inputs["block_tables"][idx : idx + 1, :] = -1
                self.share_inputs["stop_flags"][idx : idx + 1] = True
                self.seq_lens_this_time_buffer[idx : idx + 1] = 0
                self.share_inputs["seq_lens_decoder"][idx : idx + 1] = 0
                self.share_inputs["seq_lens_encoder"][idx : idx + 1] = 0
                self.share_inputs["is_block_step"][idx : idx + 1] = False
                self.prompt_logprobs_reqs.pop(request.request_id, None)
                self.in_progress_prompt_logprobs.pop(request.request_id, None)
                self.forward_batch_reqs_list[idx] = None
                continue

            self._set_sampling_inputs(request, idx)
            self.sampler.apply_logits_processor(idx, None, [])

        if has_prefill_task or has_decode_task:
            self._set_not_need_stop()
        self.share_inputs["seq_lens_this_time"] = self.seq_lens_this_time_buffer[:num_running_requests]

    def insert_prefill_inputs(self, req_dicts: List[Request], num_running_requests: int = None):
        """Process prefill tasks for the non-V1 scheduler (whole prompts, no chunking)."""
        for request in req_dicts:
            idx = request.idx
            length = len(request.prompt_token_ids)
            assert length > 0, "The prompt requested must not be empty."
            self.share_inputs["pre_ids"][idx : idx + 1] = -1
            self.share_inputs["step_idx"][idx : idx + 1] = 0
            self.share_inputs["input_ids"][idx : idx + 1, :length] = np.array(request.prompt_token_ids)
            self.share_inputs["prompt_ids"][idx : idx + 1, :length] = np.array(request.prompt_token_ids)
            self.share_inputs["seq_lens_decoder"][idx : idx + 1] = request.get("seq_lens_decoder", 0)
            self.share_inputs["step_seq_lens_decoder"][idx : idx + 1] = request.get("seq_lens_decoder", 0)
            self.seq_lens_this_time_buffer[idx : idx + 1] = length
            self.share_inputs["step_seq_lens_encoder"][idx : idx + 1] = length
            self.share_inputs["seq_lens_encoder"][idx : idx + 1] = length
            self.share_inputs["prompt_lens"][idx : idx + 1] = length
            self._set_thinking_defaults(idx)
            self.share_inputs["stop_flags"][idx : idx + 1] = False
            encoder_block_num = len(request.get("block_tables"))
            self.share_inputs["encoder_block_lens"][idx : idx + 1] = encoder_block_num
            self.share_inputs["block_tables"][idx : idx + 1, :] = -1
            self.share_inputs["block_tables"][idx : idx + 1, :encoder_block_num] = np.array(
                request.block_tables, dtype="int32"
            )
            self._set_sampling_inputs(request, idx)
            self.sampler.apply_logits_processor(idx, None, [])

        self._set_not_need_stop()
        self.share_inputs["seq_lens_this_time"] = self.seq_lens_this_time_buffer[:num_running_requests]

    # ---- share inputs --------------------------------------------------------------------------

    def _init_share_inputs(self, max_num_seqs: int):
        """Allocate every share buffer; ``share_inputs`` is a plain dict in 2.4."""
        self.MAX_INFER_SEED = 9223372036854775806
        mc, cc = self.model_config, self.cache_config
        si = self.share_inputs = {}

        si["pre_ids"] = paddle.full([max_num_seqs, mc.max_model_len], -1, dtype="int64")
        si["input_ids"] = paddle.full([max_num_seqs, mc.max_model_len], mc.pad_token_id, dtype="int64")
        si["prompt_ids"] = paddle.full([max_num_seqs, mc.max_model_len], mc.pad_token_id, dtype="int64")
        si["eos_token_id"] = paddle.full([mc.eos_tokens_lens, 1], 0, dtype="int64")
        si["top_p"] = paddle.full([max_num_seqs, 1], mc.top_p, dtype="float32")
        si["top_k"] = paddle.full([max_num_seqs, 1], 0, dtype="int64")
        si["top_k_list"] = [0] * max_num_seqs
        si["min_p"] = paddle.full([max_num_seqs, 1], 0.0, dtype="float32")
        si["min_p_list"] = [0.0] * max_num_seqs
        si["temperature"] = paddle.full([max_num_seqs, 1], mc.temperature, dtype="float32")
        si["penalty_score"] = paddle.full([max_num_seqs, 1], mc.penalty_score, dtype="float32")
        si["frequency_score"] = paddle.full([max_num_seqs, 1], mc.frequency_score, dtype="float32")
        si["presence_score"] = paddle.full([max_num_seqs, 1], mc.presence_score, dtype="float32")
        si["temp_scaled_logprobs"] = paddle.full([max_num_seqs, 1], False, dtype="bool")
        si["top_p_normalized_logprobs"] = paddle.full([max_num_seqs, 1], False, dtype="bool")
        si["min_dec_len"] = paddle.full([max_num_seqs, 1], mc.min_length, dtype="int64")
        si["max_dec_len"] = paddle.full([max_num_seqs, 1], mc.max_model_len, dtype="int64")
        self.seq_lens_this_time_buffer = as_device(paddle.full([max_num_seqs, 1], 0, dtype="int32"))
        si["seq_lens_encoder"] = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        si["seq_lens_decoder"] = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        si["step_seq_lens_encoder"] = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        si["step_seq_lens_decoder"] = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        si["prompt_lens"] = paddle.full([max_num_seqs, 1], 0, dtype="int64")
        si["step_idx"] = paddle.full([max_num_seqs, 1], 0, dtype="int64")
        si["not_need_stop"] = paddle.full([1], False, dtype="bool").cpu()
        si["stop_flags"] = paddle.full([max_num_seqs, 1], True, dtype="bool")
        si["stop_nums"] = paddle.full([1], max_num_seqs, dtype="int64")
        si["bad_tokens"] = paddle.full([max_num_seqs, mc.vocab_size], -1, dtype="int64")
        si["bad_tokens_len"] = paddle.full([max_num_seqs], 1, dtype="int64")
        si["next_tokens"] = paddle.full([max_num_seqs, 1], -1, dtype="int64")
        si["is_block_step"] = paddle.full([max_num_seqs], False, dtype="bool")
        si["is_chunk_step"] = paddle.full([max_num_seqs], False, dtype="bool").cpu()
        si["encoder_block_lens"] = paddle.full([max_num_seqs], 0, dtype="int32")
        si["step_block_list"] = paddle.full([max_num_seqs], -1, dtype="int32")
        si["step_lens"] = paddle.full([1], 0, dtype="int32")
        si["recover_block_list"] = paddle.full([max_num_seqs], -1, dtype="int32")
        si["recover_lens"] = paddle.full([1], 0, dtype="int32")
        si["need_block_list"] = paddle.full([max_num_seqs], -1, dtype="int32")
        si["need_block_len"] = paddle.full([1], 0, dtype="int32")
        si["used_list_len"] = paddle.full([max_num_seqs], 0, dtype="int32")
        si["infer_seed"] = paddle.full([max_num_seqs, 1], 0, dtype="int64").cpu()
        si["first_token_ids"] = paddle.full([max_num_seqs, 1], -1, dtype="int64")
        si["system_lens"] = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        si["system_ids"] = paddle.full([max_num_seqs, 1], -1, dtype="int32")
        si["ids_remove_padding"] = paddle.full([max_num_seqs * mc.max_model_len], 0, dtype="int64")
        si["batch_id_per_token"] = paddle.full([max_num_seqs * mc.max_model_len, 1], 0, dtype="int32")
        si["cu_seqlens_q"] = paddle.full([max_num_seqs + 1, 1], 0, dtype="int32")
        si["cu_seqlens_k"] = paddle.full([max_num_seqs + 1, 1], 0, dtype="int32")
        # Attention backend buffers (no attention backend in the replica)
        for key in (
            "decoder_batch_ids", "decoder_tile_ids_per_batch", "decoder_num_blocks_cpu",
            "decoder_num_blocks_device", "decoder_chunk_size_device", "max_len_tensor_cpu",
            "encoder_batch_ids", "encoder_tile_ids_per_batch", "encoder_num_blocks_x_cpu",
            "kv_batch_ids", "kv_tile_ids_per_batch", "kv_num_blocks_x_cpu",
        ):
            si[key] = None
        si["enable_thinking"] = paddle.full([max_num_seqs, 1], True, dtype="bool")
        si["max_think_lens"] = paddle.full([max_num_seqs, 1], -1, dtype="int32")
        si["max_reply_lens"] = paddle.full([max_num_seqs, 1], -1, dtype="int32")
        si["limit_think_status"] = paddle.full([max_num_seqs, 1], 0, dtype="int32")
        si["inject_token_ids"] = paddle.to_tensor(mc.think_truncate_prompt_ids, dtype="int64").reshape([-1, 1])
        pre_max_block_num = (mc.max_model_len + cc.block_size - 1) // cc.block_size + cc.enc_dec_block_num
        si["block_tables"] = paddle.full([max_num_seqs, pre_max_block_num], -1, dtype="int32")
        free_list = list(
            range(cc.total_block_num - 1, int(cc.total_block_num * cc.kv_cache_ratio) - 1, -1)
        )
        self.free_list_len = len(free_list)
        si["free_list"] = paddle.to_tensor(free_list, dtype="int32")
        si["free_list_len"] = paddle.full([1], self.free_list_len, dtype="int32")
        si["stop_seqs_len"] = paddle.full([max_num_seqs, mc.max_stop_seqs_num], 0, dtype="int32")
        si["stop_seqs"] = paddle.full([max_num_seqs, mc.max_stop_seqs_num, mc.stop_seqs_max_len], -1, dtype="int64")
        si["req_ids"] = [""] * max_num_seqs
        si["entropy_list"] = [[] for _ in range(max_num_seqs)]
        si["logits_processors"] = []
        si["logits_processors_args"] = [{} for _ in range(max_num_seqs)]
        si["mask_rollback"] = paddle.full([max_num_seqs, 1], 0, dtype="int32")

        # Everything FastDeploy allocates with paddle.full lives on the GPU.
        for key, value in si.items():
            if isinstance(value, paddle.Tensor) and key not in HOST_SHARE_INPUTS:
                as_device(value)

    def reset_share_inputs(self) -> None:
        """Refill every share buffer with its initial value. Like 2.4's (cherry-picked #6329), it
        already names ``not_need_stop_device`` and ``sampled_token_ids``, which ``fill_paddle_tensor``
        skips while they do not exist."""
        if not getattr(self, "share_inputs", None):
            return
        mc = self.model_config
        max_num_seqs = self.scheduler_config.max_num_seqs
        fill = fill_paddle_tensor
        si = self.share_inputs
        fill(si, "pre_ids", -1)
        fill(si, "input_ids", mc.pad_token_id)
        fill(si, "prompt_ids", mc.pad_token_id)
        fill(si, "eos_token_id", 0)
        fill(si, "top_p", mc.top_p)
        fill(si, "top_k", 0)
        si["top_k_list"] = [0] * max_num_seqs
        fill(si, "min_p", 0.0)
        si["min_p_list"] = [0.0] * max_num_seqs
        fill(si, "temperature", mc.temperature)
        fill(si, "penalty_score", mc.penalty_score)
        fill(si, "frequency_score", mc.frequency_score)
        fill(si, "presence_score", mc.presence_score)
        fill(si, "temp_scaled_logprobs", False)
        fill(si, "top_p_normalized_logprobs", False)
        fill(si, "min_dec_len", mc.min_length)
        fill(si, "max_dec_len", mc.max_model_len)
        fill(si, "seq_lens_this_time", 0)
        fill(si, "seq_lens_encoder", 0)
        fill(si, "seq_lens_decoder", 0)
        fill(si, "step_seq_lens_encoder", 0)
        fill(si, "step_seq_lens_decoder", 0)
        fill(si, "prompt_lens", 0)
        fill(si, "step_idx", 0)
        fill(si, "not_need_stop", False)
        fill(si, "not_need_stop_device", False)
        fill(si, "sampled_token_ids", -1)
        fill(si, "stop_flags", True)
        fill(si, "bad_tokens", -1)
        fill(si, "bad_tokens_len", 1)
        fill(si, "next_tokens", -1)
        fill(si, "is_block_step", False)
        fill(si, "is_chunk_step", False)
        fill(si, "encoder_block_lens", 0)
        fill(si, "step_block_list", -1)
        fill(si, "step_lens", 0)
        fill(si, "recover_block_list", -1)
        fill(si, "recover_lens", 0)
        fill(si, "need_block_list", -1)
        fill(si, "need_block_len", 0)
        fill(si, "used_list_len", 0)
        fill(si, "infer_seed", 0)
        fill(si, "first_token_ids", -1)
        fill(si, "system_lens", 0)
        fill(si, "system_ids", -1)
        fill(si, "ids_remove_padding", 0)
        fill(si, "batch_id_per_token", 0)
        fill(si, "cu_seqlens_q", 0)
        fill(si, "cu_seqlens_k", 0)
        fill(si, "enable_thinking", True)
        fill(si, "max_think_lens", -1)
        fill(si, "max_reply_lens", -1)
        fill(si, "limit_think_status", 0)
        fill(si, "reasoning_status", 0)
        fill(si, "block_tables", -1)
        fill(si, "free_list_len", self.free_list_len)
        fill(si, "stop_seqs_len", 0)
        fill(si, "stop_seqs", -1)
        si["req_ids"] = [""] * max_num_seqs
        si["entropy_list"] = [[] for _ in range(max_num_seqs)]
        si["logits_processors_args"] = [{} for _ in range(max_num_seqs)]
        fill(si, "mask_rollback", 0)
        fill(si, "preempted_idx", 0)
        self.exist_prefill_flag = False

    # ---- one step -----------------------------------------------------------------------------

    def _prepare_inputs(self, is_dummy_or_profile_run=False) -> None:
        """Recover block-step slots, recompute the logprob width, pack the running tokens and
        build the sampling metadata."""
        if envs.ENABLE_V1_KVCACHE_SCHEDULER:
            recover_decode_task(
                self.share_inputs["stop_flags"],
                self.share_inputs["seq_lens_this_time"],
                self.share_inputs["seq_lens_encoder"],
                self.share_inputs["seq_lens_decoder"],
                self.share_inputs["step_seq_lens_decoder"],
                self.share_inputs["block_tables"],
                self.share_inputs["is_block_step"],
                self.share_inputs["draft_tokens"] if self.speculative_decoding else None,
                self.share_inputs["step_draft_tokens"] if self.speculative_decoding else None,
                self.share_inputs["step_seq_lens_this_time"] if self.speculative_decoding else None,
                self.cache_config.block_size,
                self.speculative_config.num_speculative_tokens if self.speculative_decoding else 0,
            )
            logprobs_reqs = [
                req
                for req in self.forward_batch_reqs_list
                if req is not None and req.sampling_params is not None and req.sampling_params.logprobs is not None
            ]
            if len(logprobs_reqs):
                self.max_logprobs = (
                    max(
                        self.ori_vocab_size if req.sampling_params.logprobs < 0 else req.sampling_params.logprobs
                        for req in logprobs_reqs
                    )
                    if not self.speculative_decoding
                    else 20
                )
                self.temp_scaled_logprobs = any(req.sampling_params.temp_scaled_logprobs for req in logprobs_reqs)
                self.top_p_normalized_logprobs = any(
                    req.sampling_params.top_p_normalized_logprobs for req in logprobs_reqs
                )
            elif self.enable_logprob:
                self.max_logprobs = None if not self.speculative_decoding else 0

        (
            ids_remove_padding,
            batch_id_per_token,
            cu_seqlens_q,
            cu_seqlens_k,
            output_cum_offsets,
            output_padding_offset,
        ) = pre_process(
            self.share_inputs["input_ids"],
            self.share_inputs["seq_lens_this_time"],
            self.speculative_decoding,
            (self.share_inputs["draft_tokens"] if self.speculative_decoding else None),
            self.share_inputs["seq_lens_encoder"],
            self.share_inputs["seq_lens_decoder"],
        )
        self.share_inputs["ids_remove_padding"].copy_(ids_remove_padding, False)
        self.share_inputs["batch_id_per_token"][:] = -1
        self.share_inputs["batch_id_per_token"].copy_(batch_id_per_token, False)
        self.share_inputs["cu_seqlens_q"].copy_(cu_seqlens_q, False)
        self.share_inputs["cu_seqlens_k"].copy_(cu_seqlens_k, False)

        # Update bad tokens len: a blocking D2H (S2).
        count_d2h("_prepare_inputs.bad_tokens_len")
        max_bad_tokens_len = np.max(self.share_inputs["bad_tokens_len"].numpy())

        self.initialize_forward_meta(is_dummy_or_profile_run=is_dummy_or_profile_run)

        self.sampling_metadata = SamplingMetadata(
            temperature=self.share_inputs["temperature"],
            top_p=self.share_inputs["top_p"],
            top_k=self.share_inputs["top_k"],
            top_k_list=self.share_inputs["top_k_list"],
            min_p=self.share_inputs["min_p"],
            min_p_list=self.share_inputs["min_p_list"],
            seed=self.share_inputs["infer_seed"],
            step_idx=self.share_inputs["step_idx"],
            pre_token_ids=self.share_inputs["pre_ids"],
            prompt_ids=self.share_inputs["prompt_ids"],
            prompt_lens=self.share_inputs["prompt_lens"],
            frequency_penalties=self.share_inputs["frequency_score"],
            presence_penalties=self.share_inputs["presence_score"],
            repetition_penalties=self.share_inputs["penalty_score"],
            min_dec_lens=self.share_inputs["min_dec_len"],
            bad_words_token_ids=self.share_inputs["bad_tokens"][:, :max_bad_tokens_len],
            eos_token_ids=self.share_inputs["eos_token_id"],
            max_num_logprobs=self.max_logprobs,
            enable_early_stop=self.enable_early_stop,
            stop_flags=self.share_inputs["stop_flags"],
            temp_scaled_logprobs_flag=self.temp_scaled_logprobs,
            top_p_normalized_logprobs_flag=self.top_p_normalized_logprobs,
            temp_scaled_logprobs=self.share_inputs["temp_scaled_logprobs"],
            top_p_normalized_logprobs=self.share_inputs["top_p_normalized_logprobs"],
            logits_processors=self.share_inputs["logits_processors"],
            share_inputs=self.share_inputs,
            keep_sampling_mask=self.enable_keep_sampling_mask,
        )

    def load_model(self) -> None:
        """The replica's model: a fixed-seed ``TinyModel`` over the configured vocabulary, under the
        CUDA-graph stand-in where graphs are on."""
        mc = self.model_config
        self.model = TinyModel(mc.vocab_size, mc.max_model_len, mc.hidden_size, mc.model_seed,
                               rows_dependent_gemm=mc.rows_dependent_gemm, moe_experts=mc.moe_experts)
        if self.use_cudagraph:
            self.model = GraphReplay(self.model, self.graph_opt_config, self)

    def get_model(self):
        return self.model

    def _position_ids(self) -> paddle.Tensor:
        """Each packed token's position: ``seq_lens_decoder`` of its slot plus its offset in the
        step (what the attention metadata encodes in FastDeploy)."""
        # What the attention metadata encodes on the device (no host read in FastDeploy).
        with device_code():
            cu = self.share_inputs["cu_seqlens_q"].numpy().reshape(-1)
            dec = self.share_inputs["seq_lens_decoder"].numpy().reshape(-1)
            this_time = self.share_inputs["seq_lens_this_time"].numpy().reshape(-1)
        positions = [dec[b] + np.arange(n) for b, n in enumerate(this_time) if n > 0]
        flat = np.concatenate(positions) if positions else np.zeros([0], dtype=np.int64)
        # padded tokens past the real count (an upper-bound token count) belong to no slot: position 0
        padded = int(self.share_inputs["ids_remove_padding"].shape[0]) - flat.shape[0]
        if padded > 0:
            flat = np.concatenate([flat, np.zeros([padded], dtype=flat.dtype)])
        return as_device(paddle.to_tensor(flat.astype(np.int64)))

    def initialize_forward_meta(self, is_dummy_or_profile_run=False):
        self.forward_meta = ForwardMeta(
            ids_remove_padding=self.share_inputs["ids_remove_padding"],
            seq_lens_encoder=self.share_inputs["seq_lens_encoder"],
            seq_lens_decoder=self.share_inputs["seq_lens_decoder"],
            seq_lens_this_time=self.share_inputs["seq_lens_this_time"],
            batch_id_per_token=self.share_inputs["batch_id_per_token"],
            cu_seqlens_q=self.share_inputs["cu_seqlens_q"],
            cu_seqlens_k=self.share_inputs["cu_seqlens_k"],
            block_tables=self.share_inputs["block_tables"],
            position_ids=self._position_ids(),
        )
        dist_status = self.collect_distributed_status()
        only_decode_use_cudagraph = self.use_cudagraph and dist_status.if_only_decode
        self.forward_meta.step_use_cudagraph = (
            only_decode_use_cudagraph and self.forward_meta.ids_remove_padding.shape[0] > 0
        )
        self.forward_meta.is_dummy_or_profile_run = is_dummy_or_profile_run

    def padding_cudagraph_inputs(self) -> None:
        """Under CUDA graphs the forward gets the whole ``seq_lens_this_time`` buffer, and the step
        keeps the forward's first ``real_token_num`` rows (the token count)."""
        if self.use_cudagraph:
            self.forward_meta.seq_lens_this_time = self.seq_lens_this_time_buffer
            self.real_token_num = self.forward_meta.ids_remove_padding.shape[0]

    def _get_p_done_idxs_gd(self, model_forward_batch: Optional[List[Request]], num_running_requests: int):
        """Guided decoding is off: no prefill-done indices."""
        return []

    def _build_model_output_data(self, model_output, prompt_logprobs_list=None) -> ModelOutputData:
        si = self.share_inputs
        return ModelOutputData(
            next_tokens=si["next_tokens"],
            stop_flags=si["stop_flags"],
            step_idx=si["step_idx"],
            max_dec_len=si["max_dec_len"],
            pre_ids=si["pre_ids"],
            seq_lens_this_time=si["seq_lens_this_time"],
            eos_token_id=si["eos_token_id"],
            not_need_stop=si["not_need_stop"],
            input_ids=si["input_ids"],
            stop_nums=si["stop_nums"],
            seq_lens_encoder=si["seq_lens_encoder"],
            seq_lens_decoder=si["seq_lens_decoder"],
            is_block_step=si["is_block_step"],
            full_hidden_states=model_output,
            msg_queue_id=self.parallel_config.msg_queue_id,
            mp_rank=self.parallel_config.tensor_parallel_rank,
            use_ep=self.parallel_config.use_ep,
            draft_tokens=(si["draft_tokens"] if self.speculative_decoding else None),
            actual_draft_token_num=(si["actual_draft_token_num"] if self.speculative_decoding else None),
            accept_tokens=(si["accept_tokens"] if self.speculative_decoding else None),
            accept_num=(si["accept_num"] if self.speculative_decoding else None),
            stop_token_ids=si["stop_seqs"],
            stop_seqs_len=si["stop_seqs_len"],
            prompt_lens=si["prompt_lens"],
            mask_rollback=si["mask_rollback"],
            prompt_logprobs_list=prompt_logprobs_list,
        )

    def execute_model(
        self,
        model_forward_batch: Optional[List[Request]] = None,
        num_running_requests: int = None,
    ) -> None:
        """One step: prepare, forward, sample, post-process (which saves the output, in 2.4)."""
        # 1. Prepare inputs of model and sampler.
        p_done_idxs = self._get_p_done_idxs_gd(model_forward_batch, num_running_requests)
        self._prepare_inputs()
        self.sampler.pre_process(p_done_idxs)
        for proc in self.sampling_metadata.logits_processors:
            proc.update_state(self.share_inputs)

        # 2. Padding inputs for cuda graph
        self.padding_cudagraph_inputs()

        # 3. Execute model
        model_output = self.model(self.forward_meta.ids_remove_padding, self.forward_meta)

        # An idle worker (EP) returns here; in TP the worker loop never calls in that state.
        if not self.not_need_stop():
            return None

        if self.use_cudagraph:
            model_output = model_output[: self.real_token_num]

        prompt_logprobs_list = self._get_prompt_logprobs_list(model_output)

        hidden_states = rebuild_padding(
            model_output,
            self.share_inputs["cu_seqlens_q"],
            self.share_inputs["seq_lens_this_time"],
            self.share_inputs["seq_lens_decoder"],
            self.share_inputs["seq_lens_encoder"],
            None,
            self.model_config.max_model_len,
        )

        # 4. Compute logits, Sample
        logits = self.model.compute_logits(hidden_states)
        set_value_by_flags_and_idx(
            self.share_inputs["pre_ids"],
            self.share_inputs["input_ids"],
            self.share_inputs["seq_lens_this_time"],
            self.share_inputs["seq_lens_encoder"],
            self.share_inputs["seq_lens_decoder"],
            self.share_inputs["step_idx"],
            self.share_inputs["stop_flags"],
        )
        sampler_output = self.sampler(logits, self.sampling_metadata, p_done_idxs)
        if self.enable_logprob and not envs.FD_USE_GET_SAVE_OUTPUT_V1 and sampler_output.logprobs_tensors is None:
            # FastDeploy fills these with paddle.empty (uninitialised host memory, sent as scores
            # and ranks); the replica uses zeros so that runs compare bit for bit.
            sampler_output.logprobs_tensors = LogprobsTensors(
                logprob_token_ids=sampler_output.sampled_token_ids,
                logprobs=paddle.zeros(sampler_output.sampled_token_ids.shape, dtype="float32", device="cpu"),
                selected_token_ranks=paddle.zeros([sampler_output.sampled_token_ids.shape[0]], dtype="int64", device="cpu"),
            )

        # 5. Post Process
        model_output_data = self._build_model_output_data(model_output, prompt_logprobs_list)
        skip_save_output = self.speculative_config.method in ["mtp"] and self.scheduler_config.splitwise_role == "prefill"
        post_process(
            sampler_or_pooler_output=sampler_output,
            model_output=model_output_data,
            share_inputs=self.share_inputs,
            sampling_metadata=self.sampling_metadata,
            block_size=self.cache_config.block_size,
            save_each_rank=self.parallel_config.use_ep,
            speculative_decoding=self.speculative_decoding,
            skip_save_output=skip_save_output,
            async_output_queue=self.async_output_queue,
            think_end_id=self.model_config.think_end_id,
            splitwise_role_is_decode=self.scheduler_config.splitwise_role == "decode",
            enable_entropy=self.enable_entropy and self.parallel_config.tensor_parallel_rank == 0,
            routing_replay_manager=self.routing_replay_manager,
            sampling_mask_zmq_client=self.sampling_mask_zmq_client,
        )
        if self.guided_backend is not None and sampler_output is not None:
            self.sampler.post_process(sampler_output.sampled_token_ids)

        # 7. Update 'infer_seed' and step_cuda()
        self.share_inputs["infer_seed"].add_(self.infer_seed_increment)
        self.share_inputs["infer_seed"][:] %= self.MAX_INFER_SEED
        if not envs.ENABLE_V1_KVCACHE_SCHEDULER:
            step_cuda(
                self.share_inputs,
                self.cache_config.block_size,
                self.cache_config.enc_dec_block_num,
                self.speculative_config,
                self.cache_config.enable_prefix_caching,
            )
        return None

    def not_need_stop(self) -> bool:
        """Stop decoding if the tensor meets the termination condition.

        Despite the annotation this returns the 0-d host Tensor ``not_need_stop[0]`` (2.4)."""
        flag = self.share_inputs["not_need_stop"]
        paddle_op_inputs("GPUModelRunner.not_need_stop", flag)
        if is_pinned(flag):
            replica_backend.current().read(flag, "GPUModelRunner.not_need_stop")
        else:
            census.record("host_read", "GPUModelRunner.not_need_stop")
        return flag[0]

    def _get_prompt_logprobs_list(self, hidden_states: paddle.Tensor) -> list[Optional[LogprobsTensors]]:
        """Prompt logprobs of this step's prefill chunks, accumulated in host buffers; a request's
        buffer is returned (at its slot) when its last chunk is done."""
        if len(self.prompt_logprobs_reqs) > 0:
            assert (
                not self.fd_config.cache_config.enable_prefix_caching
            ), "prompt_logprobs must disable prefix caching, --no-enable-prefix-caching."
        logprobs_mode = self.fd_config.model_config.logprobs_mode
        prompt_logprobs_list: list[Optional[LogprobsTensors]] = self.scheduler_config.max_num_seqs * [None]
        completed_prefill_reqs: list[Request] = []
        for req_id, request in self.prompt_logprobs_reqs.items():
            num_prompt_logprobs = request.sampling_params.prompt_logprobs
            if request.prompt_token_ids is None or num_prompt_logprobs is None:
                continue
            if num_prompt_logprobs == -1:
                num_prompt_logprobs = self.ori_vocab_size

            num_tokens = request.prefill_end_index - request.prefill_start_index
            num_prompt_tokens = len(request.prompt_token_ids)

            logprobs_tensors = self.in_progress_prompt_logprobs.get(req_id)
            if not logprobs_tensors:
                logprobs_tensors = LogprobsTensors.empty_cpu(num_prompt_tokens - 1, num_prompt_logprobs + 1)
                self.in_progress_prompt_logprobs[req_id] = logprobs_tensors
            start_idx = request.prefill_start_index
            start_tok = start_idx + 1
            num_remaining_tokens = num_prompt_tokens - start_tok
            if num_tokens <= num_remaining_tokens:
                # A chunk with more tokens to come (in the == case the logprobs are returned with
                # the next step, which has generated tokens to return).
                num_logits = num_tokens
            else:
                num_logits = num_remaining_tokens
                completed_prefill_reqs.append(request)
                prompt_logprobs_list[request.idx] = logprobs_tensors
            if num_logits <= 0:
                continue
            # ``cu_seqlens_q[request.idx]`` is a device scalar used as a slice bound.
            offset = int(blocking_d2h(self.share_inputs["cu_seqlens_q"][request.idx], "_get_prompt_logprobs_list.offset"))
            prompt_hidden_states = hidden_states[offset : offset + num_logits]
            logits = self.model.compute_logits(prompt_hidden_states)
            prompt_token_ids = request.prompt_token_ids[start_tok : start_tok + num_logits]
            prompt_token_ids_tensor = as_device(paddle.to_tensor(prompt_token_ids, dtype="int64"))
            if logprobs_mode == "raw_logprobs":
                raw_logprobs = self.sampler.compute_logprobs(logits)
            elif logprobs_mode == "raw_logits":
                raw_logprobs = logits
            token_ids, logprobs, ranks = self.sampler.gather_logprobs(
                raw_logprobs, num_prompt_logprobs, prompt_token_ids_tensor
            )
            chunk_slice = slice(start_idx, start_idx + num_logits)
            logprobs_tensors.logprob_token_ids[chunk_slice].copy_(token_ids, False)
            logprobs_tensors.logprobs[chunk_slice].copy_(logprobs, False)
            logprobs_tensors.selected_token_ranks[chunk_slice].copy_(ranks, False)

        for req in completed_prefill_reqs:
            del self.prompt_logprobs_reqs[req.request_id]
            del self.in_progress_prompt_logprobs[req.request_id]
        return prompt_logprobs_list

    # ---- warm-up ------------------------------------------------------------------------------

    def get_input_length_list(self, num_tokens: int, batch_size: int, expected_decode_len: int, capture_prefill: bool = False):
        max_dec_len = expected_decode_len + 1
        input_length = min(
            num_tokens // (1 if capture_prefill else batch_size), self.model_config.max_model_len - max_dec_len
        )
        block_num = (input_length + self.cache_config.block_size - 1) // self.cache_config.block_size + (
            self.cache_config.enc_dec_block_num
        )
        input_length_list = [input_length] * batch_size
        if capture_prefill:
            if num_tokens < batch_size:
                input_length_list = [1] * num_tokens
            else:
                input_length_list = [1] * (batch_size - 1)
                input_length_list.append(num_tokens - batch_size + 1)
        return input_length_list, [max_dec_len] * len(input_length_list), block_num

    def _dummy_prefill_inputs(self, input_length_list: List[int], max_dec_len_list: List[int], block_num: int):
        """Dummy prompts of token 5 in the first slots."""
        for idx, (input_length, max_dec_len) in enumerate(zip(input_length_list, max_dec_len_list)):
            self.share_inputs["input_ids"][idx : idx + 1, :input_length] = np.array([5] * input_length)
            self.share_inputs["prompt_ids"][idx : idx + 1, :input_length] = np.array([5] * input_length)
            self.share_inputs["eos_token_id"][:] = np.array(
                [2] * self.model_config.eos_tokens_lens, dtype="int64"
            ).reshape(-1, 1)
            self.seq_lens_this_time_buffer[idx : idx + 1] = input_length
            self.share_inputs["step_seq_lens_encoder"][idx : idx + 1] = input_length
            self.share_inputs["seq_lens_encoder"][idx : idx + 1] = input_length
            self.share_inputs["seq_lens_decoder"][idx : idx + 1] = 0
            self.share_inputs["prompt_lens"][idx : idx + 1] = 0
            self.share_inputs["step_idx"][idx : idx + 1] = 0
            self.share_inputs["max_dec_len"][idx : idx + 1] = max_dec_len
            self.share_inputs["min_dec_len"][idx : idx + 1] = max_dec_len
            self.share_inputs["stop_flags"][idx : idx + 1] = False
            self.share_inputs["temperature"][idx : idx + 1] = 1
            self.share_inputs["first_token_ids"][idx : idx + 1] = self.share_inputs["input_ids"][idx : idx + 1, :1]
            self.share_inputs["encoder_block_lens"][idx : idx + 1] = block_num
            self.share_inputs["block_tables"][idx : idx + 1, :block_num] = np.arange(
                idx * block_num, (idx + 1) * block_num, 1
            )
        self.share_inputs["seq_lens_this_time"] = self.seq_lens_this_time_buffer

    def _dummy_sampler_run(
        self,
        hidden_states: paddle.Tensor,
        model_output: paddle.Tensor,
        accept_all_drafts=False,
        reject_all_drafts=False,
    ) -> paddle.Tensor:
        logits = self.model.compute_logits(hidden_states)
        set_value_by_flags_and_idx(
            self.share_inputs["pre_ids"],
            self.share_inputs["input_ids"],
            self.share_inputs["seq_lens_this_time"],
            self.share_inputs["seq_lens_encoder"],
            self.share_inputs["seq_lens_decoder"],
            self.share_inputs["step_idx"],
            self.share_inputs["stop_flags"],
        )
        sampler_output = self.sampler(logits, self.sampling_metadata)
        model_output_data = self._build_model_output_data(model_output)
        post_process(
            sampler_or_pooler_output=sampler_output,
            model_output=model_output_data,
            share_inputs=self.share_inputs,
            sampling_metadata=self.sampling_metadata,
            block_size=self.cache_config.block_size,
            speculative_decoding=self.speculative_decoding,
            skip_save_output=True,
            async_output_queue=self.async_output_queue,
            think_end_id=self.model_config.think_end_id,
            splitwise_role_is_decode=self.scheduler_config.splitwise_role == "decode",
            enable_entropy=self.enable_entropy and self.parallel_config.tensor_parallel_rank == 0,
        )
        return sampler_output

    def _dummy_run(
        self,
        num_tokens: int,
        batch_size: int,
        expected_decode_len: int = 1,
        in_capturing: bool = False,
        capture_prefill: bool = False,
        accept_all_drafts: bool = False,
        reject_all_drafts: bool = False,
    ) -> paddle.Tensor:
        """Warm-up: dummy prompts decoded until every slot stops; nothing is saved."""
        input_length_list, max_dec_len_list, block_num = self.get_input_length_list(
            num_tokens=num_tokens,
            batch_size=batch_size,
            expected_decode_len=expected_decode_len,
            capture_prefill=capture_prefill,
        )
        self._dummy_prefill_inputs(input_length_list, max_dec_len_list, block_num)
        while True:
            self._prepare_inputs(is_dummy_or_profile_run=True)
            self.forward_meta.step_use_cudagraph = in_capturing and self.forward_meta.step_use_cudagraph
            self.padding_cudagraph_inputs()
            model_output = self.model(self.forward_meta.ids_remove_padding, self.forward_meta)
            if self.use_cudagraph:
                model_output = model_output[: self.real_token_num]
            hidden_states = rebuild_padding(
                model_output,
                self.share_inputs["cu_seqlens_q"],
                self.share_inputs["seq_lens_this_time"],
                self.share_inputs["seq_lens_decoder"],
                self.share_inputs["seq_lens_encoder"],
                None,
                self.model_config.max_model_len,
            )
            self._dummy_sampler_run(hidden_states, model_output, accept_all_drafts, reject_all_drafts)
            self.share_inputs["infer_seed"].add_(self.infer_seed_increment)
            self.share_inputs["infer_seed"][:] %= self.MAX_INFER_SEED
            step_cuda(
                self.share_inputs,
                self.cache_config.block_size,
                self.cache_config.enc_dec_block_num,
                self.speculative_config,
                self.cache_config.enable_prefix_caching,
            )
            running = host_view(self.share_inputs["seq_lens_this_time"], "_dummy_run.seq_lens_this_time")
            if int((running > 0).sum()) == 0:
                break
