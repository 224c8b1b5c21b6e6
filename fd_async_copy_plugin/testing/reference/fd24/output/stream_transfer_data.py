"""Mirrors ``fastdeploy/output/stream_transfer_data.py`` (2.4, :35): one row of the V1 (ZMQ)
output path, pickled by the runner's output thread."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

import numpy as np

from ..worker.output import LogprobsTensors


class DecoderState(Enum):
    TEXT = "text"
    IMAGE = "image"
    VIDEO = "video"
    AUDIO = "audio"


@dataclass
class StreamTransferData:
    decoder_state: DecoderState
    batch_id: int
    tokens: Optional[np.ndarray] = None
    speculaive_decoding: bool = False  # sic, FastDeploy's spelling
    logprobs: Optional[LogprobsTensors] = None
    prompt_logprobs: Optional[LogprobsTensors] = None
    accept_tokens: Optional[np.ndarray] = None
    accept_num: Optional[np.ndarray] = None
    pooler_output: Optional[np.ndarray] = None
    sampling_mask: Optional[np.ndarray] = None
