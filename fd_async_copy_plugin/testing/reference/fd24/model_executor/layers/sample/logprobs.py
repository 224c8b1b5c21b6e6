"""Mirrors ``batched_count_greater_than`` of ``layers/sample/logprobs.py``: the rank of a token is
the number of vocabulary entries whose logprob is >= its own, ``(x >= y).sum(-1)`` as int64 [N]
(FastDeploy runs a Triton kernel on CUDA; this is its Paddle fallback)."""

import paddle

from .....placement import as_device


def batched_count_greater_than(x: paddle.Tensor, y: paddle.Tensor) -> paddle.Tensor:
    return as_device((x >= y).astype("int64").sum(-1))
