"""FastDeploy 2.4's ``update_inputs_v1`` / ``update_inputs`` semantics, stated in numpy.

This is the plain-language statement of what the stop-flag ops do to ``share_inputs`` after each
step (fastdeploy-surface.md 5.1/5.2). The C++/CUDA implementations in ``custom_ops/`` must agree
with it bit for bit; the tests and ``benchmarks/gpu_kernel_check.py`` compare them on random slot
states. It is also what the reference FastDeploy replica calls for its own ``update_inputs*``.

Conventions (as in FastDeploy):

- ``bsz = len(seq_lens_this_time)`` is the number of running slots; ``max_bsz = len(stop_flags)``.
  Only slots ``i < bsz`` are read or written. Slots ``bsz <= i < max_bsz`` are empty and count as
  stopped.
- ``not_need_stop`` ("some slot still decodes") is ``stopped_slots < stop_nums[0]`` (FD 2.4, where
  ``stop_nums == max_num_seqs``), or ``stopped_slots < max_bsz`` when ``stop_nums`` is ``None``
  (FD 2.5+, which dropped ``stop_nums``).
- Arrays are modified in place (2-D ``[n, 1]`` arrays are fine; they must be C-contiguous so that
  in-place writes reach the caller). ``not_need_stop`` may be a ``[1]`` bool array (written) or
  ``None``. The new ``not_need_stop`` is returned.
- Lengths are int32 and wrap like the GPU does; ``block_size`` must be positive.
- ``max_bsz`` must be <= 1024 (one CUDA block in FD's kernels); larger raises ``ValueError``.
"""

from __future__ import annotations

import numpy as np

MAX_BATCH = 1024

__all__ = ["MAX_BATCH", "update_inputs_np", "update_inputs_v1_np"]


def update_inputs_v1_np(
    stop_flags,
    not_need_stop,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    step_seq_lens_decoder,
    prompt_lens,
    topk_ids,
    input_ids,
    block_tables,
    stop_nums,
    next_tokens,
    is_block_step,
    block_size: int,
    prefill_one_step_stop: bool = False,
) -> bool:
    """``update_inputs_v1`` (V1 scheduler), in place. Returns the new ``not_need_stop``.

    Per running slot ``i`` (``consumed = seq_lens_this_time[i] + seq_lens_decoder[i]``, the
    prompt/sequence position reached by this step):

    1. already stopped: if ``consumed < prompt_lens[i]`` (stopped in the middle of a chunked
       prefill, e.g. ``max_tokens=1``) the sampled token is voided, ``topk_ids[i] = -1``; the three
       lengths become 0. Counts as stopped.
    2. running, prompt not yet consumed (a non-final prefill chunk): ``stop_flags[i] = True``,
       lengths 0, ``topk_ids[i] = -1``. Counts as stopped; the scheduler inserts the next chunk.
    3. running, prompt consumed, ``prefill_one_step_stop`` (env ``PREFILL_NODE_ONE_STEP_STOP_V1``
       starting with ``1``; a prefill node of a P/D split): ``stop_flags[i] = True``, lengths 0.
       Counts as stopped.
    4. otherwise a decode step: ``seq_lens_decoder = consumed``, ``seq_lens_this_time = 1``,
       ``seq_lens_encoder = 0``, ``input_ids[i, 0] = next_tokens[i]``. Then, if the KV block for
       position ``seq_lens_decoder`` is missing (``block_tables[i, decoder // block_size] == -1``):
       block step - ``is_block_step[i] = True``, ``seq_lens_this_time = 0``,
       ``stop_flags[i] = True``, ``step_seq_lens_decoder = seq_lens_decoder``,
       ``seq_lens_decoder = 0``; counts as stopped. Else it keeps decoding.

    FD does not bounds-check the block-table column: a column past the row reads the next row
    (flat index ``i * blocks_per_seq + column``). We read the same flat element while it lies
    inside ``block_tables``; a flat index outside it counts as a missing block. The division
    truncates toward zero, as in C.
    """
    stop_flags_ = _flat(stop_flags, "stop_flags")
    this_time = _flat(seq_lens_this_time, "seq_lens_this_time")
    encoder = _flat(seq_lens_encoder, "seq_lens_encoder")
    decoder = _flat(seq_lens_decoder, "seq_lens_decoder")
    step_decoder = _flat(step_seq_lens_decoder, "step_seq_lens_decoder")
    prompt = _flat(prompt_lens, "prompt_lens")
    topk = _flat(topk_ids, "topk_ids")
    ids = np.asarray(input_ids)
    ids_flat = _flat(input_ids, "input_ids")
    ids_stride = _row_stride(ids)
    tables = np.asarray(block_tables)
    tables_flat = tables.reshape(-1)
    tables_stride = _row_stride(tables)
    next_ = _flat(next_tokens, "next_tokens")
    block_step = _flat(is_block_step, "is_block_step")
    bsz, max_bsz = len(this_time), len(stop_flags_)
    _check_batch(bsz, max_bsz)
    if block_size <= 0:
        raise ValueError("block_size must be positive")

    stopped_slots = max_bsz - bsz  # empty slots
    for i in range(bsz):
        consumed = _wrap_i32(int(this_time[i]) + int(decoder[i]))
        prompt_consumed = consumed >= int(prompt[i])

        if stop_flags_[i]:
            if not prompt_consumed:
                topk[i] = -1
            this_time[i] = decoder[i] = encoder[i] = 0
            stopped_slots += 1
            continue
        if not prompt_consumed:
            stop_flags_[i] = True
            this_time[i] = decoder[i] = encoder[i] = 0
            topk[i] = -1
            stopped_slots += 1
            continue
        if prefill_one_step_stop:
            stop_flags_[i] = True
            this_time[i] = decoder[i] = encoder[i] = 0
            stopped_slots += 1
            continue

        decoder[i] = consumed
        this_time[i] = 1
        encoder[i] = 0
        ids_flat[i * ids_stride] = next_[i]
        flat = i * tables_stride + _c_div(consumed, block_size)
        has_block = 0 <= flat < tables_flat.size and int(tables_flat[flat]) != -1
        if not has_block:
            block_step[i] = True
            this_time[i] = 0
            stop_flags_[i] = True
            step_decoder[i] = consumed
            decoder[i] = 0
            stopped_slots += 1

    return _write_not_need_stop(not_need_stop, stopped_slots, stop_nums, max_bsz)


