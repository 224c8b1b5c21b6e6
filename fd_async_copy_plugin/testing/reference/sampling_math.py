"""Sampling maths shared by the replica samplers (2.4 and 2.5 are identical here).

- ``log_softmax``: ``x - logsumexp(x)``, FastDeploy's ``F.log_softmax`` without its CPU cost.
- ``greedy_sample``: the replica's ``top_k_top_p_sampling`` - argmax, so runs are deterministic.
- ``top_p_renormalized_logprobs``: ``compute_logprobs``'s top-p branch
  (``top_p_normalize_probs_paddle``): probabilities outside the top-p nucleus drop to 0, the rest
  are renormalised, and the log is taken.
- ``keep_sampling_mask``: 2.4's Keep-Sampling-Mask (``_compute_sampling_mask``, sampler.py:97):
  per request the vocabulary indices retained by top-p/top-k and ``log Z_K``, the log of their
  total probability. FastDeploy reads both back to the host (``.item()``, ``.cpu().numpy()``).
"""

from __future__ import annotations

import numpy as np
import paddle

from .placement import as_device, blocking_d2h


def log_softmax(x: paddle.Tensor) -> paddle.Tensor:
    return x - paddle.logsumexp(x, axis=-1, keepdim=True)


def greedy_sample(probs: paddle.Tensor) -> paddle.Tensor:
    """[N, V] -> [N, 1] int64 token ids."""
    return as_device(paddle.argmax(probs, axis=-1, keepdim=True).astype("int64"))


def _nucleus(probs_row: np.ndarray, top_p: float, top_k: int) -> np.ndarray:
    order = np.argsort(-probs_row, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    cumulative = np.cumsum(probs_row[order])
    keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1
    return np.sort(order[: max(1, min(keep, order.shape[0]))]).astype(np.int32)


def top_p_renormalized_logprobs(probs: paddle.Tensor, top_p: paddle.Tensor) -> paddle.Tensor:
    values = blocking_d2h(probs, "compute_logprobs.top_p_normalize").numpy()
    top_ps = blocking_d2h(top_p, "compute_logprobs.top_p").numpy().reshape(-1)
    out = np.zeros_like(values)
    for i in range(values.shape[0]):
        kept = _nucleus(values[i], float(top_ps[i]), 0)
        out[i, kept] = values[i, kept] / values[i, kept].sum()
    with np.errstate(divide="ignore"):
        return as_device(paddle.to_tensor(np.log(out).astype(np.float32)))


def keep_sampling_mask(probs: paddle.Tensor, top_p: paddle.Tensor, top_k_list) -> tuple[list, np.ndarray]:
    values = blocking_d2h(probs, "_compute_sampling_mask.probs").numpy()
    top_ps = blocking_d2h(top_p, "_compute_sampling_mask.top_p").numpy().reshape(-1)
    masks, logz = [], np.zeros([values.shape[0]], dtype=np.float32)
    for i in range(values.shape[0]):
        k = int(top_k_list[i]) if top_k_list is not None and i < len(top_k_list) else 0
        kept = _nucleus(values[i], float(top_ps[i]), k)
        masks.append(kept)
        logz[i] = np.log(values[i, kept].astype(np.float64).sum())
    return masks, logz
