"""Mirrors ``fastdeploy/model_executor/layers/sample/sampler.py`` (2.4) at the patch points:

- ``Sampler`` (:462): ``__init__`` binds ``self.forward = self.forward_cuda`` on cuda (:467-486),
  ``compute_logprobs`` (:514), ``gather_logprobs`` (:560-603, ending in three blocking ``.cpu()``
  copies - the copies #6362 makes asynchronous), ``forward_cuda`` (:605).
- ``SpeculativeSampler`` (:734) and ``MTPSampler`` (:1109) with their own ``gather_logprobs``
  (:823, :1204) that return device tensors. Their ``forward_cuda`` is not modelled.

Sampling is greedy (argmax) and penalties/guided decoding/logits processors are identities, so
runs are deterministic; the logprob maths is FastDeploy's.
"""

from __future__ import annotations

from typing import Any, List, Optional

import paddle
from paddle import nn

from .....placement import as_device, blocking_d2h, cpu
from .....sampling_math import ban_bad_words, keep_sampling_mask, log_softmax, top_p_renormalized_logprobs
from ....platforms import current_platform
from ....worker.output import LogprobsTensors, SamplerOutput
from .logprobs import batched_count_greater_than
from .ops import top_k_top_p_sampling
from .meta_data import SamplingMetadata


class GuidedDecoding:
    """Guided decoding is off in the replica: every hook is a no-op."""

    def __init__(self, fd_config=None) -> None:
        # FastDeploy's GuidedDecoding keeps max_num_seqs (the plugin sizes its pinned ring from it).
        scheduler_config = getattr(fd_config, "scheduler_config", None)
        self.max_num_seqs: int = int(scheduler_config.max_num_seqs if scheduler_config is not None else 1)
        self.logits_processors = []

    def apply_reasoning_parser(self, reasoning_parser=None):
        pass

    def add_logits_processor(self, ids, future=None, prefill_tokens=[]):
        pass

    def apply_token_mask(self, logits: paddle.Tensor, prefill_done_idxs: List[int] = []):
        return logits

    def update_output_tokens(self, next_tokens: paddle.Tensor):
        pass

    def pre_process(self, prefill_done_idxs: List[int] = []):
        pass


def speculative_gather_logprobs(logprobs: paddle.Tensor, num_logprobs: int, token_ids: paddle.Tensor) -> tuple:
    """The body of ``SpeculativeSampler``/``MTPSampler.gather_logprobs`` (identical in both
    classes and in 2.4/2.5): ``(logprob_token_ids, logprobs, selected_token_ranks)``, all left on
    the device. Token ids are [N]; each class wraps the result in its root's ``LogprobsTensors``."""
    assert token_ids.dtype == paddle.int64
    token_ids = token_ids.unsqueeze(1)
    logprobs.clip_(min=paddle.finfo(logprobs.dtype).min)
    token_logprobs = paddle.take_along_axis(logprobs, token_ids, axis=-1)
    token_ranks = batched_count_greater_than(logprobs, token_logprobs)
    if num_logprobs >= 1:
        topk_logprobs, topk_indices = paddle.topk(logprobs, num_logprobs, axis=-1)
        indices = paddle.concat([token_ids, topk_indices], axis=1)
        top_logprobs = paddle.concat([token_logprobs, topk_logprobs], axis=1)
    else:
        indices = token_ids
        top_logprobs = token_logprobs
    indices, top_logprobs = as_device(indices), as_device(top_logprobs)
    return indices, top_logprobs, token_ranks


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
        temp_scaled_logprobs = sampling_metadata.temp_scaled_logprobs
        top_p_normalized_logprobs = sampling_metadata.top_p_normalized_logprobs
        share_inputs = sampling_metadata.share_inputs
        if temp_scaled_logprobs is not None and sampling_metadata.temp_scaled_logprobs_flag:
            real_bsz_temp_scaled = temp_scaled_logprobs[:real_bsz]
            temperature = sampling_metadata.temperature[:real_bsz]
            temp_temperature = paddle.where(real_bsz_temp_scaled, temperature, paddle.ones_like(temperature))
            last_logits = last_logits / temp_temperature

        last_logprobs = log_softmax(last_logits)
        top_p_logprob = None
        top_p_req_mask = None
        if (
            top_p_normalized_logprobs is not None
            and share_inputs is not None
            and sampling_metadata.top_p_normalized_logprobs_flag
        ):
            seq_lens_this_time = share_inputs["seq_lens_this_time"].reshape([-1, 1])[:real_bsz]
            seq_lens_encoder = share_inputs["seq_lens_encoder"].reshape([-1, 1])[:real_bsz]
            seq_lens_decoder = share_inputs["seq_lens_decoder"].reshape([-1, 1])[:real_bsz]
            real_req_mask = (seq_lens_this_time + seq_lens_encoder + seq_lens_decoder) > 0
            top_p_req_mask = paddle.logical_and(top_p_normalized_logprobs[:real_bsz], real_req_mask)
            real_req_top_p = sampling_metadata.top_p[:real_bsz]
            top_p_req_mask = paddle.logical_and(top_p_req_mask, real_req_top_p != 1.0)
            # ``if top_p_req_mask.any()`` reads a device bool on the host.
            if bool(blocking_d2h(top_p_req_mask.any(), "compute_logprobs.top_p_req_mask.any")):
                probs = paddle.nn.functional.softmax(last_logits, axis=-1)
                top_p_logprob = top_p_renormalized_logprobs(probs, real_req_top_p)
        if top_p_logprob is not None:
            last_logprobs = paddle.where(top_p_req_mask, top_p_logprob, last_logprobs)
        return as_device(last_logprobs)

    def gather_logprobs(
        self,
        logprobs: paddle.Tensor,
        num_logprobs: int,
        token_ids: paddle.Tensor,
    ) -> LogprobsTensors:
        """Top-k ids/logprobs (with the sampled or prompt token in column 0) and the token's rank.

        Returns host tensors: 2.4 ends with three blocking ``.cpu()`` copies.
        """
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
        indices = cpu(indices, "Sampler.gather_logprobs.logprob_token_ids")  # FD: indices.cpu()
        top_logprobs = cpu(top_logprobs, "Sampler.gather_logprobs.logprobs")
        token_ranks = cpu(token_ranks, "Sampler.gather_logprobs.selected_token_ranks")
        return LogprobsTensors(indices, top_logprobs, token_ranks)

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
        # apply_penalty_multi_scores: only its bad-words part is modelled (the other penalties are
        # an identity here); it reads the bad_words_token_ids slice _prepare_inputs made (S2's width).
        logits = ban_bad_words(logits, sampling_metadata.bad_words_token_ids)

        if num_logprobs is not None:
            if self.logprobs_mode == "processed_logprobs":
                raw_logprobs = self.compute_logprobs(logits, sampling_metadata)
            elif self.logprobs_mode == "processed_logits":
                raw_logprobs = logits.clone()

        probs = paddle.nn.functional.softmax(logits)

        sampling_mask = None
        logz_per_batch = None
        if sampling_metadata.keep_sampling_mask:
            sampling_mask, logz_per_batch = keep_sampling_mask(
                probs, sampling_metadata.top_p, sampling_metadata.top_k_list
            )

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
        return SamplerOutput(
            sampled_token_ids=next_tokens,
            logprobs_tensors=logprobs_tensors,
            logits=logits,
            sampling_mask=sampling_mask,
            logz_per_batch=logz_per_batch,
        )


