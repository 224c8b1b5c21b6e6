"""Mirrors ``Request`` / ``RequestType`` of ``fastdeploy/engine/request.py`` (2.4) as the runner
sees them: a scheduled task with a slot ``idx``, a task type, prefill chunk indices and block
tables. ``get()`` looks up the request, then its sampling params (request.py:357)."""

from __future__ import annotations

from enum import Enum
from typing import Optional

from .sampling_params import SamplingParams


class RequestType(Enum):
    PREFILL = 0
    DECODE = 1
    PREEMPTED = 2
    EXTEND = 3


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list,
        eos_token_ids: list,
        sampling_params: Optional[SamplingParams] = None,
        idx: int = 0,
        task_type: RequestType = RequestType.PREFILL,
        prefill_start_index: int = 0,
        prefill_end_index: int = 0,
        block_tables: Optional[list] = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.prompt_token_ids_len = len(self.prompt_token_ids)
        self.output_token_ids: list = []
        self.eos_token_ids = list(eos_token_ids)
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        self.idx = idx
        self.task_type = task_type
        self.prefill_start_index = prefill_start_index
        self.prefill_end_index = prefill_end_index
        self.block_tables = list(block_tables or [])
        self.guided_json = None
        self.guided_regex = None
        self.structural_tag = None
        self.guided_grammar = None
        self.pooling_params = None
        self.disaggregate_info = None
        self.multimodal_inputs = None

    def get(self, key: str, default_value=None):
        if hasattr(self, key):
            return getattr(self, key)
        if hasattr(self.sampling_params, key):
            return getattr(self.sampling_params, key)
        return default_value

    def set(self, key, value):
        if hasattr(self.sampling_params, key):
            setattr(self.sampling_params, key, value)
        else:
            setattr(self, key, value)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, idx={self.idx}, {self.task_type.name}, "
            f"prefill=[{self.prefill_start_index}, {self.prefill_end_index}))"
        )
