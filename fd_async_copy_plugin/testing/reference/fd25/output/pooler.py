"""Mirrors ``PoolerOutput`` (unchanged in 2.5)."""

from ...fd24.output.pooler import PoolerOutput, PoolingSequenceGroupOutput  # noqa: F401
