"""Mirrors ``batched_count_greater_than`` (unchanged in 2.5)."""

from .....fd24.model_executor.layers.sample.logprobs import batched_count_greater_than  # noqa: F401
