"""Mirrors ``fastdeploy/model_executor/layers/sample/sampler.py`` (develop) at the patch points.

``Sampler.gather_logprobs`` is 2.5's after #6362 (develop sampler.py:493-498: pinned buffers
filled by non-blocking ``copy_(x, False)``, covered by ``post_process_event``). What changed at the
census sites is the seed the sampling op gets: ``sampling_metadata.seed`` is develop's **device**
``infer_seed`` (#6765; #6668 had made its copy non-blocking first), so no host wait T here.
"""

from __future__ import annotations

from typing import Any, List, Optional

import paddle
from paddle import nn

# Not patch points, unchanged in 2.5 and develop: guided decoding and the speculative/MTP gather_logprobs body.
from .....fd24.model_executor.layers.sample.sampler import GuidedDecoding, speculative_gather_logprobs
from .....placement import as_device, blocking_d2h, copy_, cpu, pin_memory
from .....sampling_math import log_softmax, top_p_renormalized_logprobs
from ....platforms import current_platform
from ....worker.output import LogprobsTensors, SamplerOutput
from .logprobs import batched_count_greater_than
from .ops import top_k_top_p_sampling
from .meta_data import SamplingMetadata


class Sampler(nn.Layer):
    """Sampler for normal generation."""

    def __init__(self, fd_config=None, logprobs_mode: str = "raw_logprobs"):
        super().__init__()
        if current_platform.is_cuda():
            self.forward = self.forward_cuda
        else:
            raise NotImplementedError
        self.guided_decoding = GuidedDecoding(fd_config)
        self.logprobs_mode = fd_config.model_config.logprobs_mode if fd_config is not None else logprobs_mode

    def set_reasoning_parser(self, reasoning_parser=None):
        self.guided_decoding.apply_reasoning_parser(reasoning_parser)

    def apply_logits_processor(self, ids: int, future=None, prefill_tokens: List[int] = []):
        self.guided_decoding.add_logits_processor(ids, future, prefill_tokens)

    def pre_process(self, prefill_done_idxs: List[int] = []):
        self.guided_decoding.pre_process(prefill_done_idxs)

    def post_process(self, next_tokens: paddle.Tensor):
        self.guided_decoding.update_output_tokens(next_tokens)

    def compute_logprobs(
        self,
        logits: paddle.Tensor,
        sampling_metadata: Optional[SamplingMetadata] = None,
    ) -> paddle.Tensor:
        if sampling_metadata is None:
            return as_device(log_softmax(logits))
        last_logits = logits
        real_bsz = last_logits.shape[0]
        if sampling_metadata.temp_scaled_logprobs is not None and sampling_metadata.temp_scaled_logprobs_flag:
            temperature = sampling_metadata.temperature[:real_bsz]
            temp_temperature = paddle.where(
                sampling_metadata.temp_scaled_logprobs[:real_bsz], temperature, paddle.ones_like(temperature)
            )
            last_logits = last_logits / temp_temperature
        last_logprobs = log_softmax(last_logits)
        share_inputs = sampling_metadata.share_inputs
        if (
            sampling_metadata.top_p_normalized_logprobs is not None
            and share_inputs is not None
            and sampling_metadata.top_p_normalized_logprobs_flag
        ):
            seq_lens_sum = (
                share_inputs["seq_lens_this_time"].reshape([-1, 1])[:real_bsz]
                + share_inputs["seq_lens_encoder"].reshape([-1, 1])[:real_bsz]
                + share_inputs["seq_lens_decoder"].reshape([-1, 1])[:real_bsz]
            )
            top_p_req_mask = paddle.logical_and(
                sampling_metadata.top_p_normalized_logprobs[:real_bsz], seq_lens_sum > 0
            )
            real_req_top_p = sampling_metadata.top_p[:real_bsz]
            top_p_req_mask = paddle.logical_and(top_p_req_mask, real_req_top_p != 1.0)
            if bool(blocking_d2h(top_p_req_mask.any(), "compute_logprobs.top_p_req_mask.any")):
                probs = paddle.nn.functional.softmax(last_logits, axis=-1)
                last_logprobs = paddle.where(
                    top_p_req_mask, top_p_renormalized_logprobs(probs, real_req_top_p), last_logprobs
                )
        return as_device(last_logprobs)

    def gather_logprobs(
        self,
        logprobs: paddle.Tensor,
        num_logprobs: int,
        token_ids: paddle.Tensor,
    ) -> LogprobsTensors:
        """Top-k ids/logprobs and the token's rank, copied without blocking into new pinned
        buffers on cuda (valid only after an event recorded later has been waited on)."""
        assert token_ids.dtype == paddle.int64
        logprobs.clip_(min=paddle.finfo(logprobs.dtype).min)
        if len(token_ids.shape) < len(logprobs.shape):
            token_ids = token_ids.unsqueeze(-1)
        token_logprobs = paddle.take_along_axis(logprobs, token_ids, axis=-1)
        token_ranks = batched_count_greater_than(logprobs, token_logprobs)
        if num_logprobs >= 1:
            topk_logprobs, topk_indices = paddle.topk(logprobs, num_logprobs, axis=-1)
            indices = paddle.concat([token_ids, topk_indices], axis=1)
            top_logprobs = paddle.concat([token_logprobs, topk_logprobs], axis=1)
        else:
            indices = token_ids
            top_logprobs = token_logprobs
        if current_platform.is_cuda():  # FD: x_cpu = paddle.empty_like(...).pin_memory(); x_cpu.copy_(x, False)
            site = "Sampler.gather_logprobs"
            indices_cpu = pin_memory(paddle.empty_like(indices, device="cpu"), site + ".logprob_token_ids")
            top_logprobs_cpu = pin_memory(paddle.empty_like(top_logprobs, device="cpu"), site + ".logprobs")
            token_ranks_cpu = pin_memory(paddle.empty_like(token_ranks, device="cpu"), site + ".selected_token_ranks")
            copy_(indices_cpu, indices, site + ".logprob_token_ids")
            copy_(top_logprobs_cpu, top_logprobs, site + ".logprobs")
            copy_(token_ranks_cpu, token_ranks, site + ".selected_token_ranks")
        else:
            indices_cpu = cpu(indices, "Sampler.gather_logprobs.logprob_token_ids")
            top_logprobs_cpu = cpu(top_logprobs, "Sampler.gather_logprobs.logprobs")
            token_ranks_cpu = cpu(token_ranks, "Sampler.gather_logprobs.selected_token_ranks")
        return LogprobsTensors(indices_cpu, top_logprobs_cpu, token_ranks_cpu)

    def forward_cuda(
        self,
        logits: paddle.Tensor,
        sampling_metadata: SamplingMetadata,
        p_done_idxs: List[int] = [],
    ) -> SamplerOutput:
        logits = self.guided_decoding.apply_token_mask(logits, p_done_idxs)
        num_logprobs = sampling_metadata.max_num_logprobs
        if num_logprobs is not None:
            if self.logprobs_mode == "raw_logprobs":
                raw_logprobs = self.compute_logprobs(logits, sampling_metadata)
            elif self.logprobs_mode == "raw_logits":
                raw_logprobs = logits.clone()
        for proc in sampling_metadata.logits_processors or []:
            logits = proc.apply(logits)
        # apply_penalty_multi_scores: penalties are not modelled (identity).
        if num_logprobs is not None:
            if self.logprobs_mode == "processed_logprobs":
                raw_logprobs = self.compute_logprobs(logits, sampling_metadata)
            elif self.logprobs_mode == "processed_logits":
                raw_logprobs = logits.clone()
        probs = paddle.nn.functional.softmax(logits)
        _, next_tokens = top_k_top_p_sampling(
            probs,
            sampling_metadata.top_p,
            sampling_metadata.top_k,
            sampling_metadata.top_k_list,
            topp_seed=sampling_metadata.seed,
        )
        logprobs_tensors = (
            None if num_logprobs is None else self.gather_logprobs(raw_logprobs, num_logprobs, token_ids=next_tokens)
        )
        return SamplerOutput(sampled_token_ids=next_tokens, logprobs_tensors=logprobs_tensors, logits=logits)


