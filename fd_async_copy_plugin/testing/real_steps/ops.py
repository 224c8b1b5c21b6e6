"""The compiled-op namespace a real FastDeploy decode step needs, from our own numpy ports.

FastDeploy imports its compiled GPU ops from ``fastdeploy.model_executor.ops.gpu`` (at module
import in ``pre_and_post_process`` and ``gpu_model_runner``, at call time in ``rebuild_padding`` and
the sampler's ops). On CPU Paddle that package has no compiled library. ``op_namespace(line)``
builds a module that stands in for it:

- the replica's op module of the same line (``reference/fd24`` or ``reference/fd25``
  ``model_executor/ops/gpu``): our ports of ``get_padding_offset``, ``rebuild_padding``,
  ``set_value_by_flags_and_idx``, ``recover_decode_task``, ``set_stop_value_multi_ends``,
  ``update_inputs_v1``, ``save_output``, ``save_output_topk``, ... with that line's signatures and
  host sides (the blocking copies the sync check counts);
- ``get_token_penalty_multi_scores`` (below: ``token_penalty_multi_scores.cu``'s four kernels);
- any other name: a callable that raises ``NotImplementedError`` naming the op, so that FastDeploy's
  ``from ... import`` lists resolve and a step that reaches an op we did not port fails loudly.

Nothing here is FastDeploy code: the ports are written from the ops' semantics (the kernels' CUDA
sources were read, not copied), like the replica.
"""

from __future__ import annotations

import importlib
import types

import numpy as np
import paddle

from ..reference import ROOTS
from ..reference.placement import as_device, device_op

#: our ports, by the names FastDeploy imports, on top of the replica's op module
PORTED_HERE = ("get_token_penalty_multi_scores",)


def token_penalty_multi_scores_np(pre_ids, prompt_ids, prompt_len, logits, penalty_scores, frequency_score,
                                  presence_score, temperatures, bad_tokens, cur_len, min_len, eos_token_id,
                                  bad_tokens_len=None):
    """``get_token_penalty_multi_scores`` on numpy arrays (float32 logits, in place; returned).

    Per slot ``bi`` (``cur_len`` is ``step_idx``; a negative one leaves the slot's min-length and
    repeat counts alone):

    1. min length: while ``cur_len < min_len`` every eos id's logit is ``-1e10`` (flat index
       ``bi * vocab + eos``, unchecked in the kernel);
    2. repeat counts over ``pre_ids[bi]`` (ids >= 0; the full row) and ``prompt_ids[bi, :prompt_len]``;
    3. every logit: repeated (in either) -> ``x * alpha`` if negative else ``x / alpha``; generated
       ``times`` -> ``x - times * beta - gamma``; then ``/ temperature`` (float32 throughout);
    4. bad words, in range -> ``-1e10``: FD 2.4 (``bad_tokens_len`` None) reads ``bad_tokens[0, :]`` for
       every slot; FD 2.5+ reads row ``bi``'s first ``min(bad_tokens_len[bi], width)`` ids.

    FD 2.5+'s kernels return early for a slot with no penalty (and, for the last step, temperature
    1): the same bits as applying the identities, so one port serves both lines.
    """
    bs, vocab = logits.shape
    cur = cur_len.reshape(-1)
    mins = min_len.reshape(-1)
    eos = eos_token_id.reshape(-1)
    flat = logits.reshape(-1)
    for bi in range(bs):
        if cur[bi] >= 0 and cur[bi] < mins[bi]:
            # the kernel writes logits[bi * vocab + eos] unchecked: an eos id past the vocabulary lands
            # in the next row; past the buffer it is dropped here (undefined on the GPU)
            at = bi * vocab + eos.astype(np.int64)
            flat[at[(at >= 0) & (at < flat.size)]] = np.float32(-1e10)
    repeat = np.zeros([bs, vocab], dtype=np.int32)
    repeated = np.zeros([bs, vocab], dtype=np.int32)
    for bi in range(bs):
        if cur[bi] < 0:
            continue
        ids = pre_ids[bi]
        ids = ids[ids >= 0]
        np.add.at(repeat[bi], ids, 1)
        np.add.at(repeated[bi], ids, 1)
        p = prompt_ids[bi, : int(prompt_len.reshape(-1)[bi])]
        np.add.at(repeated[bi], p[p >= 0], 1)
    alpha = penalty_scores.reshape(-1).astype(np.float32)
    beta = frequency_score.reshape(-1).astype(np.float32)
    gamma = presence_score.reshape(-1).astype(np.float32)
    temp = temperatures.reshape(-1).astype(np.float32)
    for bi in range(bs):
        x = logits[bi]
        rep = repeated[bi] != 0
        x[rep] = np.where(x[rep] < 0, x[rep] * alpha[bi], x[rep] / alpha[bi])
        times = repeat[bi]
        hit = times != 0
        x[hit] = x[hit] - times[hit].astype(np.float32) * beta[bi] - gamma[bi]
        logits[bi] = x / temp[bi]
    rows = bad_tokens.reshape(bad_tokens.shape[0], -1) if bad_tokens.size else np.zeros([bs, 0], np.int64)
    for bi in range(bs):
        if bad_tokens_len is None:
            bad = rows[0]
        else:
            bad = rows[bi, : max(0, min(int(bad_tokens_len.reshape(-1)[bi]), rows.shape[1]))]
        logits[bi, bad[(bad >= 0) & (bad < vocab)]] = np.float32(-1e10)
    return logits


