"""Mirrors ``fastdeploy/worker/output.py`` (develop) at the patch points: the 2.5 replica's
``LogprobsTensors`` (develop's ``slice_rows`` is 2.5's body: the same normalised-AST digest,
``fd_identity``), ``SamplerOutput`` and ``ModelOutputData`` with ``not_need_stop_device``. develop
renames ``pre_ids`` to ``token_ids_all`` in ``ModelOutputData``; that is no census site and is not
modelled (the replica keeps 2.5's field list).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import paddle

from ...fd24.worker.output import Logprob, LogprobsLists, ModelRunnerOutput, SampleLogprobs  # noqa: F401
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from ...placement import as_device, blocking_d2h, is_device, is_pinned


def _whole_field_to_cpu(t: paddle.Tensor, site: str) -> paddle.Tensor:
    """``field.cpu()``: a blocking D2H of a device tensor; a host memcpy with no stream wait of a
    pinned one (read through the backend, which checks the copy into it has landed)."""
    if is_pinned(t):
        return paddle.to_tensor(replica_backend.current().read(t, site), place=paddle.CPUPlace())
    if is_device(t):
        return blocking_d2h(t, site)
    return t.clone()


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
        logprob_token_ids = as_device(paddle.empty([num_positions, num_tokens_per_position], dtype=paddle.int64))
        logprobs = as_device(paddle.empty_like(logprob_token_ids, dtype=paddle.float32))
        selected_token_ranks = as_device(paddle.empty([num_positions], dtype=paddle.int64))
        return LogprobsTensors(
            logprob_token_ids=logprob_token_ids,
            logprobs=logprobs,
            selected_token_ranks=selected_token_ranks,
        )

    def slice_rows(self, start: int, end: int):
        """Rows ``[start, end)`` on the CPU; each call copies every field whole first (2.5)."""
        site = "LogprobsTensors.slice_rows"
        with paddle.no_grad():
            return LogprobsTensors(
                paddle.to_tensor(_whole_field_to_cpu(self.logprob_token_ids, site)[start:end], place="cpu"),
                paddle.to_tensor(_whole_field_to_cpu(self.logprobs, site)[start:end], place="cpu"),
                paddle.to_tensor(_whole_field_to_cpu(self.selected_token_ranks, site)[start:end], place="cpu"),
            )


@dataclass
class SamplerOutput:
    sampled_token_ids: paddle.Tensor
    logprobs_tensors: Optional[LogprobsTensors]
    token_num_per_batch: Optional[paddle.Tensor] = None
    cu_batch_token_offset: Optional[paddle.Tensor] = None
    logits: Optional[paddle.Tensor] = None


@dataclass
class ModelOutputData:
    """What ``_postprocess`` hands to ``post_process`` and ``save_output_normal`` (2.5 order)."""

    next_tokens: paddle.Tensor
    stop_flags: paddle.Tensor
    step_idx: int
    max_dec_len: int
    pre_ids: paddle.Tensor
    seq_lens_this_time: paddle.Tensor
    eos_token_id: paddle.Tensor
    # The pinned [1] bool host flag, written by an async copy from not_need_stop_device.
    not_need_stop: bool
    seq_lens_encoder: paddle.Tensor
    seq_lens_decoder: paddle.Tensor
    is_block_step: bool
    msg_queue_id: int
    mp_rank: int
    use_ep: bool
    input_ids: paddle.Tensor
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
    index_to_batch_id: dict[int, int] = field(default_factory=dict)
    min_tokens: paddle.Tensor = None
    enable_pd_reorder: bool = False
    stop_nums: paddle.Tensor = None
    # The [1] bool device flag the update ops write (#6176).
    not_need_stop_device: paddle.Tensor = None