def update_inputs_np(
    stop_flags,
    not_need_stop,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    input_ids,
    stop_nums,
    next_tokens,
    is_block_step,
) -> bool:
    """``update_inputs`` (non-V1 scheduler), in place. Returns the new ``not_need_stop``.

    Per running slot ``i`` with ``stop = stop_flags[i]`` (``stop_flags`` and ``is_block_step`` are
    only read):

    - ``seq_lens_decoder = 0`` if stopped; else ``encoder + decoder`` after a prefill
      (``seq_lens_encoder > 0``), ``decoder + 1`` after a decode step;
    - ``seq_lens_this_time = 0 if stop else 1``; ``seq_lens_encoder = 0``;
    - ``input_ids[i, 0] = next_tokens[i]``, also for stopped slots;
    - counts as stopped iff ``stop and not is_block_step[i]`` (a block-step slot waits for KV
      blocks and will resume, so it keeps the batch alive).
    """
    stop_flags_ = np.asarray(stop_flags).reshape(-1)
    this_time = _flat(seq_lens_this_time, "seq_lens_this_time")
    encoder = _flat(seq_lens_encoder, "seq_lens_encoder")
    decoder = _flat(seq_lens_decoder, "seq_lens_decoder")
    ids = np.asarray(input_ids)
    ids_flat = _flat(input_ids, "input_ids")
    ids_stride = _row_stride(ids)
    next_ = np.asarray(next_tokens).reshape(-1)
    block_step = np.asarray(is_block_step).reshape(-1)
    bsz, max_bsz = len(this_time), len(stop_flags_)
    _check_batch(bsz, max_bsz)

    stopped_slots = max_bsz - bsz  # empty slots
    for i in range(bsz):
        stop = bool(stop_flags_[i])
        enc, dec = int(encoder[i]), int(decoder[i])
        if stop:
            decoder[i] = 0
        elif enc > 0:
            decoder[i] = _wrap_i32(enc + dec)
        else:
            decoder[i] = _wrap_i32(dec + 1)
        this_time[i] = 0 if stop else 1
        encoder[i] = 0
        ids_flat[i * ids_stride] = next_[i]
        if stop and not block_step[i]:
            stopped_slots += 1

    return _write_not_need_stop(not_need_stop, stopped_slots, stop_nums, max_bsz)


# --- helpers ---------------------------------------------------------------------------------


def _flat(a, name: str) -> np.ndarray:
    """A 1-D view that writes through to ``a`` (a reshape of a non-contiguous array would copy)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array (got {type(a).__name__})")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous so in-place updates reach the caller")
    return a.reshape(-1)


def _row_stride(a: np.ndarray) -> int:
    return int(a.shape[1]) if a.ndim >= 2 else 1


def _check_batch(bsz: int, max_bsz: int) -> None:
    if max_bsz > MAX_BATCH:
        raise ValueError(
            f"max_bsz={max_bsz} exceeds {MAX_BATCH}, the one-block limit of the stop-flag kernel"
        )
    if bsz > max_bsz:
        raise ValueError(f"bsz={bsz} (seq_lens_this_time) exceeds max_bsz={max_bsz} (stop_flags)")


def _wrap_i32(x: int) -> int:
    return (x + 2**31) % 2**32 - 2**31


def _c_div(a: int, b: int) -> int:
    """Integer division truncating toward zero (C), not flooring (Python)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _write_not_need_stop(not_need_stop, stopped_slots: int, stop_nums, max_bsz: int) -> bool:
    threshold = max_bsz if stop_nums is None else int(np.asarray(stop_nums).reshape(-1)[0])
    result = stopped_slots < threshold
    if not_need_stop is not None:
        _flat(not_need_stop, "not_need_stop")[0] = result
    return result
