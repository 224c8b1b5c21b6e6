"""Mirrors ``ForwardMeta`` of ``fastdeploy/model_executor/forward_meta.py``: what the model's
forward reads besides the packed ids. The replica adds ``position_ids`` (what its attention-free
model needs in place of the attention metadata)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import paddle


@dataclass
class ForwardMeta:
    ids_remove_padding: paddle.Tensor
    seq_lens_encoder: Optional[paddle.Tensor] = None
    seq_lens_decoder: Optional[paddle.Tensor] = None
    seq_lens_this_time: Optional[paddle.Tensor] = None
    batch_id_per_token: Optional[paddle.Tensor] = None
    cu_seqlens_q: Optional[paddle.Tensor] = None
    cu_seqlens_k: Optional[paddle.Tensor] = None
    block_tables: Optional[paddle.Tensor] = None
    position_ids: Optional[paddle.Tensor] = None
    step_use_cudagraph: bool = False
    is_dummy_or_profile_run: bool = False
