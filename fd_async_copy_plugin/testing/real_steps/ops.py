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
PORTED_HERE = ("get_token_penalty_multi_scores", "custom_numpy_to_tensor")


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


def get_token_penalty_multi_scores_dev(token_ids_all, logits, penalty_scores, frequency_score, presence_score,
                                       temperatures, bad_tokens, bad_tokens_len, prompt_len, cur_len, min_len,
                                       eos_token_id):
    """develop's signature: one ``token_ids_all`` row per slot (prompt, then generated ids): the
    prompt part marks repeated ids, the rest counts generated ones - the 2.5 kernel's counts."""
    if logits.dtype != paddle.float32:
        raise NotImplementedError("get_token_penalty_multi_scores is ported for float32 logits only")
    ids_all, lens = token_ids_all.numpy(), prompt_len.numpy().reshape(-1)
    width = ids_all.shape[1]
    generated = np.full_like(ids_all, -1)
    for bi in range(ids_all.shape[0]):
        n = int(lens[bi]) if bi < lens.shape[0] else 0
        generated[bi, : width - n] = ids_all[bi, n:]
    out = token_penalty_multi_scores_np(
        generated, ids_all, prompt_len.numpy(), np.array(logits.numpy()), penalty_scores.numpy(),
        frequency_score.numpy(), presence_score.numpy(), temperatures.numpy(), bad_tokens.numpy(), cur_len.numpy(),
        min_len.numpy(), eos_token_id.numpy(), bad_tokens_len=bad_tokens_len.numpy())
    logits.copy_(paddle.to_tensor(out, dtype="float32", place=paddle.CPUPlace()), True)
    return as_device(logits)


get_token_penalty_multi_scores_dev = device_op(get_token_penalty_multi_scores_dev)


def set_stop_value_multi_ends_dev(topk_ids, stop_flags, seq_lens, end_ids, next_tokens, token_ids_all, prompt_lens,
                                  step_idx, stop_seqs, stop_seqs_len, min_tokens, beam_search):
    """develop's signature: stop sequences matched against the generated part of ``token_ids_all``
    (from ``prompt_lens``); otherwise the 2.5 kernel (``reference/kernels.set_stop_value_multi_ends``)."""
    import os

    from ..reference import kernels

    ids_all, lens = token_ids_all.numpy(), prompt_lens.numpy().reshape(-1)
    pre_ids = np.full_like(ids_all, -1)
    for bi in range(min(ids_all.shape[0], lens.shape[0])):
        pre_ids[bi, : ids_all.shape[1] - int(lens[bi])] = ids_all[bi, int(lens[bi]):]
    topk, stop, nxt = np.array(topk_ids.numpy()), np.array(stop_flags.numpy()), np.array(next_tokens.numpy())
    kernels.set_stop_value_multi_ends(
        topk, stop, seq_lens.numpy(), end_ids.numpy(), nxt, pre_ids, step_idx.numpy(), stop_seqs.numpy(),
        stop_seqs_len.numpy(), beam_search, os.getenv("PREFILL_NODE_ONE_STEP_STOP", "")[:1] == "1",
        min_tokens=min_tokens.numpy())
    for t, a in ((topk_ids, topk), (stop_flags, stop), (next_tokens, nxt)):
        t.copy_(paddle.to_tensor(a, dtype=t.dtype, place=paddle.CPUPlace()), True)


set_stop_value_multi_ends_dev = device_op(set_stop_value_multi_ends_dev)


def custom_numpy_to_tensor(numpy_array, tensor):
    """develop's ``custom_numpy_to_tensor`` (``cpp_extensions.cc``): the array's bytes copied to the
    tensor's data pointer (an H2D ``cudaMemcpyAsync`` on the GPU; here a memmove, which is what the
    copy leaves behind once it ran). Returns ``tensor``."""
    import ctypes

    array = np.ascontiguousarray(numpy_array)
    ctypes.memmove(tensor.data_ptr(), array.ctypes.data, array.nbytes)
    return tensor


def set_value_by_flags_and_idx_dev(token_ids_all, input_ids, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder,
                                   prompt_lens, step_idx, stop_flags):
    """develop's ``set_value_by_flags_and_idx``: the step's input token into ``token_ids_all`` (prompt
    and outputs in one row) at ``prompt_lens + step_idx``, for running slots with a context."""
    ids_all = np.array(token_ids_all.numpy())
    inputs, enc, dec = input_ids.numpy(), seq_lens_encoder.numpy().reshape(-1), seq_lens_decoder.numpy().reshape(-1)
    prompt, step, stop = prompt_lens.numpy().reshape(-1), step_idx.numpy().reshape(-1), stop_flags.numpy().reshape(-1)
    for i in range(int(seq_lens_this_time.shape[0])):
        if stop[i] or (dec[i] == 0 and enc[i] == 0) or step[i] <= 0:
            continue
        ids_all[i, prompt[i] + step[i]] = inputs[i, enc[i] - 1] if enc[i] > 0 else inputs[i, 0]
    token_ids_all.copy_(paddle.to_tensor(ids_all, place=paddle.CPUPlace()), True)


set_value_by_flags_and_idx_dev = device_op(set_value_by_flags_and_idx_dev)


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
    if line == "fddev":
        module.__dict__["custom_numpy_to_tensor"] = custom_numpy_to_tensor
        module.__dict__["set_value_by_flags_and_idx"] = set_value_by_flags_and_idx_dev
        module.__dict__["get_token_penalty_multi_scores"] = get_token_penalty_multi_scores_dev
        module.__dict__["set_stop_value_multi_ends"] = set_stop_value_multi_ends_dev
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
