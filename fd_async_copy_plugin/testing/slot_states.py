"""Random FastDeploy slot states that reach every branch of the stop-flag ops.

Shared by the op tests (numpy reference vs the host C++ op) and ``benchmarks/gpu_kernel_check.py``
(CUDA kernel vs host C++), so both exercise the same state space. numpy only (the GPU machine has
no Paddle).

A batch is a dict of C-contiguous numpy arrays in FastDeploy's shapes (``[n, 1]`` columns,
``input_ids [max_bsz, L]``, ``block_tables [max_bsz, blocks_per_seq]``) plus the scalars
``block_size`` and ``prefill_one_step_stop``; ``stop_nums`` is an int64 ``[1]`` array or ``None``.
"""

from __future__ import annotations

import numpy as np

V1_ARRAYS = (
    "stop_flags", "not_need_stop", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder",
    "step_seq_lens_decoder", "prompt_lens", "topk_ids", "input_ids", "block_tables", "stop_nums",
    "next_tokens", "is_block_step",
)
V0_ARRAYS = (
    "stop_flags", "not_need_stop", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder",
    "input_ids", "stop_nums", "next_tokens", "is_block_step",
)
V1_BRANCHES = ("stopped", "stopped_in_prefill", "prefill_chunk", "one_step_stop", "decode", "block_step")
I32_MAX = 2**31 - 1


def _batch_sizes(rng, max_bsz, bsz):
    if max_bsz is None:
        max_bsz = int(rng.choice([1, 2, 7, 32, 33, 128, 255, 512, 1000, 1024]))
    if bsz is None:
        bsz = int(rng.choice([max_bsz, max_bsz, int(rng.integers(0, max_bsz + 1))]))
    return max_bsz, bsz


def _stop_nums(rng, max_bsz):
    # FD 2.4 passes max_num_seqs (== max_bsz); None is 2.5's "compare with max_bsz"; other
    # values check that the threshold really is read from the tensor.
    pick = rng.integers(0, 4)
    if pick == 0:
        return None
    value = max_bsz if pick < 3 else int(rng.integers(0, max_bsz + 2))
    return np.array([value], dtype=np.int64)


def random_v1_batch(rng: np.random.Generator, max_bsz: int | None = None, bsz: int | None = None) -> dict:
    max_bsz, bsz = _batch_sizes(rng, max_bsz, bsz)
    block_size = int(rng.choice([1, 16, 64, 128]))
    blocks_per_seq = int(rng.integers(1, 9))
    max_len = block_size * blocks_per_seq

    prompt_lens = rng.integers(1, max_len + 1, size=max_bsz).astype(np.int64)
    decoder = np.zeros(max_bsz, dtype=np.int32)
    this_time = np.zeros(max_bsz, dtype=np.int32)
    scenario = rng.integers(0, 4, size=max_bsz)
    for i in range(max_bsz):
        p = int(prompt_lens[i])
        if scenario[i] == 0:  # a prefill chunk that does not finish the prompt
            decoder[i] = rng.integers(0, p)
            this_time[i] = rng.integers(0, p - decoder[i])
        elif scenario[i] == 1:  # the final prefill chunk
            decoder[i] = rng.integers(0, p)
            this_time[i] = p - decoder[i] + rng.integers(0, 2)
        else:  # decoding; positions may run past the last block of the row
            decoder[i] = rng.integers(p, max_len + block_size + 1)
            this_time[i] = rng.integers(0, 3)
    # A few slots near int32 overflow: both implementations must wrap the same way.
    for i in rng.choice(max_bsz, size=min(max_bsz, 2), replace=False):
        if rng.random() < 0.3:
            decoder[i] = I32_MAX - rng.integers(0, 3)

    block_tables = rng.integers(0, 10_000, size=(max_bsz, blocks_per_seq)).astype(np.int32)
    block_tables[rng.random(block_tables.shape) < rng.choice([0.0, 0.2, 0.6])] = -1
    return {
        "stop_flags": (rng.random((max_bsz, 1)) < rng.choice([0.0, 0.3, 0.9])),
        "not_need_stop": np.array([rng.random() < 0.5]),
        "seq_lens_this_time": this_time[:bsz].reshape(bsz, 1).copy(),
        "seq_lens_encoder": rng.integers(0, 50, size=(max_bsz, 1)).astype(np.int32),
        "seq_lens_decoder": decoder.reshape(max_bsz, 1),
        "step_seq_lens_decoder": rng.integers(0, 50, size=(max_bsz, 1)).astype(np.int32),
        "prompt_lens": prompt_lens.reshape(max_bsz, 1),
        "topk_ids": rng.integers(0, 50_000, size=(bsz, 1)).astype(np.int64),
        "input_ids": rng.integers(0, 50_000, size=(max_bsz, int(rng.integers(1, 5)))).astype(np.int64),
        "block_tables": block_tables,
        "stop_nums": _stop_nums(rng, max_bsz),
        "next_tokens": rng.integers(0, 50_000, size=(max_bsz, 1)).astype(np.int64),
        "is_block_step": rng.random(max_bsz) < 0.2,
        "block_size": block_size,
        "prefill_one_step_stop": bool(rng.random() < 0.2),
    }


