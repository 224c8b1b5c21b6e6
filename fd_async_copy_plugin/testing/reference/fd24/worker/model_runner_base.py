"""Mirrors ``ModelRunnerBase`` of ``fastdeploy/worker/model_runner_base.py``: unpacks ``FDConfig``
into the attributes the runners use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DistributedStatus:
    only_decode: bool = True
    moe_num_chunk: int = 1


@dataclass
class DistributedOut:
    if_only_decode: bool = True
    max_moe_num_chunk: Optional[int] = None


class ModelRunnerBase:
    def __init__(self, fd_config, device: str) -> None:
        self.fd_config = fd_config
        self.model_config = fd_config.model_config
        self.load_config = fd_config.load_config
        self.device_config = fd_config.device_config
        self.speculative_config = fd_config.speculative_config
        self.parallel_config = fd_config.parallel_config
        self.graph_opt_config = fd_config.graph_opt_config
        self.quant_config = fd_config.quant_config
        self.cache_config = fd_config.cache_config
        self.scheduler_config = fd_config.scheduler_config
        self.device = device
