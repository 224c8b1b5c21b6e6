"""Mirrors ``fastdeploy/worker/output.py`` (2.4): ``Logprob`` (:24), ``LogprobsLists`` (:39),
``LogprobsTensors`` (:72, ``slice_rows`` at :116), ``SamplerOutput`` (:170), ``ModelOutputData``
(:203, 2.4 fields in 2.4 order: no ``not_need_stop_device``) and ``ModelRunnerOutput``.

``slice_rows`` keeps 2.4's semantics: slice each field and copy it on the field's own place.
Slicing is a Paddle op, so the census counts it when a field is a pinned buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional

import numpy as np
import paddle

from ...identity import register as _accept_replica_digests
from ...placement import as_device, is_device, paddle_op_inputs

# The replica's slice_rows (2.4 here, 2.5 beside) carries census hooks: not FastDeploy's digest.
_accept_replica_digests()


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


SampleLogprobs = list[dict[int, Logprob]]


class LogprobsLists(NamedTuple):
    # [num_reqs, max_num_logprobs + 1]
    logprob_token_ids: list[list[int]]
    # [num_reqs, max_num_logprobs + 1]
    logprobs: list[list[float]]
    # [num_reqs]
    sampled_token_ranks: list[int]

    def slice_columns(self, start: int, end: int):
        return LogprobsLists(
            [row[start:end] for row in self.logprob_token_ids],
            [row[start:end] for row in self.logprobs],
            self.sampled_token_ranks,
        )

    def slice_rows(self, start: int, end: int):
        return LogprobsLists(
            self.logprob_token_ids[start:end],
            self.logprobs[start:end],
            self.sampled_token_ranks[start:end],
        )


def _same_place_copy(field: paddle.Tensor, start: int, end: int) -> paddle.Tensor:
    out = paddle.to_tensor(field[start:end], place=field.place)
    return as_device(out) if is_device(field) else out


class LogprobsTensors(NamedTuple):
    # [num_reqs, max_num_logprobs + 1]
    logprob_token_ids: paddle.Tensor
    # [num_reqs, max_num_logprobs + 1]
    logprobs: paddle.Tensor
    # [num_reqs]
    selected_token_ranks: paddle.Tensor

    def tolists(self):
        return LogprobsLists(
            self.logprob_token_ids.tolist(),
            self.logprobs.tolist(),
            self.selected_token_ranks.tolist(),
        )

    @staticmethod
    def empty_cpu(num_positions: int, num_tokens_per_position: int) -> "LogprobsTensors":
        logprob_token_ids = paddle.empty([num_positions, num_tokens_per_position], device="cpu", dtype=paddle.int64)
        logprobs = paddle.empty_like(logprob_token_ids, device="cpu", dtype=paddle.float32)
        selected_token_ranks = paddle.empty([num_positions], device="cpu", dtype=paddle.int64)
        return LogprobsTensors(
            logprob_token_ids=logprob_token_ids,
            logprobs=logprobs,
            selected_token_ranks=selected_token_ranks,
        )

    @staticmethod
    def empty(num_positions: int, num_tokens_per_position: int) -> "LogprobsTensors":
        """On the default device (the GPU)."""
        logprob_token_ids = as_device(paddle.empty([num_positions, num_tokens_per_position], dtype=paddle.int64))
        logprobs = as_device(paddle.empty_like(logprob_token_ids, dtype=paddle.float32))
        selected_token_ranks = as_device(paddle.empty([num_positions], dtype=paddle.int64))
        return LogprobsTensors(
            logprob_token_ids=logprob_token_ids,
            logprobs=logprobs,
            selected_token_ranks=selected_token_ranks,
        )

    def slice_rows(self, start: int, end: int):
        """Rows ``[start, end)``, each field sliced and copied on its own place (2.4)."""
        paddle_op_inputs("LogprobsTensors.slice_rows", *self)
        with paddle.no_grad():
            return LogprobsTensors(
                _same_place_copy(self.logprob_token_ids, start, end),
                _same_place_copy(self.logprobs, start, end),
                _same_place_copy(self.selected_token_ranks, start, end),
            )


PromptLogprobs = LogprobsTensors | list[dict[int, Logprob] | None]


@dataclass
class SamplerOutput:
    # [num_reqs, 1]; PLACEHOLDER_TOKEN_ID (-1) pads rows without a token.
    sampled_token_ids: paddle.Tensor
    logprobs_tensors: Optional[LogprobsTensors]
    token_num_per_batch: Optional[paddle.Tensor] = None
    cu_batch_token_offset: Optional[paddle.Tensor] = None
    logits: Optional[paddle.Tensor] = None
    # Keep-Sampling-Mask (2.4 only): per-request retained vocab indices and log Z_K.
    sampling_mask: Optional[List[np.ndarray]] = None
    logz_per_batch: Optional[np.ndarray] = None


@dataclass
class ModelOutputData:
    """What ``execute_model`` hands to ``post_process`` (2.4 field order)."""

    next_tokens: paddle.Tensor
    stop_flags: paddle.Tensor
    step_idx: int
    max_dec_len: int
    pre_ids: paddle.Tensor
    seq_lens_this_time: paddle.Tensor
    eos_token_id: paddle.Tensor
    # Annotated bool in FastDeploy; actually the [1] bool host tensor share_inputs["not_need_stop"].
    not_need_stop: bool
    seq_lens_encoder: paddle.Tensor
    seq_lens_decoder: paddle.Tensor
    is_block_step: bool
    msg_queue_id: int
    mp_rank: int
    use_ep: bool
    input_ids: paddle.Tensor
    stop_nums: paddle.Tensor
    full_hidden_states: paddle.Tensor
    draft_tokens: paddle.Tensor
    actual_draft_token_num: paddle.Tensor
    accept_tokens: paddle.Tensor
    accept_num: paddle.Tensor
    stop_token_ids: paddle.Tensor = None
    stop_seqs_len: paddle.Tensor = None
    prompt_lens: paddle.Tensor = None
    mask_rollback: paddle.Tensor = None
    prompt_logprobs_list: Optional[LogprobsTensors] = None


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    spec_token_ids: Optional[list[list[int]]]
    pooler_output: list[Optional[paddle.Tensor]]