def random_v0_batch(rng: np.random.Generator, max_bsz: int | None = None, bsz: int | None = None) -> dict:
    max_bsz, bsz = _batch_sizes(rng, max_bsz, bsz)
    encoder = rng.integers(0, 300, size=(max_bsz, 1)).astype(np.int32)
    encoder[rng.random((max_bsz, 1)) < 0.6] = 0  # most slots decode
    decoder = rng.integers(0, 4096, size=(max_bsz, 1)).astype(np.int32)
    if max_bsz and rng.random() < 0.3:
        decoder[int(rng.integers(0, max_bsz))] = I32_MAX
    return {
        "stop_flags": rng.random((max_bsz, 1)) < rng.choice([0.0, 0.3, 0.9]),
        "not_need_stop": np.array([rng.random() < 0.5]),
        "seq_lens_this_time": rng.integers(0, 3, size=(bsz, 1)).astype(np.int32),
        "seq_lens_encoder": encoder,
        "seq_lens_decoder": decoder,
        "input_ids": rng.integers(0, 50_000, size=(max_bsz, int(rng.integers(1, 5)))).astype(np.int64),
        "stop_nums": _stop_nums(rng, max_bsz),
        "next_tokens": rng.integers(0, 50_000, size=(bsz, 1)).astype(np.int64),
        "is_block_step": rng.random(max_bsz) < rng.choice([0.0, 0.3]),
    }


def copy_batch(batch: dict) -> dict:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in batch.items()}


def v1_branch(batch: dict, i: int) -> str:
    """Which branch of update_inputs_v1 slot ``i`` (< bsz) of an unmodified batch takes."""
    this_time = int(batch["seq_lens_this_time"].reshape(-1)[i])
    decoder = int(batch["seq_lens_decoder"].reshape(-1)[i])
    consumed = (this_time + decoder + 2**31) % 2**32 - 2**31
    prompt_consumed = consumed >= int(batch["prompt_lens"].reshape(-1)[i])
    if batch["stop_flags"].reshape(-1)[i]:
        return "stopped" if prompt_consumed else "stopped_in_prefill"
    if not prompt_consumed:
        return "prefill_chunk"
    if batch["prefill_one_step_stop"]:
        return "one_step_stop"
    tables = batch["block_tables"]
    column = abs(consumed) // batch["block_size"] * (1 if consumed >= 0 else -1)
    flat = i * tables.shape[1] + column
    has_block = 0 <= flat < tables.size and tables.reshape(-1)[flat] != -1
    return "decode" if has_block else "block_step"
