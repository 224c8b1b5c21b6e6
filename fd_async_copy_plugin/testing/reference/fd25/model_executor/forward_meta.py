"""Mirrors ``ForwardMeta`` (the replica's fields are the same as for 2.4)."""

from ...fd24.model_executor.forward_meta import ForwardMeta  # noqa: F401
