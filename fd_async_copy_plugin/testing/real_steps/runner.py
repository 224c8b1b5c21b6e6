"""FastDeploy's own ``GPUModelRunner``, built on CPU Paddle with a minimal configuration.

``build_runner(config, port)`` runs FastDeploy's ``GPUModelRunner.__init__`` (so its
``_init_share_inputs`` / ``InputBatch``, its ``Sampler``, and whatever the plugin links to them run
as on a GPU worker) with:

- ``fd_config``: a plain namespace carrying the attributes FastDeploy's runner, sampler and
  post-process read (``_config``), from the driver's ``DriverConfig``; no model files;
- stand-ins, swapped in for the duration of ``__init__`` only and restored after:
  ``_initialize_attn_backend`` (one ``NoAttention``: the tiny model has no attention),
  ``GPUMemoryChecker`` (no NVML here), ``IPCSignal`` (no engine's shared memory here), and for
  the output thread of ``FD_USE_GET_SAVE_OUTPUT_V1`` the replica's in-process ``ZmqIpcClient``
  (the driver reads its sink) and a ``queue.Queue`` that counts its puts;
- the model: ``RealStepsModel`` (the replica's tiny deterministic model), bound as
  ``runner.model``; ``load_model`` (FastDeploy's loader reads model files) is replaced on the
  instance by a no-op.

Everything else - ``insert_tasks_v1``, ``execute_model``, ``_prepare_inputs``, the sampler,
``post_process``, the save ops' call sites - is FastDeploy's code, patched or not by the plugin.
"""

from __future__ import annotations

import contextlib
import importlib
import types

from ..reference.driver import DriverConfig, _num_blocks
from .model import NoAttention, RealStepsModel

N = types.SimpleNamespace


def _config(config: DriverConfig, port: int):
    """The namespace FastDeploy's runner reads as ``fd_config`` (attribute names are FastDeploy's)."""
    model = N(
        max_model_len=config.max_model_len, pad_token_id=0, eos_tokens_lens=config.eos_tokens_lens,
        top_p=0.0, temperature=1.0, penalty_score=1.0, frequency_score=0.0, presence_score=0.0, min_length=1,
        max_stop_seqs_num=config.max_stop_seqs_num, stop_seqs_max_len=config.stop_seqs_max_len,
        vocab_size=config.vocab_size, ori_vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        enable_logprob=config.enable_logprob, max_logprobs=config.max_logprobs, logprobs_mode="raw_logprobs",
        enable_keep_sampling_mask=config.keep_sampling_mask, enable_mm=False, runner_type="generate",
        enable_entropy=False, think_end_id=-1, think_truncate_prompt_ids=-1, head_dim=8, num_attention_heads=1,
        num_key_value_heads=1, kv_num_heads=1, num_hidden_layers=1, rope_theta=10000.0, partial_rotary_factor=1.0,
        model_type="tiny", architectures=["TinyModel"], dtype="float32", model="tiny", moe_phase=N(phase="prefill"),
        qk_rope_head_dim=0, kv_lora_rank=0, im_patch_id=-1, mm_max_tokens_per_item=None, vision_config=None,
        spatial_conv_size=1, enable_redundant_experts=False, rope_3d=False, use_3d_rope=False,
    )
    cache = N(
        block_size=config.block_size, enc_dec_block_num=config.enc_dec_block_num, total_block_num=_num_blocks(config),
        kv_cache_ratio=1.0, enable_prefix_caching=False, enable_chunked_prefill=config.chunk_size is not None,
        max_encoder_cache=0, num_cpu_blocks=0, cache_dtype="float32", max_block_num_per_seq=None,
    )
    scheduler = N(max_num_seqs=config.max_num_seqs, splitwise_role="mixed", name="local",
                  enable_overlap_schedule=config.overlap, max_num_batched_tokens=config.max_num_seqs * config.max_model_len,
                  max_extra_num_batched_tokens=0)
    parallel = N(
        engine_worker_queue_port=port, msg_queue_id=port, local_data_parallel_id=0, tensor_parallel_rank=0,
        tensor_parallel_size=1, data_parallel_rank=0, data_parallel_size=1, use_ep=False, enable_expert_parallel=False,
        enable_chunked_moe=False, chunked_moe_size=0, shutdown_comm_group_if_worker_idle=False, tp_group=None,
        expert_parallel_size=1, local_engine_worker_queue_port=port,
    )
    speculative = N(method=None, num_speculative_tokens=0, benchmark_mode=False, enable_draft_logprob=False,
                    max_candidate_len=1, num_gpu_block_expand_ratio=1, verify_window=1, model_type="main")
    graph = N(use_cudagraph=False, cudagraph_capture_sizes=[], cudagraph_capture_sizes_prefill=[], sot_warmup_sizes=[],
              cudagraph_only_prefill=False, graph_opt_level=0, use_unique_memory_pool=False, full_cuda_graph=False)
    return N(
        model_config=model, cache_config=cache, scheduler_config=scheduler, parallel_config=parallel,
        speculative_config=speculative, graph_opt_config=graph, load_config=N(dynamic_load_weight=False),
        device_config=N(device_type="gpu"), quant_config=None, early_stop_config=N(enable_early_stop=False),
        structured_outputs_config=N(guided_decoding_backend="off", logits_processors=None, reasoning_parser=None),
        routing_replay_config=N(enable_routing_replay=False), plas_attention_config=None, eplb_config=N(),
        lora_config=None, cache_transfer_config=None, enable_mm_runtime=False,
        # develop: FDConfig.get_max_chunk_tokens, whose answer without multimodal inputs on a mixed node
        get_max_chunk_tokens=lambda mm_max_tokens_per_item=None: scheduler.max_num_batched_tokens,
    )