class SpeculativeSampler(nn.Layer):
    """Sampler for speculative decoding. Only ``gather_logprobs`` is modelled (device outputs)."""

    def __init__(self, fd_config):
        super().__init__()
        if current_platform.is_cuda():
            self.forward = self.forward_cuda
        else:
            raise NotImplementedError
        self.logprobs_mode = fd_config.model_config.logprobs_mode
        self.speculative_verify_window = fd_config.speculative_config.verify_window
        self.speculative_max_candidate_len = fd_config.speculative_config.max_candidate_len
        self.speculative_benchmark_mode = fd_config.speculative_config.benchmark_mode

    def pre_process(self, skip_idx_list: List[int] = []):
        pass

    def set_reasoning_parser(self, reasoning_parser=None):
        pass

    def post_process(self, next_tokens: paddle.Tensor, skip_idx_list: List[int] = []):
        pass

    def apply_logits_processor(self, ids: int, future: Optional[Any] = None, prefill_tokens: List[int] = []):
        pass

    def compute_logprobs(self, logits: paddle.Tensor, sampling_metadata: Optional[SamplingMetadata] = None):
        return as_device(log_softmax(logits))

    def gather_logprobs(self, logprobs: paddle.Tensor, num_logprobs: int, token_ids: paddle.Tensor) -> LogprobsTensors:
        return LogprobsTensors(*speculative_gather_logprobs(logprobs, num_logprobs, token_ids))

    def forward_cuda(self, logits, sampling_metadata, max_model_len, share_inputs, *args):
        raise NotImplementedError("speculative decoding is not modelled by the replica")


class MTPSampler(nn.Layer):
    """Sampler of the MTP draft model. Only ``gather_logprobs`` is modelled (device outputs)."""

    def __init__(self, fd_config):
        super().__init__()
        if current_platform.is_cuda():
            self.forward = self.forward_cuda
        else:
            raise NotImplementedError
        self.logprobs_mode = fd_config.model_config.logprobs_mode
        self.enable_draft_logprob = fd_config.speculative_config.enable_draft_logprob

    def pre_process(self, skip_idx_list: List[int] = []):
        pass

    def compute_logprobs(self, logits: paddle.Tensor, sampling_metadata: Optional[SamplingMetadata] = None):
        return as_device(log_softmax(logits))

    def gather_logprobs(self, logprobs: paddle.Tensor, num_logprobs: int, token_ids: paddle.Tensor) -> LogprobsTensors:
        return LogprobsTensors(*speculative_gather_logprobs(logprobs, num_logprobs, token_ids))

    def forward_cuda(self, logits, sampling_metadata, max_model_len, share_inputs, *args):
        raise NotImplementedError("MTP is not modelled by the replica")
