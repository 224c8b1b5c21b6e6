"""Mirrors ``fastdeploy/worker/gpu_model_runner.py`` (2.5, after #6176/#6259/#6362) at the
patch points; V1 scheduler only.

- ``share_inputs`` is an ``InputBatch`` (``__init__`` :202); no ``_init_share_inputs``;
- ``insert_tasks_v1`` writes the request's seed into the host ``infer_seed`` (:897-898) and sets the
  pinned flag with ``set_stop(..., True)`` (:931); a PREEMPTED task (:851-870) flags
  ``preempted_idx`` (cleared by PREFILL :723 and DECODE :849 tasks), empties its block-table row,
  stops the slot and zeroes its lengths and block-step flag;
- ``_prepare_inputs(last_token_num)`` (:1285): async copies of ``seq_lens_this_time`` /
  ``is_block_step`` into pinned buffers and ``token_num_event`` (``paddle.device.cuda.create_event()``,
  ``.synchronize()``, then ``.numpy().sum().item()`` of the pinned buffer, as FastDeploy spells it); the host token count for
  ``pre_process`` (from last step's count under the overlap schedule when decode-only);
- ``execute_model`` (:2244) -> ``execute_model_normal`` (:2263) / ``execute_model_overlap``
  (:2277, saves the previous step after enqueuing this one), ``_preprocess_and_execute_model``
  (:2302), ``_postprocess`` (:2343, ends with ``post_process_event``: async copies of
  ``sampled_token_ids`` and ``not_need_stop_device`` into the pinned buffers, then record),
  ``_save_model_output`` (:2615: wait on the event, ``save_output_normal``);
- ``not_need_stop()`` (:2793) = ``get_stop(not_need_stop).item()``, a bool;
- ``_get_prompt_logprobs_list`` (:3175) with ``paddle.device.synchronize()`` before copying.

Every CUDA event/copy goes through the copy backend (``create_event``/``record`` ->
``backend.record``, ``synchronize`` -> ``backend.wait``, pinned ``copy_(x, False)`` ->
``backend.copy_d2h``, ``paddle.device.synchronize()`` is spelled as in FastDeploy and routed to
``backend.device_synchronize`` by ``reference/paddle_device.py`` on the CPU build, while a decode
run (``driver.run_decode``) or ``paddle_device.routed()`` asks for it; importing this module
changes nothing).
"""

from __future__ import annotations

import os
from typing import List, Optional

import numpy as np
import paddle

from .. import envs
from ...placement import as_device, blocking_d2h, copy_async, count_d2h, device_code
from ...tiny_model import TinyModel
from ...zmq_sink import AsyncOutputThread
from ...copy_backend import current as current_backend
from ...paddle_device import RecordedEvent
from ..engine.request import Request, RequestType
from ..model_executor.forward_meta import ForwardMeta
from ..model_executor.layers.sample.meta_data import SamplingMetadata
from ..model_executor.layers.sample.sampler import Sampler, SpeculativeSampler
from ..model_executor.ops.gpu import get_stop, recover_decode_task, set_stop, set_value_by_flags_and_idx
from ..model_executor.pre_and_post_process import (
    post_process,
    pre_process,
    rebuild_padding,
    save_output_normal,
    step_cuda,
)
from .input_batch import InputBatch
from .output import LogprobsTensors, ModelOutputData


