"""Mirrors ``SamplingMetadata`` (the replica's fields are the same as for 2.4)."""

from .....fd24.model_executor.layers.sample.meta_data import SamplingMetadata  # noqa: F401
