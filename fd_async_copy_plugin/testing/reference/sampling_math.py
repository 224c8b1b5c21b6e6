"""Sampling maths shared by the replica samplers (2.4 and 2.5 are identical here).

- ``log_softmax``: ``x - logsumexp(x)``, FastDeploy's ``F.log_softmax`` without its CPU cost.
- ``greedy_sample``: the replica's ``top_k_top_p_sampling`` - argmax, so runs are deterministic.
- ``seeded_sample``: the same for rows with ``top_p < 1``: a draw from the top-p nucleus driven by
  the row's ``topp_seed`` only (same seed, same token), so a seed that drifts changes tokens.
- ``ban_bad_words``: the bad-words part of 2.4's ``apply_penalty_multi_scores``
  (token_penalty_multi_scores.cu ``ban_bad_words``): it reads the ``[M, w]`` slice with no row
  offset, so every row bans the ids of **row 0**'s first ``w`` entries inside the vocabulary
  (upstream fixed it in #6069). The slice width ``w`` (S2) therefore changes outputs.
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

from .placement import as_device, blocking_d2h, device_code


def log_softmax(x: paddle.Tensor) -> paddle.Tensor:
    return x - paddle.logsumexp(x, axis=-1, keepdim=True)


def greedy_sample(probs: paddle.Tensor) -> paddle.Tensor:
    """[N, V] -> [N, 1] int64 token ids."""
    return as_device(paddle.argmax(probs, axis=-1, keepdim=True).astype("int64"))


def seeded_sample(probs: paddle.Tensor, top_p: paddle.Tensor, seeds) -> paddle.Tensor:
    """[N, V] -> [N, 1]: argmax where ``top_p >= 1``, else a seeded draw from the nucleus."""
    with device_code():
        values = probs.numpy()
        ps = top_p.numpy().reshape(-1)
        seed_values = seeds.numpy().reshape(-1) if seeds is not None else np.zeros([values.shape[0]], np.int64)
    ids = np.argmax(values, axis=-1).astype(np.int64)
    for i in np.flatnonzero(ps[: values.shape[0]] < 1.0):
        kept = _nucleus(values[i], float(ps[i]), 0)
        weights = values[i, kept].astype(np.float64)
        rng = np.random.default_rng(int(seed_values[i]) & 0x7FFFFFFFFFFFFFFF)
        ids[i] = kept[int(np.searchsorted(np.cumsum(weights / weights.sum()), rng.random(), side="right").clip(max=len(kept) - 1))]
    return as_device(paddle.to_tensor(ids.reshape(-1, 1)))


def ban_bad_words(logits: paddle.Tensor, bad_words: paddle.Tensor) -> paddle.Tensor:
    """Logits with row 0's bad-word ids (inside the vocabulary) set to -1e10 in every row."""
    with device_code():
        values = logits.numpy().copy()
        words = bad_words.numpy()
    vocab = values.shape[1]
    row0 = words.reshape(-1)[: words.shape[1]] if words.size else words.reshape(-1)
    ids = row0[(row0 >= 0) & (row0 < vocab)]
    values[:, ids] = -1e10
    return as_device(paddle.to_tensor(values))


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
