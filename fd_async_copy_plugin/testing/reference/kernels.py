"""Per-slot semantics of FastDeploy's GPU ops used around the patch points, on numpy arrays.

Written from the op descriptions in fastdeploy-surface.md and checked by reading the CUDA
sources (``custom_ops/gpu_ops/*.cu``) of 2.4 and 2.5. Each function works in place on the arrays
it is given, one loop iteration per slot (a CUDA thread or block in FastDeploy). The replica's op
wrappers (``fd24/.../ops/gpu``, ``fd25/.../ops/gpu``) convert tensors to arrays, call these and
write the in-place outputs back. ``update_inputs`` / ``update_inputs_v1`` live in
``update_inputs_semantics.py``.
"""

from __future__ import annotations

import numpy as np


def get_padding_offset(input_ids: np.ndarray, seq_lens: np.ndarray):
    """Pack the first ``seq_lens[i]`` ids of each row (``get_padding_offset.cu``).

    Returns ``ids_remove_padding [T]`` int64, ``batch_id_per_token [T]`` int32 and
    ``cu_seqlens_q``/``cu_seqlens_k [bsz + 1]`` int32.
    """
    seq_lens = seq_lens.reshape(-1).astype(np.int64)
    bsz = seq_lens.shape[0]
    cu = np.zeros([bsz + 1], dtype=np.int32)
    cu[1:] = np.cumsum(seq_lens)
    token_num = int(cu[-1])
    ids = np.empty([token_num], dtype=np.int64)
    batch_ids = np.empty([token_num], dtype=np.int32)
    for bi in range(bsz):
        n = int(seq_lens[bi])
        if n <= 0:
            continue
        ids[cu[bi] : cu[bi] + n] = input_ids[bi, :n]
        batch_ids[cu[bi] : cu[bi] + n] = bi
    return ids, batch_ids, cu.copy(), cu.copy()


def rebuild_padding_rows(cu_seqlens_q, seq_lens_this_time, seq_lens_decoder, seq_lens_encoder) -> np.ndarray:
    """Row of the packed hidden states whose output each slot gets, or -1 for a zero row.

    ``rebuild_padding.cu``: a slot with no tokens this step or no context gets zeros; an encoder
    (prefill) slot takes its last token, a decoder slot its only token.
    """
    this_time = seq_lens_this_time.reshape(-1)
    bsz = this_time.shape[0]
    dec = seq_lens_decoder.reshape(-1)[:bsz]
    enc = seq_lens_encoder.reshape(-1)[:bsz]
    cu = cu_seqlens_q.reshape(-1)
    rows = np.full([bsz], -1, dtype=np.int64)
    for bi in range(bsz):
        if this_time[bi] == 0 or (dec[bi] == 0 and enc[bi] == 0):
            continue
        seq_id = enc[bi] - 1 if enc[bi] > 0 else 0
        rows[bi] = cu[bi] + seq_id
    return rows


def set_value_by_flags_and_idx(pre_ids, input_ids, seq_lens_encoder, seq_lens_decoder, step_idx, stop_flags, bs):
    """Record the step's input token in ``pre_ids[step_idx]`` (``set_value_by_flags_and_idx.cu``)."""
    stop = stop_flags.reshape(-1)
    enc = seq_lens_encoder.reshape(-1)
    dec = seq_lens_decoder.reshape(-1)
    step = step_idx.reshape(-1)
    for i in range(bs):
        if stop[i] or (dec[i] == 0 and enc[i] == 0):
            continue
        if step[i] > 0:
            pre_ids[i, step[i]] = input_ids[i, enc[i] - 1] if enc[i] > 0 else input_ids[i, 0]


def set_stop_value_multi_ends(
    topk_ids,
    stop_flags,
    seq_lens,
    end_ids,
    next_tokens,
    pre_ids,
    step_idx,
    stop_seqs,
    stop_seqs_len,
    beam_search: bool,
    prefill_one_step_stop: bool,
    min_tokens=None,
):
    """Eos / stop-sequence / stopped-slot handling (``stop_generation_multi_ends.cu``).

    ``min_tokens`` is the 2.5 argument: eos and stop sequences only count from ``step_idx >=
    min_tokens``. Stop sequences are matched against ``pre_ids`` up to ``step_idx - 1``, i.e. the
    tokens recorded before this step, as the kernel does.
    """
    topk = topk_ids.reshape(-1)
    stop = stop_flags.reshape(-1)
    lens = seq_lens.reshape(-1)
    nxt = next_tokens.reshape(-1)
    ends = end_ids.reshape(-1)
    step = step_idx.reshape(-1)
    bs = topk.shape[0]
    stop_seqs_bs = stop_seqs.shape[1]
    if stop_seqs_bs <= 0:  # the kernel's threads all return
        return
    can_stop = np.ones([bs], dtype=bool) if min_tokens is None else step[:bs] >= min_tokens.reshape(-1)[:bs]
    # Thread 0 of each slot's block: stopped slots, then eos.
    if prefill_one_step_stop:
        stop[:bs] = True
        topk[lens[:bs] == 0] = -1
        nxt[:bs] = topk
    else:
        stopped = stop[:bs].copy()
        idle = stopped & (lens[:bs] == 0)
        finishing = stopped & (lens[:bs] != 0)
        topk[idle] = -1
        topk[finishing] = ends[0]
        nxt[:bs][finishing] = ends[0]
        nxt[:bs][~stopped] = topk[~stopped]
    if not beam_search:
        is_end = np.isin(topk, ends) & can_stop
        stop[:bs][is_end] = True
        topk[is_end] = ends[0]
        nxt[:bs][is_end] = ends[0]
    # One thread per stop sequence. Only slots with a stop sequence can match.
    for bid in np.flatnonzero((stop_seqs_len[:bs] > 0).any(axis=1) & can_stop):
        now = int(step[bid])
        for tid in range(stop_seqs_bs):
            n = int(stop_seqs_len[bid, tid])
            if n <= 0 or now - n < 0:
                continue
            if np.array_equal(pre_ids[bid, now - n : now], stop_seqs[bid, tid, :n]):
                nxt[bid] = ends[0]
                stop[bid] = True
                topk[bid] = ends[0]


def recover_decode_task(
    stop_flags, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder,
    block_tables, is_block_step, block_size: int,
):
    """Resume block-step slots whose next KV block now exists (``recover_decode_task.cu``)."""
    bsz = seq_lens_this_time.reshape(-1).shape[0]
    stop = stop_flags.reshape(-1)
    this_time = seq_lens_this_time.reshape(-1)
    enc = seq_lens_encoder.reshape(-1)
    dec = seq_lens_decoder.reshape(-1)
    step_dec = step_seq_lens_decoder.reshape(-1)
    block_step = is_block_step.reshape(-1)
    for i in range(bsz):
        if not block_step[i]:
            continue
        if block_tables[i, step_dec[i] // block_size] != -1:
            block_step[i] = False
            this_time[i] = 1
            stop[i] = False
            enc[i] = 0
            dec[i] = step_dec[i]