class SpeculativeSampler(nn.Layer):
    """Sampler for speculative decoding. Only ``gather_logprobs`` is modelled (device outputs)."""

    def __init__(self, fd_config):
        super().__init__()
        self.forward = self.forward_cuda
        self.logprobs_mode = fd_config.model_config.logprobs_mode

    def pre_process(self, skip_idx_list: List[int] = []):
        pass

    def post_process(self, next_tokens: paddle.Tensor, skip_idx_list: List[int] = []):
        pass

    def apply_logits_processor(self, ids: int, future: Optional[Any] = None, prefill_tokens: List[int] = []):
        pass

    def gather_logprobs(self, logprobs: paddle.Tensor, num_logprobs: int, token_ids: paddle.Tensor) -> LogprobsTensors:
        return LogprobsTensors(*speculative_gather_logprobs(logprobs, num_logprobs, token_ids))

    def forward_cuda(self, logits, sampling_metadata, max_model_len, share_inputs, *args):
        raise NotImplementedError("speculative decoding is not modelled by the replica")


class MTPSampler(nn.Layer):
    """Sampler of the MTP draft model. Only ``gather_logprobs`` is modelled (device outputs)."""

    def __init__(self, fd_config):
        super().__init__()
        self.forward = self.forward_cuda
        self.logprobs_mode = fd_config.model_config.logprobs_mode

    def gather_logprobs(self, logprobs: paddle.Tensor, num_logprobs: int, token_ids: paddle.Tensor) -> LogprobsTensors:
        return LogprobsTensors(*speculative_gather_logprobs(logprobs, num_logprobs, token_ids))

    def forward_cuda(self, logits, sampling_metadata, max_model_len, share_inputs, *args):
        raise NotImplementedError("MTP is not modelled by the replica")