class GPUModelRunner(AsyncOutputThread):
    def __init__(self, fd_config, device: str, device_id: int, rank: int, local_rank: int):
        self.fd_config = fd_config
        self.model_config = fd_config.model_config
        self.cache_config = fd_config.cache_config
        self.scheduler_config = fd_config.scheduler_config
        self.parallel_config = fd_config.parallel_config
        self.speculative_config = fd_config.speculative_config
        self.graph_opt_config = fd_config.graph_opt_config
        self.device = device
        self.rank = rank
        self.local_rank = local_rank
        self.device_id = device_id
        self.enable_mm = self.model_config.enable_mm
        self.speculative_method = self.speculative_config.method
        self.speculative_decoding = self.speculative_method is not None
        self.enable_logprob = self.model_config.enable_logprob
        self.enable_early_stop = fd_config.early_stop_config.enable_early_stop
        self.is_pooling_model = self.model_config.runner_type == "pooling"
        self.ori_vocab_size = self.model_config.ori_vocab_size
        self.enable_overlap_schedule = self.scheduler_config.enable_overlap_schedule
        self.max_logprobs = None
        if self.enable_logprob:
            self.max_logprobs = (
                self.ori_vocab_size if self.model_config.max_logprobs == -1 else self.model_config.max_logprobs
            )
        self.temp_scaled_logprobs = True
        self.top_p_normalized_logprobs = True
        self.prompt_logprobs_reqs: dict[str, Request] = {}
        self.in_progress_prompt_logprobs: dict[str, LogprobsTensors] = {}
        self.forward_batch_reqs_list: list = [None for _ in range(self.scheduler_config.max_num_seqs)]
        self.sampler = Sampler(fd_config) if not self.speculative_decoding else SpeculativeSampler(fd_config)
        self.guided_backend = None
        self.use_cudagraph = self.graph_opt_config.use_cudagraph

        self.share_inputs = InputBatch(self.fd_config)
        self.share_inputs.init_share_inputs()
        self.MAX_INFER_SEED = 9223372036854775806
        self.infer_seed_increment = paddle.full(
            shape=[self.scheduler_config.max_num_seqs, 1], fill_value=4, dtype="int64"
        ).cpu()

        # Overlap schedule (#6259): what the previous step left to save.
        self.last_model_output_data = None
        self.last_sampler_output = None
        self.last_post_process_event = None
        self.last_token_num = -1

        self.exist_prefill_flag = False
        self.forward_meta: Optional[ForwardMeta] = None
        self.model = None
        os.environ["INFERENCE_MSG_QUEUE_ID"] = str(self.parallel_config.engine_worker_queue_port)
        self.routing_replay_manager = None
        self.enable_entropy = self.model_config.enable_entropy

        self.zmq_client = None
        self.async_output_queue = None
        if envs.FD_USE_GET_SAVE_OUTPUT_V1:
            self._start_async_output_thread(local_rank, self.parallel_config.engine_worker_queue_port)

    def exist_prefill(self):
        """V1: a host flag set when a prefill is inserted, cleared after post-processing."""
        if envs.ENABLE_V1_KVCACHE_SCHEDULER:
            return self.exist_prefill_flag
        raise NotImplementedError("the 2.5 replica models the V1 scheduler only")

    def load_model(self) -> None:
        mc = self.model_config
        self.model = TinyModel(mc.vocab_size, mc.max_model_len, mc.hidden_size, mc.model_seed,
                               rows_dependent_gemm=mc.rows_dependent_gemm, moe_experts=mc.moe_experts)

    # ---- task insertion ------------------------------------------------------------------------

    def insert_tasks_v1(self, req_dicts: List[Request], num_running_requests: int = None):
        si = self.share_inputs
        has_prefill_task = False
        has_decode_task = False
        for request in req_dicts:
            idx = request.idx
            if request.task_type.value == RequestType.PREFILL.value:
                si["preempted_idx"][idx : idx + 1, :] = 0  # 2.5 :723
                si["req_ids"][idx] = str(request.request_id)
                start, end = request.prefill_start_index, request.prefill_end_index
                length = end - start
                si["max_think_lens"][idx : idx + 1, :] = -1
                si["max_reply_lens"][idx : idx + 1, :] = -1
                si["limit_think_status"][idx : idx + 1, :] = 0
                prompt_token_ids = list(request.prompt_token_ids)
                input_ids = prompt_token_ids + request.output_token_ids
                si["prompt_ids"][idx : idx + 1, : len(prompt_token_ids)] = np.array(prompt_token_ids, dtype="int64")
                si["input_ids"][idx : idx + 1, :length] = np.array(input_ids[start:end])
                encoder_block_num = len(request.block_tables)
                si["encoder_block_lens"][idx : idx + 1] = encoder_block_num
                si["block_tables"][idx : idx + 1, :] = -1
                si["block_tables"][idx : idx + 1, :encoder_block_num] = np.array(request.block_tables, dtype="int32")
                si["stop_flags"][idx : idx + 1] = False
                si["seq_lens_decoder"][idx : idx + 1] = start
                si["seq_lens_this_time_buffer"][idx : idx + 1] = length
                si["seq_lens_encoder"][idx : idx + 1] = length
                self.exist_prefill_flag = True
                si["step_seq_lens_decoder"][idx : idx + 1] = 0
                si["prompt_lens"][idx : idx + 1] = len(input_ids)
                si["is_block_step"][idx : idx + 1] = False
                si["is_chunk_step"][idx : idx + 1] = end < len(input_ids)
                si["step_idx"][idx : idx + 1] = len(request.output_token_ids) if end >= len(input_ids) else 0
                si["pre_ids"][idx : idx + 1] = -1
                if request.sampling_params is not None and request.sampling_params.prompt_logprobs is not None:
                    self.prompt_logprobs_reqs[request.request_id] = request
                self.forward_batch_reqs_list[idx] = request
                has_prefill_task = True
            elif request.task_type.value == RequestType.DECODE.value:
                encoder_block_num = len(request.block_tables)
                si["encoder_block_lens"][idx : idx + 1] = encoder_block_num
                si["block_tables"][idx : idx + 1, :] = -1
                si["block_tables"][idx : idx + 1, :encoder_block_num] = np.array(request.block_tables, dtype="int32")
                count_d2h("insert_tasks_v1.is_block_step")
                if si["is_block_step"][idx]:  # a device scalar read on the host (I1, 2.5 :847)
                    has_decode_task = True
                si["preempted_idx"][idx : idx + 1, :] = 0  # 2.5 :849
                continue
            elif request.task_type.value == RequestType.PREEMPTED.value:  # 2.5 :851-870
                # flagged for the save: post_process copies it into last_preempted_idx (:610) and
                # save_output sends the row as PREEMPTED_TOKEN_ID (-9); the slot stops
                si["preempted_idx"][idx : idx + 1, :] = 1
                si["block_tables"][idx : idx + 1, :] = -1
                si["stop_flags"][idx : idx + 1] = True
                si["seq_lens_this_time_buffer"][idx : idx + 1] = 0
                si["seq_lens_decoder"][idx : idx + 1] = 0
                si["seq_lens_encoder"][idx : idx + 1] = 0
                si["is_block_step"][idx : idx + 1] = False
                self.prompt_logprobs_reqs.pop(request.request_id, None)
                self.in_progress_prompt_logprobs.pop(request.request_id, None)
                self.forward_batch_reqs_list[idx] = None
                continue
            else:
                raise NotImplementedError(f"{request.task_type} tasks are not modelled by the replica")

            assert len(request.eos_token_ids) == self.model_config.eos_tokens_lens
            si["eos_token_id"][:] = np.array(request.eos_token_ids, dtype="int64").reshape(-1, 1)
            si["top_p"][idx : idx + 1] = request.get("top_p", 0.7)
            si["top_k"][idx : idx + 1] = request.get("top_k", 0)
            si["top_k_list"][idx] = request.get("top_k", 0)
            si["temperature"][idx : idx + 1] = request.get("temperature", 0.95)
            si["temp_scaled_logprobs"][idx : idx + 1] = request.get("temp_scaled_logprobs", False)
            si["top_p_normalized_logprobs"][idx : idx + 1] = request.get("top_p_normalized_logprobs", False)
            si["min_dec_len"][idx : idx + 1] = request.get("min_tokens", 1)
            si["max_dec_len"][idx : idx + 1] = request.get("max_tokens", self.model_config.max_model_len)
            si["first_token_ids"][idx : idx + 1] = si["input_ids"][idx : idx + 1, :1]
            if request.get("seed") is not None:  # 2.5 :897-898
                si["infer_seed"][idx : idx + 1] = request.get("seed")
            si["bad_tokens_len"][idx : idx + 1] = 1
            si["bad_tokens"][idx : idx + 1, :] = np.array([-1], dtype="int64")
            if request.get("stop_token_ids") is not None and request.get("stop_seqs_len") is not None:
                stop_seqs_num = len(request.get("stop_seqs_len"))
                for _ in range(stop_seqs_num, self.model_config.max_stop_seqs_num):
                    request.sampling_params.stop_seqs_len.append(0)
                si["stop_seqs_len"][idx : idx + 1, :] = np.array(request.sampling_params.stop_seqs_len, dtype="int32")
                si["stop_seqs"][idx : idx + 1, :stop_seqs_num, : len(request.get("stop_token_ids")[0])] = np.array(
                    request.get("stop_token_ids"), dtype="int64"
                )
            else:
                si["stop_seqs_len"][idx : idx + 1, :] = 0
            self.sampler.apply_logits_processor(idx, None, [])

        if has_prefill_task or has_decode_task:
            set_stop(si["not_need_stop"], True)
        si["seq_lens_this_time"] = si["seq_lens_this_time_buffer"][:num_running_requests]

    # ---- one step -----------------------------------------------------------------------------

    def _prepare_inputs(self, last_token_num=-1, is_dummy_or_profile_run=False):
        """Returns ``token_num_event`` (covers the pinned token-count copies)."""
        si = self.share_inputs
        recover_decode_task(
            si["stop_flags"],
            si["seq_lens_this_time"],
            si["seq_lens_encoder"],
            si["seq_lens_decoder"],
            si["step_seq_lens_decoder"],
            si["block_tables"],
            si["is_block_step"],
            None,
            None,
            None,
            self.cache_config.block_size,
            0,
        )
        logprobs_reqs = [
            req
            for req in self.forward_batch_reqs_list
            if req is not None and req.sampling_params is not None and req.sampling_params.logprobs is not None
        ]
        if len(logprobs_reqs):
            self.max_logprobs = max(
                self.ori_vocab_size if req.sampling_params.logprobs < 0 else req.sampling_params.logprobs
                for req in logprobs_reqs
            )
            self.temp_scaled_logprobs = any(req.sampling_params.temp_scaled_logprobs for req in logprobs_reqs)
            self.top_p_normalized_logprobs = any(
                req.sampling_params.top_p_normalized_logprobs for req in logprobs_reqs
            )
        elif self.enable_logprob:
            self.max_logprobs = None

        copy_async(si["seq_lens_this_time_cpu"], si["seq_lens_this_time"], "_prepare_inputs.seq_lens_this_time_cpu")
        copy_async(si["is_block_step_cpu"], si["is_block_step"], "_prepare_inputs.is_block_step_cpu")
        # spelled as in FastDeploy (:1332-1341): routed to the copy backend by paddle_device.routed()
        token_num_event = paddle.device.cuda.create_event()
        token_num_event.record()
        if is_dummy_or_profile_run or (not self.enable_overlap_schedule) or self.exist_prefill() or last_token_num <= 0:
            token_num_event.synchronize()
            token_num = si["seq_lens_this_time_cpu"].numpy().sum().item()
        else:
            token_num = last_token_num
        ids_remove_padding, batch_id_per_token, cu_seqlens_q, cu_seqlens_k, _, _ = pre_process(
            token_num,
            si["input_ids"],
            si["seq_lens_this_time"],
            self.speculative_decoding,
            None,
            si["seq_lens_encoder"],
            si["seq_lens_decoder"],
        )
        si["ids_remove_padding"].copy_(ids_remove_padding, False)
        si["batch_id_per_token"][:] = -1
        si["batch_id_per_token"].copy_(batch_id_per_token, False)
        si["cu_seqlens_q"].copy_(cu_seqlens_q, False)
        si["cu_seqlens_k"].copy_(cu_seqlens_k, False)
        self.initialize_forward_meta(is_dummy_or_profile_run=is_dummy_or_profile_run)
        self.sampling_metadata = SamplingMetadata(
            temperature=si["temperature"],
            top_p=si["top_p"],
            top_k=si["top_k"],
            top_k_list=si["top_k_list"],
            min_p=si["min_p"],
            min_p_list=si["min_p_list"],
            seed=si["infer_seed"],
            step_idx=si["step_idx"],
            pre_token_ids=si["pre_ids"],
            prompt_ids=si["prompt_ids"],
            prompt_lens=si["prompt_lens"],
            frequency_penalties=si["frequency_score"],
            presence_penalties=si["presence_score"],
            repetition_penalties=si["penalty_score"],
            min_dec_lens=si["min_dec_len"],
            bad_words_token_ids=si["bad_tokens"],
            eos_token_ids=si["eos_token_id"],
            max_num_logprobs=self.max_logprobs,
            enable_early_stop=self.enable_early_stop,
            stop_flags=si["stop_flags"],
            temp_scaled_logprobs_flag=self.temp_scaled_logprobs,
            top_p_normalized_logprobs_flag=self.top_p_normalized_logprobs,
            temp_scaled_logprobs=si["temp_scaled_logprobs"],
            top_p_normalized_logprobs=si["top_p_normalized_logprobs"],
            logits_processors=si["logits_processors"],
            share_inputs=si,
        )
        return token_num_event

    def initialize_forward_meta(self, is_dummy_or_profile_run=False):
        si = self.share_inputs
        # What the attention metadata encodes on the device (no host read in FastDeploy).
        with device_code():
            cu = si["cu_seqlens_q"].numpy().reshape(-1)
            dec = si["seq_lens_decoder"].numpy().reshape(-1)
            this_time = si["seq_lens_this_time"].numpy().reshape(-1)
        positions = [dec[b] + np.arange(n) for b, n in enumerate(this_time) if n > 0]
        flat = np.concatenate(positions).astype(np.int64) if positions else np.zeros([0], dtype=np.int64)
        # Padding rows of an over-estimated token count (overlap schedule) sit at position 0.
        tail = si["ids_remove_padding"].shape[0] - flat.shape[0]
        flat = np.concatenate([flat, np.zeros([tail], dtype=np.int64)])
        assert cu[-1] + tail == si["ids_remove_padding"].shape[0]
        self.forward_meta = ForwardMeta(
            ids_remove_padding=si["ids_remove_padding"],
            seq_lens_encoder=si["seq_lens_encoder"],
            seq_lens_decoder=si["seq_lens_decoder"],
            seq_lens_this_time=si["seq_lens_this_time"],
            batch_id_per_token=si["batch_id_per_token"],
            cu_seqlens_q=si["cu_seqlens_q"],
            cu_seqlens_k=si["cu_seqlens_k"],
            block_tables=si["block_tables"],
            position_ids=as_device(paddle.to_tensor(flat)),
            is_dummy_or_profile_run=is_dummy_or_profile_run,
        )

    def execute_model(self, model_forward_batch: Optional[List[Request]] = None, num_running_requests: int = None):
        if not self.enable_overlap_schedule:
            self.execute_model_normal(model_forward_batch, num_running_requests)
        else:
            self.execute_model_overlap(model_forward_batch, num_running_requests)

    def execute_model_normal(self, model_forward_batch=None, num_running_requests: int = None) -> None:
        model_output, p_done_idxs, token_num_event = self._preprocess_and_execute_model(
            model_forward_batch, num_running_requests
        )
        model_output_data, sampler_output, post_process_event, _ = self._postprocess(
            model_output, p_done_idxs, token_num_event, model_forward_batch, num_running_requests
        )
        if model_output_data is not None and not self.speculative_decoding:
            self._save_model_output(model_output_data, sampler_output, post_process_event)

    def execute_model_overlap(self, model_forward_batch=None, num_running_requests: int = None) -> None:
        # preprocess and execute model (current batch)
        model_output, p_done_idxs, token_num_event = self._preprocess_and_execute_model(
            model_forward_batch, num_running_requests, self.last_token_num
        )
        # save output (last batch)
        if self.last_model_output_data is not None and not self.speculative_decoding:
            self._save_model_output(self.last_model_output_data, self.last_sampler_output, self.last_post_process_event)
        # postprocess (current batch)
        model_output_data, sampler_output, post_process_event, token_num = self._postprocess(
            model_output, p_done_idxs, token_num_event, model_forward_batch, num_running_requests
        )
        self.last_model_output_data = model_output_data
        self.last_sampler_output = sampler_output
        self.last_post_process_event = post_process_event
        self.last_token_num = token_num

    def _preprocess_and_execute_model(self, model_forward_batch=None, num_running_requests: int = None, last_token_num: int = -1):
        p_done_idxs: list = []
        token_num_event = self._prepare_inputs(last_token_num)
        self.sampler.pre_process(p_done_idxs)
        model_output = self.model(ids_remove_padding=self.forward_meta.ids_remove_padding, forward_meta=self.forward_meta)
        return model_output, p_done_idxs, token_num_event

    def _postprocess(self, model_output, p_done_idxs, token_num_event, model_forward_batch=None, num_running_requests: int = None):
        if not self.not_need_stop():
            return None, None, None, -1
        backend = current_backend()
        si = self.share_inputs
        token_num_event.synchronize()  # FastDeploy :2365-2371
        if (not self.enable_overlap_schedule) or self.exist_prefill():
            token_num = -1
        else:
            token_num = (
                si["seq_lens_this_time_cpu"].numpy().sum().item()
                + si["is_block_step_cpu"].numpy().sum().item()
            )
        prompt_logprobs_list = self._get_prompt_logprobs_list(model_output)
        hidden_states = rebuild_padding(
            model_output,
            si["cu_seqlens_q"],
            si["seq_lens_this_time"],
            si["seq_lens_decoder"],
            si["seq_lens_encoder"],
            None,
            None,
        )
        logits = self.model.compute_logits(hidden_states)
        set_value_by_flags_and_idx(
            si["pre_ids"],
            si["input_ids"],
            si["seq_lens_this_time"],
            si["seq_lens_encoder"],
            si["seq_lens_decoder"],
            si["step_idx"],
            si["stop_flags"],
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
        model_output_data = ModelOutputData(
            next_tokens=si["next_tokens"],
            stop_flags=si["stop_flags"],
            step_idx=si["step_idx"],
            max_dec_len=si["max_dec_len"],
            pre_ids=si["pre_ids"],
            seq_lens_this_time=si["seq_lens_this_time"],
            eos_token_id=si["eos_token_id"],
            not_need_stop=si["not_need_stop"],
            not_need_stop_device=si["not_need_stop_device"],
            input_ids=si["input_ids"],
            seq_lens_encoder=si["seq_lens_encoder"],
            seq_lens_decoder=si["seq_lens_decoder"],
            is_block_step=si["is_block_step"],
            full_hidden_states=model_output,
            msg_queue_id=self.parallel_config.msg_queue_id,
            mp_rank=self.parallel_config.tensor_parallel_rank,
            use_ep=self.parallel_config.use_ep,
            draft_tokens=None,
            actual_draft_token_num=None,
            accept_tokens=None,
            accept_num=None,
            stop_token_ids=si["stop_seqs"],
            stop_seqs_len=si["stop_seqs_len"],
            min_tokens=si["min_dec_len"],
            prompt_lens=si["prompt_lens"],
            mask_rollback=si["mask_rollback"],
            prompt_logprobs_list=prompt_logprobs_list,
            index_to_batch_id=si["index_to_batch_id"],
            enable_pd_reorder=getattr(si, "enable_pd_reorder", False),
        )
        post_process(
            sampler_or_pooler_output=sampler_output,
            model_output=model_output_data,
            share_inputs=si,
            sampling_metadata=self.sampling_metadata,
            block_size=self.cache_config.block_size,
            save_each_rank=self.parallel_config.use_ep,
            speculative_decoding=self.speculative_decoding,
            skip_save_output=False,
            async_output_queue=self.async_output_queue,
            think_end_id=self.model_config.think_end_id,
            splitwise_role_is_decode=self.scheduler_config.splitwise_role == "decode",
            enable_entropy=self.enable_entropy and self.parallel_config.tensor_parallel_rank == 0,
            routing_replay_manager=self.routing_replay_manager,
        )
        si["infer_seed"].add_(self.infer_seed_increment)
        si["infer_seed"][:] %= self.MAX_INFER_SEED
        if not envs.ENABLE_V1_KVCACHE_SCHEDULER:
            step_cuda(si, self.cache_config.block_size, self.cache_config.enc_dec_block_num, self.speculative_config)

        post_process_event = None
        if not self.speculative_decoding:
            copy_async(si["sampled_token_ids"], sampler_output.sampled_token_ids, "_postprocess.sampled_token_ids")
            copy_async(si["not_need_stop"], si["not_need_stop_device"], "_postprocess.not_need_stop")
            post_process_event = RecordedEvent()
            post_process_event.record()
        self.exist_prefill_flag = False
        return model_output_data, sampler_output, post_process_event, token_num

    def _save_model_output(self, model_output_data, sampler_output, post_process_event):
        post_process_event.synchronize()
        save_output_normal(
            model_output=model_output_data,
            sampler_output=sampler_output,
            share_inputs=self.share_inputs,
            async_output_queue=self.async_output_queue,
            save_each_rank=self.parallel_config.use_ep,
        )

    def not_need_stop(self) -> bool:
        """Stop decoding if the tensor meets the termination condition."""
        return get_stop(self.share_inputs["not_need_stop"]).item()

    def _get_prompt_logprobs_list(self, hidden_states: paddle.Tensor) -> list:
        logprobs_mode = self.model_config.logprobs_mode
        prompt_logprobs_list: list = self.scheduler_config.max_num_seqs * [None]
        completed_prefill_reqs: list = []
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
            batch_id = self.share_inputs.get_index_by_batch_id(request.idx)
            if num_tokens <= num_remaining_tokens:
                num_logits = num_tokens
            else:
                num_logits = num_remaining_tokens
                completed_prefill_reqs.append(request)
                prompt_logprobs_list[batch_id] = logprobs_tensors
            if num_logits <= 0:
                continue
            offset = int(blocking_d2h(self.share_inputs["cu_seqlens_q"][batch_id], "_get_prompt_logprobs_list.offset"))
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
            paddle.device.synchronize()
            chunk_slice = slice(start_idx, start_idx + num_logits)
            logprobs_tensors.logprob_token_ids[chunk_slice].copy_(token_ids, False)
            logprobs_tensors.logprobs[chunk_slice].copy_(logprobs, False)
            logprobs_tensors.selected_token_ranks[chunk_slice].copy_(ranks, False)
        for req in completed_prefill_reqs:
            del self.prompt_logprobs_reqs[req.request_id]
            del self.in_progress_prompt_logprobs[req.request_id]
        return prompt_logprobs_list
