"""Mirrors ``PoolerOutput`` of ``fastdeploy/output/pooler.py``: only what ``post_process``
dispatches on (the replica has no pooling model)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PoolingSequenceGroupOutput:
    data: object = None


@dataclass
class PoolerOutput:
    outputs: list
