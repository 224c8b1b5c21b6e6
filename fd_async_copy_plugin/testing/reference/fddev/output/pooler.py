"""Mirrors ``fastdeploy/output/pooler.py`` (develop): unchanged from the 2.5 replica."""

from ...fd25.output.pooler import PoolerOutput, PoolingSequenceGroupOutput  # noqa: F401
