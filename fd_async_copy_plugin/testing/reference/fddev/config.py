"""Mirrors ``fastdeploy/config.py`` (develop) where it differs from the 2.5 replica: the overlap
schedule is on by default (#6668 "Set overlap schedule as default"; ``EngineArgs`` default
engine/args_utils.py:444). The driver sets it from ``DriverConfig.overlap`` either way."""

from __future__ import annotations

from dataclasses import dataclass

from ..fd25.config import (  # noqa: F401
    CacheConfig,
    EarlyStopConfig,
    FDConfig,
    GraphOptimizationConfig,
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    RoutingReplayConfig,
    SpeculativeConfig,
    StructuredOutputsConfig,
)
from ..fd25.config import SchedulerConfig as _SchedulerConfig25


@dataclass
class SchedulerConfig(_SchedulerConfig25):
    enable_overlap_schedule: bool = True
