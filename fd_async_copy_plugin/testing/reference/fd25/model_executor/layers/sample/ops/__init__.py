"""Mirrors ``fastdeploy/model_executor/layers/sample/ops`` (2.5): the sampling op is unchanged from
2.4 (``top_k_top_p_sampling.py:92``, still the host ``infer_seed`` as ``topp_seed``)."""

from ......fd24.model_executor.layers.sample.ops.top_k_top_p_sampling import top_k_top_p_sampling

__all__ = ["top_k_top_p_sampling"]
