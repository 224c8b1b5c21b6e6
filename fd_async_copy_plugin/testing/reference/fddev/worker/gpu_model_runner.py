"""Mirrors ``fastdeploy/worker/gpu_model_runner.py`` (develop) at the patch points; V1 scheduler
only. A delta over the 2.5 replica; what develop changed at the census sites:

- no ``not_need_stop()`` and no ``_preprocess_and_execute_model`` (#6356): the worker loop runs
  ``execute_model`` every iteration (worker_process.py:608-611 ``hasattr`` guard) and an empty
  batch returns early (``_preprocess``, :2182-2184);
- ``insert_tasks_v1`` (:721) writes device values with ``async_set_value`` (no host read): the
  request's seed into the **device** ``infer_seed`` (:977), and a DECODE task no longer reads
  ``is_block_step`` (I1 gone, :911-925); the pinned ``not_need_stop`` is no longer set;
- ``_prepare_inputs(cached_token_num, cached_real_bsz)`` (:1150): async copies of
  ``seq_lens_this_time`` / ``is_block_step`` into pinned buffers, ``token_num_event``, and
  ``_resolve_current_launch_token_num`` (:308-331) waits on it (``token_num``, :328) unless the
  overlap schedule has a cached count (decode-only batch);
- ``execute_model_normal`` (:2092): ``_preprocess``, ``_execute``, ``real_bsz`` from the pinned
  ``seq_lens_this_time_cpu``, ``_postprocess``, then ``post_process_event.synchronize()`` (:2113)
  and ``_save_model_output``;
- ``execute_model_overlap`` (:2116): forward N enqueued, then the previous step's
  ``_cached_post_process_event.synchronize()`` (:2129) and save, then ``token_num_event.synchronize()``
  (:2138: the copies were recorded before forward N), ``_predict_next_launch_token_num`` (:333-350);
- ``_postprocess`` (:2221) ends with ``post_process_event``: the async copy of ``sampled_token_ids``
  (:2459) only (no copy of ``not_need_stop_device``), then record (:2465); ``infer_seed`` is
  advanced on the device (:2484-2487, increment :210-212 on the device);
- ``_save_model_output(model_output_data, sampler_output)`` (:2511): ``save_output_normal`` only;
- ``_get_prompt_logprobs_list`` (:3078) with ``paddle.device.synchronize()`` (:3136), as in 2.5.

Every CUDA event/copy goes through the copy backend, as in the 2.5 replica (``paddle_device.py``).
"""

from __future__ import annotations

import os
from typing import List, Optional

import numpy as np
import paddle

