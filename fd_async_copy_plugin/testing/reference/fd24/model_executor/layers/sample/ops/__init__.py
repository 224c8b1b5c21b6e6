"""Mirrors ``fastdeploy/model_executor/layers/sample/ops/__init__.py`` (2.4): the sampling op
used by ``Sampler.forward_cuda``. Penalties and min-p are identities in the replica."""

from .top_k_top_p_sampling import top_k_top_p_sampling

__all__ = ["top_k_top_p_sampling"]
