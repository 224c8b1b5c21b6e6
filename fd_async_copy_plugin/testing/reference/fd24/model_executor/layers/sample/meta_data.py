"""Mirrors ``SamplingMetadata`` of ``fastdeploy/model_executor/layers/sample/meta_data.py`` (2.4),
same fields in the same order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import paddle


@dataclass
class SamplingMetadata:
    temperature: paddle.Tensor

    pre_token_ids: paddle.Tensor
    eos_token_ids: paddle.Tensor
    frequency_penalties: paddle.Tensor
    presence_penalties: paddle.Tensor
    repetition_penalties: paddle.Tensor

    min_dec_lens: paddle.Tensor

    bad_words_token_ids: paddle.Tensor

    step_idx: paddle.Tensor

    top_p: paddle.Tensor
    top_k: Optional[paddle.Tensor] = None
    top_k_list: Optional[list] = None
    min_p: Optional[paddle.Tensor] = None
    min_p_list: Optional[list] = None
    seed: Optional[paddle.Tensor] = None
    # Largest logprobs count in the batch; None when no request wants logprobs.
    max_num_logprobs: Optional[int] = None
    enable_early_stop: Optional[int] = False
    stop_flags: Optional[paddle.Tensor] = None
    prompt_ids: Optional[paddle.Tensor] = None
    prompt_lens: Optional[paddle.Tensor] = None
    temp_scaled_logprobs_flag: Optional[bool] = None
    top_p_normalized_logprobs_flag: Optional[bool] = None
    temp_scaled_logprobs: Optional[paddle.Tensor] = None
    top_p_normalized_logprobs: Optional[paddle.Tensor] = None
    share_inputs: Optional[Dict[str, paddle.Tensor]] = None
    logits_processors: Optional[list] = None
    seq_lens_encoder: Optional[paddle.Tensor] = None
    seq_lens_decoder: Optional[paddle.Tensor] = None
    keep_sampling_mask: bool = False
