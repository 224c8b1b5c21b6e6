"""Mirrors the fields of ``fastdeploy/engine/sampling_params.py`` (2.4) the runner reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class SamplingParams:
    max_tokens: Optional[int] = None
    min_tokens: int = 1
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: Optional[int] = None
    #: top logprobs per sampled token; -1 means the whole vocabulary; None disables.
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    temp_scaled_logprobs: bool = False
    top_p_normalized_logprobs: bool = False
    bad_words_token_ids: Optional[list] = None
    stop_token_ids: Optional[list] = None
    stop_seqs_len: Optional[list] = None
    logits_processors_args: Optional[dict] = None
    extra: dict = field(default_factory=dict)
