"""Mirrors ``fastdeploy/model_executor/layers/sample/ops`` (develop): the sampling op is the 2.5
replica's. What changed is its seed: develop passes the **device** ``infer_seed`` (#6765,
input_batch.py:175), so the op no longer transforms a host tensor (T is gone)."""

from ......fd24.model_executor.layers.sample.ops.top_k_top_p_sampling import top_k_top_p_sampling

__all__ = ["top_k_top_p_sampling"]