class _Quiet:
    """``GPUMemoryChecker`` / ``IPCSignal`` stand-in: accepts anything, does nothing."""

    def __init__(self, *args, **kwargs) -> None:
        self.value = None

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _swapped(owner, **values):
    missing = object()
    saved = {name: owner.__dict__.get(name, missing) if isinstance(owner, type) else getattr(owner, name, missing)
             for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def build_runner(config: DriverConfig, port: int):
    module = importlib.import_module("fastdeploy.worker.gpu_model_runner")
    cls = module.GPUModelRunner

    def _initialize_attn_backend(self):
        self.attn_backends = [NoAttention()]

    stand_ins = {name: _Quiet for name in ("GPUMemoryChecker", "IPCSignal") if hasattr(module, name)}
    # the output thread's transport (FD_USE_GET_SAVE_OUTPUT_V1): the replica's in-process ZMQ client,
    # whose sink the driver reads, and a queue that counts puts (so the driver waits for the sends)
    from ..reference import zmq_sink

    if hasattr(module, "ZmqIpcClient"):
        stand_ins["ZmqIpcClient"] = zmq_sink.ZmqIpcClient
    if hasattr(module, "queue"):
        stand_ins["queue"] = types.SimpleNamespace(Queue=zmq_sink.OutputQueue)
    with _swapped(cls, _initialize_attn_backend=_initialize_attn_backend), _swapped(module, **stand_ins):
        runner = cls(_config(config, port), device="gpu", device_id=0, rank=0, local_rank=0)
    runner.model = RealStepsModel(
        runner.share_inputs, vocab_size=config.vocab_size, max_model_len=config.max_model_len,
        hidden_size=config.hidden_size, seed=config.model_seed, rows_dependent_gemm=config.rows_dependent_gemm)
    if "caches" not in runner.share_inputs:  # initialize_kv_cache's entry: the tiny model keeps no KV cache
        runner.share_inputs["caches"] = []
    runner.load_model = lambda: None  # the model is bound above; FastDeploy's loader reads files
    runner.close = lambda: _end_output_thread(runner)  # the driver calls it when the run ends
    return runner


class _EndOutputThread:
    """Put on the output queue at the end of a run: pickling it raises ``SystemExit``, which
    FastDeploy's ``_async_output_busy_loop`` (``except Exception``) lets through, so the thread - and
    the runner it holds - goes away (else every run's runner stays alive in ``status()``)."""

    def __reduce__(self):
        raise SystemExit


def _end_output_thread(runner) -> None:
    thread = getattr(runner, "async_output_copy_thread", None)
    queue = getattr(runner, "async_output_queue", None)
    if thread is None or queue is None or not thread.is_alive():
        return
    queue.put(_EndOutputThread())
    thread.join(timeout=10)