def get_token_penalty_multi_scores(pre_ids, prompt_ids, prompt_len, logits, penalty_scores, frequency_score,
                                   presence_score, temperatures, bad_tokens, cur_len, min_len, eos_token_id):
    """The op: ``logits`` in place (``logits_out`` shares ``logits``), returned."""
    if logits.dtype != paddle.float32:
        raise NotImplementedError("get_token_penalty_multi_scores is ported for float32 logits only")
    out = token_penalty_multi_scores_np(
        pre_ids.numpy(), prompt_ids.numpy(), prompt_len.numpy(), np.array(logits.numpy()), penalty_scores.numpy(),
        frequency_score.numpy(), presence_score.numpy(), temperatures.numpy(), bad_tokens.numpy(), cur_len.numpy(),
        min_len.numpy(), eos_token_id.numpy())
    logits.copy_(paddle.to_tensor(out, dtype="float32", place=paddle.CPUPlace()), True)
    return as_device(logits)


get_token_penalty_multi_scores = device_op(get_token_penalty_multi_scores)


def get_token_penalty_multi_scores_v25(pre_ids, prompt_ids, prompt_len, logits, penalty_scores, frequency_score,
                                       presence_score, temperatures, bad_tokens, bad_tokens_len, cur_len, min_len,
                                       eos_token_id):
    """FD 2.5+'s signature: ``bad_tokens_len`` after ``bad_tokens`` (per-slot bad words)."""
    if logits.dtype != paddle.float32:
        raise NotImplementedError("get_token_penalty_multi_scores is ported for float32 logits only")
    out = token_penalty_multi_scores_np(
        pre_ids.numpy(), prompt_ids.numpy(), prompt_len.numpy(), np.array(logits.numpy()), penalty_scores.numpy(),
        frequency_score.numpy(), presence_score.numpy(), temperatures.numpy(), bad_tokens.numpy(), cur_len.numpy(),
        min_len.numpy(), eos_token_id.numpy(), bad_tokens_len=bad_tokens_len.numpy())
    logits.copy_(paddle.to_tensor(out, dtype="float32", place=paddle.CPUPlace()), True)
    return as_device(logits)


get_token_penalty_multi_scores_v25 = device_op(get_token_penalty_multi_scores_v25)


class _NotPorted:
    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"FastDeploy op {self.__name__!r} has no port in fd_async_copy_plugin.testing.real_steps")


class OpNamespace(types.ModuleType):
    """``fastdeploy.model_executor.ops.gpu`` for one FastDeploy line; unknown names are not ported."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _NotPorted(name)


def op_namespace(line: str) -> OpNamespace:
    """The stand-in module for ``line`` (``"fd24"``; ``"fd25"`` and ``"fddev"`` use the 2.5 ops)."""
    replica = importlib.import_module(ROOTS["fd24" if line == "fd24" else "fd25"] + ".model_executor.ops.gpu")
    module = OpNamespace("fastdeploy.model_executor.ops.gpu")
    module.__file__ = __file__
    module.__dict__["fd_async_copy_real_steps_line"] = line
    for name, value in vars(replica).items():
        if not name.startswith("_") and callable(value) and getattr(value, "__module__", "").endswith(".model_executor.ops.gpu"):
            module.__dict__[name] = value
    module.__dict__["get_token_penalty_multi_scores"] = (
        get_token_penalty_multi_scores if line == "fd24" else get_token_penalty_multi_scores_v25)
    module.__dict__["tolerant_import_error"] = lambda: None
    return module


class CountGreaterKernel:
    """FastDeploy's Triton ``count_greater_kernel`` (``layers/sample/logprobs.py``, the token ranks
    of ``batched_count_greater_than``): ``kernel[grid](x_ptr=x, y_ptr=y, out_ptr=out, ...)`` writes
    ``out[b] = count(x[b, :] >= y[b, 0])`` as int64. Triton has no CPU driver; this is our port."""

    def __getitem__(self, grid):
        return self._launch

    @staticmethod
    def _run(x_ptr, y_ptr, out_ptr, n_elements=None, BLOCK_SIZE=None, num_warps=None, **_):
        counts = (x_ptr.numpy() >= y_ptr.numpy().reshape(-1, 1)).sum(-1).astype(np.int64)
        out_ptr.copy_(paddle.to_tensor(counts.reshape(out_ptr.shape), dtype="int64", place=paddle.CPUPlace()), True)

    _launch = staticmethod(device_op(_run.__func__))


#: FastDeploy's Triton kernels a decode step launches, by module and name -> our port
TRITON_KERNELS = {("fastdeploy.model_executor.layers.sample.logprobs", "count_greater_kernel"): CountGreaterKernel()}
