"""Mirrors ``fastdeploy/config.py`` (2.5) where it differs from the 2.4 replica: the scheduler has
``enable_overlap_schedule`` (#6259, default False in 2.5) and Keep-Sampling-Mask does not exist."""

from __future__ import annotations

from dataclasses import dataclass

from ..fd24.config import (  # noqa: F401
    CacheConfig,
    EarlyStopConfig,
    FDConfig,
    GraphOptimizationConfig,
    LoadConfig,
    ParallelConfig,
    RoutingReplayConfig,
    SpeculativeConfig,
    StructuredOutputsConfig,
)
from ..fd24.config import ModelConfig as _ModelConfig24
from ..fd24.config import SchedulerConfig as _SchedulerConfig24


#: the token a preempted slot's row carries in the saved message (2.5 fastdeploy/config.py:67)
PREEMPTED_TOKEN_ID = -9


@dataclass
class SchedulerConfig(_SchedulerConfig24):
    enable_overlap_schedule: bool = False


@dataclass
class ModelConfig(_ModelConfig24):
    def __post_init__(self) -> None:
        if self.enable_keep_sampling_mask:
            raise ValueError("Keep-Sampling-Mask exists on FastDeploy 2.4 only")
