"""Mirrors ``batched_count_greater_than`` (develop): unchanged from the 2.5 replica."""

from .....fd25.model_executor.layers.sample.logprobs import batched_count_greater_than  # noqa: F401
