"""Mirrors the parts of ``fastdeploy/config.py`` (2.4) that the runner reads at the patch points.

``FDConfig`` groups the sub-configs under FastDeploy's attribute names (``model_config``,
``scheduler_config``, ``cache_config``, ``parallel_config``, ...). Only the fields the replica
uses exist. 2.4's ``SchedulerConfig`` has no ``enable_overlap_schedule`` (added by #6259 in 2.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ModelConfig:
    vocab_size: int = 1024
    ori_vocab_size: int = 1024
    max_model_len: int = 256
    hidden_size: int = 32
    model_seed: int = 2024
    #: replica only: TinyModel's per-token layer whose bits depend on the row count (tiny_model.py)
    rows_dependent_gemm: bool = False
    #: replica only: TinyModel's MoE stand-in, rows routed to this many experts by token id (0: none)
    moe_experts: int = 0
    pad_token_id: int = 0
    eos_tokens_lens: int = 1
    enable_logprob: bool = False
    max_logprobs: int = 20
    logprobs_mode: str = "raw_logprobs"
    enable_keep_sampling_mask: bool = False
    enable_mm: bool = False
    enable_entropy: bool = False
    runner_type: str = "generate"
    top_p: float = 1.0
    temperature: float = 1.0
    penalty_score: float = 1.0
    frequency_score: float = 0.0
    presence_score: float = 0.0
    min_length: int = 1
    max_stop_seqs_num: int = 5
    stop_seqs_max_len: int = 8
    think_end_id: int = -1
    think_truncate_prompt_ids: list = field(default_factory=lambda: [-1])
    model_type: str = "tiny"
    architectures: list = field(default_factory=lambda: ["TinyModel"])


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 8192
    splitwise_role: str = "mixed"


@dataclass
class CacheConfig:
    block_size: int = 64
    enc_dec_block_num: int = 2
    total_block_num: int = 64
    kv_cache_ratio: float = 0.75
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = False


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    tensor_parallel_rank: int = 0
    data_parallel_rank: int = 0
    local_data_parallel_id: int = 0
    use_ep: bool = False
    enable_expert_parallel: bool = False
    msg_queue_id: int = 1
    engine_worker_queue_port: int = 1
    tp_group: Optional[object] = None


@dataclass
class SpeculativeConfig:
    method: Optional[str] = None
    num_speculative_tokens: int = 0
    verify_window: int = 2
    max_candidate_len: int = 5
    benchmark_mode: bool = False
    enable_draft_logprob: bool = False


@dataclass
class GraphOptimizationConfig:
    use_cudagraph: bool = False
    cudagraph_capture_sizes: list = field(default_factory=list)
    sot_warmup_sizes: list = field(default_factory=list)
    cudagraph_only_prefill: bool = False
    max_capture_size: int = 0
    #: a token count -> the captured size its decode step replays (``init_with_cudagrpah_size``)
    real_shape_to_captured_size: dict = field(default_factory=dict)

    def init_with_cudagrpah_size(self, max_capture_size: int) -> None:
        """FD 2.4's capture list (``config.py:898-943``, set up at ``:1646-1667``): 1, 2, 4, 8..128
        by 8, 144..256 by 16, 288..1024 by 32 and ``max_capture_size``, those above it dropped; a
        count maps to the smallest captured size at or above it."""
        sizes = [1, 2, 4] + list(range(8, 129, 8)) + list(range(144, 257, 16)) + list(range(288, 1025, 32))
        self.cudagraph_capture_sizes = sorted({s for s in sizes + [max_capture_size] if s <= max_capture_size})
        self.max_capture_size = max(self.cudagraph_capture_sizes)
        self.real_shape_to_captured_size = {
            n: min(s for s in self.cudagraph_capture_sizes if s >= n) for n in range(1, self.max_capture_size + 1)}


@dataclass
class EarlyStopConfig:
    enable_early_stop: bool = False


@dataclass
class StructuredOutputsConfig:
    guided_decoding_backend: str = "off"


@dataclass
class RoutingReplayConfig:
    enable_routing_replay: bool = False


@dataclass
class LoadConfig:
    dynamic_load_weight: bool = False


@dataclass
class FDConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    speculative_config: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    graph_opt_config: GraphOptimizationConfig = field(default_factory=GraphOptimizationConfig)
    early_stop_config: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    structured_outputs_config: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    routing_replay_config: RoutingReplayConfig = field(default_factory=RoutingReplayConfig)
    load_config: LoadConfig = field(default_factory=LoadConfig)
    device_config: Optional[object] = None
    quant_config: Optional[object] = None