from .. import envs
from ...placement import as_device, blocking_d2h, copy_async, device_code
from ...tiny_model import TinyModel
from ...zmq_sink import AsyncOutputThread
from ...copy_backend import current as current_backend
from ..engine.request import Request, RequestType
from ..model_executor.forward_meta import ForwardMeta
from ..model_executor.layers.sample.meta_data import SamplingMetadata
from ..model_executor.layers.sample.sampler import Sampler, SpeculativeSampler
from ..model_executor.ops.gpu import recover_decode_task, set_value_by_flags_and_idx
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
        self.increment_value = 4  # develop: (num_speculative_tokens + 1) * 4 when speculating (not modelled)
        self.infer_seed_increment = as_device(paddle.full(  # on the device (:210-212)
            shape=[self.scheduler_config.max_num_seqs, 1], fill_value=self.increment_value, dtype="int64"
        ))

        # Overlap schedule (:269-279): what the previous step left to save, and the cached count.
        self._cached_model_output_data = None
        self._cached_sampler_output = None
        self._cached_post_process_event = None
        self._cached_launch_token_num = -1
        self._cached_real_bsz = -1
        self.current_launch_token_num = 0

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
        """A host flag set when a prefill is inserted, cleared after post-processing (:290-295)."""
        if envs.ENABLE_V1_KVCACHE_SCHEDULER:
            return self.exist_prefill_flag
        raise NotImplementedError("the develop replica models the V1 scheduler only")

    def _resolve_current_launch_token_num(self, cached_token_num, cached_real_bsz, token_num_event,
                                          is_dummy_or_profile_run):
        """The batch's token count and real batch size (:308-331): the cached prediction under the
        overlap schedule for a decode-only batch, else after waiting on ``token_num_event``."""
        if (
            is_dummy_or_profile_run
            or (not self.enable_overlap_schedule)
            or self.exist_prefill()
            or cached_token_num <= 0
            or cached_real_bsz <= 0
        ):
            token_num_event.synchronize()
            seq_lens_this_time_cpu = self.share_inputs["seq_lens_this_time_cpu"].numpy()
            return seq_lens_this_time_cpu.sum().item(), (seq_lens_this_time_cpu > 0).sum().item()
        return cached_token_num, cached_real_bsz

    def _predict_next_launch_token_num(self):
        """The next batch's token count and real batch size (:333-350), -1 while a prefill exists."""
        if self.exist_prefill():
            return -1, -1
        seq_lens_this_time_cpu = self.share_inputs["seq_lens_this_time_cpu"].numpy()
        is_block_step_cpu = self.share_inputs["is_block_step_cpu"].numpy()
        next_real_bsz = (seq_lens_this_time_cpu > 0).sum().item() + (is_block_step_cpu > 0).sum().item()
        token_num_one_step = 1  # (num_speculative_tokens + 1) when speculating: not modelled
        return next_real_bsz * token_num_one_step, next_real_bsz

    def load_model(self) -> None:
        mc = self.model_config
        self.model = TinyModel(mc.vocab_size, mc.max_model_len, mc.hidden_size, mc.model_seed,
                               rows_dependent_gemm=mc.rows_dependent_gemm, moe_experts=mc.moe_experts)

    # ---- task insertion ------------------------------------------------------------------------

    def insert_tasks_v1(self, req_dicts: List[Request], num_running_requests: int = None):
        si = self.share_inputs
        for request in req_dicts:
            idx = request.idx
            if request.task_type.value == RequestType.PREFILL.value:
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
            elif request.task_type.value == RequestType.DECODE.value:
                encoder_block_num = len(request.block_tables)
                si["encoder_block_lens"][idx : idx + 1] = encoder_block_num
                si["block_tables"][idx : idx + 1, :] = -1
                si["block_tables"][idx : idx + 1, :encoder_block_num] = np.array(request.block_tables, dtype="int32")
                continue  # develop reads no is_block_step here (#6356, :911-925)
            else:
                raise NotImplementedError("preemption is not modelled by the replica")

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
            if request.get("seed") is not None:  # async_set_value into the device seed (:977)
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

        si["seq_lens_this_time"] = si["seq_lens_this_time_buffer"][:num_running_requests]

    # ---- one step -----------------------------------------------------------------------------

    def _prepare_inputs(self, cached_token_num=-1, cached_real_bsz=-1, is_dummy_or_profile_run=False):
        """Returns ``(token_num, token_num_event)``; the event covers the pinned token-count copies."""
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
        # spelled as in FastDeploy (:1198-1202): routed to the copy backend by paddle_device.routed()
        token_num_event = paddle.device.cuda.create_event()
        token_num_event.record()
        token_num, real_bsz = self._resolve_current_launch_token_num(
            cached_token_num, cached_real_bsz, token_num_event, is_dummy_or_profile_run
        )
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
        self.forward_meta.real_bsz = real_bsz
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
        return token_num, token_num_event

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
        model_inputs, p_done_idxs, _ = self._preprocess(model_forward_batch, num_running_requests)
        model_output = self._execute(model_inputs)
        real_bsz = (self.share_inputs["seq_lens_this_time_cpu"].numpy() > 0).sum().item()
        if model_output is None or real_bsz <= 0:
            return
        model_output_data, sampler_output, post_process_event = self._postprocess(
            model_output, p_done_idxs, model_forward_batch, num_running_requests, real_bsz
        )
        if model_output_data is not None:
            # synchronizes the async DtoH copies of sampled_token_ids (:2113)
            current_backend().wait(post_process_event, "execute_model_normal.post_process_event")
            self._save_model_output(model_output_data, sampler_output)

    def execute_model_overlap(self, model_forward_batch=None, num_running_requests: int = None) -> None:
        # preprocess and execute model (current batch)
        model_inputs, p_done_idxs, token_num_event = self._preprocess(
            model_forward_batch, num_running_requests, self._cached_launch_token_num, self._cached_real_bsz
        )
        model_output = self._execute(model_inputs)
        # save output (last batch): the previous step's event (:2129)
        if self._cached_model_output_data is not None:
            current_backend().wait(self._cached_post_process_event, "execute_model_overlap.post_process_event")
            self._save_model_output(self._cached_model_output_data, self._cached_sampler_output)
        # postprocess (current batch): the token-count copies, recorded before forward N (:2138)
        token_num_event.synchronize()
        next_launch_token_num, next_real_bsz = self._predict_next_launch_token_num()
        real_bsz = (self.share_inputs["seq_lens_this_time_cpu"].numpy() > 0).sum().item()
        if real_bsz > 0 and model_output is not None:
            model_output_data, sampler_output, post_process_event = self._postprocess(
                model_output, p_done_idxs, model_forward_batch, num_running_requests, real_bsz
            )
            self._cached_model_output_data = model_output_data
            self._cached_sampler_output = sampler_output
            self._cached_post_process_event = post_process_event
        else:
            self._cached_model_output_data = None
            self._cached_sampler_output = None
            self._cached_post_process_event = None
        self._cached_launch_token_num = next_launch_token_num
        self._cached_real_bsz = next_real_bsz

    def _preprocess(self, model_forward_batch=None, num_running_requests: int = None, cached_token_num: int = -1,
                    cached_real_bsz: int = -1):
        current_launch_token_num, token_num_event = self._prepare_inputs(cached_token_num, cached_real_bsz)
        self.current_launch_token_num = current_launch_token_num
        if current_launch_token_num == 0:  # an idle worker (TP; EP is not modelled), :2182-2184
            return None, None, token_num_event
        p_done_idxs: list = []
        self.sampler.pre_process(p_done_idxs)
        model_inputs = {"ids_remove_padding": self.share_inputs["ids_remove_padding"]}
        return model_inputs, p_done_idxs, token_num_event

    def _execute(self, model_inputs):
        if model_inputs is not None and len(model_inputs) > 0:
            return self.model(ids_remove_padding=model_inputs["ids_remove_padding"], forward_meta=self.forward_meta)
        return None

    def _postprocess(self, model_output, p_done_idxs, model_forward_batch=None, num_running_requests: int = None,
                     real_bsz: int = 0):
        si = self.share_inputs
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

        # 5.1 Async cpy (:2447-2465): only sampled_token_ids (develop copies no flag to the host)
        copy_async(si["sampled_token_ids"], sampler_output.sampled_token_ids, "_postprocess.sampled_token_ids")
        post_process_event = current_backend().record("post_process_event")
        self.exist_prefill_flag = False
        return model_output_data, sampler_output, post_process_event

    def _save_model_output(self, model_output_data, sampler_output):
        save_output_normal(
            model_output=model_output_data,
            sampler_output=sampler_output,
            share_inputs=self.share_inputs,
            async_output_queue=self.async_output_queue,
            save_each_rank=self.parallel_config.use_ep,
        )

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
