"""Mirrors ``fastdeploy/model_executor/layers/sample/ops/top_k_top_p_sampling.py`` (2.4 and 2.5).

``top_k_top_p_sampling`` with FastDeploy's default ``FD_SAMPLING_CLASS=base`` calls Paddle's
``paddle.tensor.top_p_sampling(x, top_p, threshold=..., topp_seed=topp_seed, seed=..., k=...,
mode="truncated")`` (2.4 :93-97). Its ``topp_seed`` is the runner's ``infer_seed``, which 2.4
and 2.5 allocate on the **host** (``paddle.full(...).cpu()``): Paddle's data transform
(``TransDataPlace``) synchronizes the stream and copies it to the GPU before the kernel runs, so
the host waits for the forward, the logits and the penalties every step (**T** in
fd24-step-syncs.md; removed upstream by #6668/#6765).

``top_p_sampling`` below stands in for the Paddle op: it declares its inputs to device tracking
(``phi_op``: a pageable host input of a device op is a synchronous H2D with a stream wait),
launches the sampler's kernel (``heavy``) and samples greedily (argmax), so runs stay
deterministic. No FastDeploy code is copied.
"""

from __future__ import annotations

from typing import Optional

import paddle

from ......placement import heavy, phi_op
from ......sampling_math import seeded_sample


def top_p_sampling(x, ps, threshold=None, topp_seed=None, seed=-1, k=0, mode="truncated", return_top=False, name=None):
    """Stand-in for ``paddle.tensor.top_p_sampling``: returns ``(scores, ids)``, ids [N, 1] int64."""
    phi_op("top_p_sampling", x=x, ps=ps, threshold=threshold, topp_seed=topp_seed)
    heavy("top_p_sampling")
    ids = seeded_sample(x, ps, topp_seed)
    return paddle.take_along_axis(x, ids, axis=-1), ids


def top_k_top_p_sampling(
    x: paddle.Tensor,
    top_p: paddle.Tensor,
    top_k: Optional[paddle.Tensor] = None,
    top_k_list: Optional[list] = None,
    threshold: Optional[paddle.Tensor] = None,
    topp_seed: Optional[paddle.Tensor] = None,
    seed: int = -1,
    k: int = 0,
    mode: str = "truncated",
    order: str = "top_k_first",
) -> tuple:
    """``FD_SAMPLING_CLASS=base`` on CUDA: top-k renormalisation is an identity in the replica."""
    _, ids = top_p_sampling(x, top_p, threshold=threshold, topp_seed=topp_seed, seed=seed, k=k, mode="truncated")
    return _, ids
