"""Mirrors ``ForwardMeta`` (develop): unchanged from the 2.5 replica (``real_bsz`` is set as an attribute)."""

from ...fd25.model_executor.forward_meta import ForwardMeta  # noqa: F401
