"""The numpy statement of FD 2.4's update_inputs_v1 / update_inputs, pinned one branch at a time.

These cases are written from fastdeploy-surface.md 5.1/5.2, independently of the C++ code, so the
random comparisons in test_stop_flag_host_op.py compare two implementations against a spec that
is itself tested.
"""

import numpy as np
import pytest

from fd_async_copy_plugin.testing.reference.update_inputs_semantics import update_inputs_np, update_inputs_v1_np


def v1_state(stop, this_time, decoder, prompt, *, max_bsz=None, block_size=4, table_row=(7, 8, -1, 9)):
    """Slots described by parallel lists; every slot has the same block table row."""
    bsz = len(stop)
    max_bsz = max_bsz or bsz
    pad = max_bsz - bsz
    return {
        "stop_flags": np.array(list(stop) + [True] * pad, dtype=bool).reshape(-1, 1),
        "not_need_stop": np.array([False]),
        "seq_lens_this_time": np.array(this_time, dtype=np.int32).reshape(-1, 1),
        "seq_lens_encoder": np.full((max_bsz, 1), 5, dtype=np.int32),
        "seq_lens_decoder": np.array(list(decoder) + [0] * pad, dtype=np.int32).reshape(-1, 1),
        "step_seq_lens_decoder": np.full((max_bsz, 1), 33, dtype=np.int32),
        "prompt_lens": np.array(list(prompt) + [1] * pad, dtype=np.int64).reshape(-1, 1),
        "topk_ids": np.arange(100, 100 + bsz, dtype=np.int64).reshape(-1, 1),
        "input_ids": np.zeros((max_bsz, 3), dtype=np.int64),
        "block_tables": np.array([table_row] * max_bsz, dtype=np.int32),
        "stop_nums": np.array([max_bsz], dtype=np.int64),
        "next_tokens": np.arange(500, 500 + max_bsz, dtype=np.int64).reshape(-1, 1),
        "is_block_step": np.zeros(max_bsz, dtype=bool),
    }


def run_v1(s, block_size=4, one_step=False):
    return update_inputs_v1_np(
        s["stop_flags"], s["not_need_stop"], s["seq_lens_this_time"], s["seq_lens_encoder"],
        s["seq_lens_decoder"], s["step_seq_lens_decoder"], s["prompt_lens"], s["topk_ids"],
        s["input_ids"], s["block_tables"], s["stop_nums"], s["next_tokens"], s["is_block_step"],
        block_size, prefill_one_step_stop=one_step,
    )


def col(a):
    return a.reshape(-1).tolist()


def test_v1_decode_step_advances_and_feeds_next_token():
    s = v1_state(stop=[False], this_time=[1], decoder=[5], prompt=[3])
    assert run_v1(s) is True
    assert col(s["seq_lens_decoder"]) == [6] and col(s["seq_lens_this_time"]) == [1]
    assert col(s["seq_lens_encoder"]) == [0]
    assert s["input_ids"][0].tolist() == [500, 0, 0]
    assert col(s["stop_flags"]) == [False] and col(s["topk_ids"]) == [100]
    assert s["not_need_stop"].tolist() == [True]


def test_v1_final_prefill_chunk_becomes_decode():
    s = v1_state(stop=[False], this_time=[3], decoder=[4], prompt=[7])
    assert run_v1(s) is True
    assert col(s["seq_lens_decoder"]) == [7] and col(s["seq_lens_this_time"]) == [1]


def test_v1_nonfinal_prefill_chunk_parks_slot_and_voids_token():
    s = v1_state(stop=[False], this_time=[2], decoder=[4], prompt=[7])
    assert run_v1(s) is False
    assert col(s["stop_flags"]) == [True] and col(s["topk_ids"]) == [-1]
    assert col(s["seq_lens_this_time"]) == col(s["seq_lens_decoder"]) == col(s["seq_lens_encoder"]) == [0]
    assert s["input_ids"][0, 0] == 0  # no next token fed


def test_v1_stopped_in_prefill_voids_token_stopped_after_prompt_keeps_it():
    s = v1_state(stop=[True, True], this_time=[2, 1], decoder=[4, 9], prompt=[7, 7])
    assert run_v1(s) is False
    assert col(s["topk_ids"]) == [-1, 101]  # FD's own numpy test omits this rule
    assert col(s["seq_lens_decoder"]) == [0, 0] and col(s["seq_lens_encoder"]) == [0, 0]


def test_v1_one_step_stop_stops_after_prefill_without_feeding_token():
    s = v1_state(stop=[False], this_time=[7], decoder=[0], prompt=[7])
    assert run_v1(s, one_step=True) is False
    assert col(s["stop_flags"]) == [True] and col(s["topk_ids"]) == [100]
    assert col(s["seq_lens_decoder"]) == [0] and s["input_ids"][0, 0] == 0


def test_v1_missing_kv_block_is_a_block_step():
    # position 9 -> column 9 // 4 = 2, which is -1 in the table row
    s = v1_state(stop=[False], this_time=[1], decoder=[8], prompt=[3])
    assert run_v1(s) is False
    assert col(s["is_block_step"]) == [True] and col(s["stop_flags"]) == [True]
    assert col(s["step_seq_lens_decoder"]) == [9] and col(s["seq_lens_decoder"]) == [0]
    assert col(s["seq_lens_this_time"]) == [0]
    assert s["input_ids"][0, 0] == 500  # the token is fed before the block check, as in FD


def test_v1_block_column_past_row_reads_next_row_like_fd():
    # row length 4, block_size 1: position 5 -> column 5 -> flat 0*4+5 = row 1, column 1
    s = v1_state(stop=[False, False], this_time=[1, 1], decoder=[4, 0], prompt=[1, 1],
                 table_row=(1, -1, 1, 1))
    run_v1(s, block_size=1)
    assert col(s["is_block_step"])[0] is True
    s = v1_state(stop=[False, False], this_time=[1, 1], decoder=[4, 0], prompt=[1, 1],
                 table_row=(1, 1, 1, 1))
    run_v1(s, block_size=1)
    assert col(s["is_block_step"])[0] is False
    # past the end of the whole table: treated as no block (FD would read foreign memory)
    s = v1_state(stop=[False], this_time=[1], decoder=[40], prompt=[1], table_row=(1, 1, 1, 1))
    run_v1(s, block_size=1)
    assert col(s["is_block_step"]) == [True]


def test_v1_empty_slots_count_as_stopped_and_stop_nums_is_the_threshold():
    s = v1_state(stop=[True], this_time=[1], decoder=[9], prompt=[3], max_bsz=4)
    assert run_v1(s) is False  # 1 stopped + 3 empty == 4 == stop_nums
    s = v1_state(stop=[False], this_time=[1], decoder=[1], prompt=[1], max_bsz=4)
    untouched = s["seq_lens_decoder"][1:].copy()
    assert run_v1(s) is True
    assert (s["seq_lens_decoder"][1:] == untouched).all()  # slots >= bsz are not written
    s = v1_state(stop=[True], this_time=[1], decoder=[9], prompt=[3], max_bsz=4)
    s["stop_nums"] = None  # FD 2.5: compare with max_bsz
    assert run_v1(s) is False
    s = v1_state(stop=[True], this_time=[1], decoder=[9], prompt=[3], max_bsz=4)
    s["stop_nums"] = np.array([5], dtype=np.int64)
    assert run_v1(s) is True


def test_v1_rejects_batches_over_1024():
    s = v1_state(stop=[False], this_time=[1], decoder=[1], prompt=[1], max_bsz=1025)
    with pytest.raises(ValueError, match="1024"):
        run_v1(s)


def v0_state(stop, encoder, decoder, block_step, max_bsz=None):
    bsz = len(stop)
    max_bsz = max_bsz or bsz
    pad = max_bsz - bsz
    return {
        "stop_flags": np.array(list(stop) + [True] * pad, dtype=bool).reshape(-1, 1),
        "not_need_stop": np.array([False]),
        "seq_lens_this_time": np.full((bsz, 1), 9, dtype=np.int32),
        "seq_lens_encoder": np.array(list(encoder) + [0] * pad, dtype=np.int32).reshape(-1, 1),
        "seq_lens_decoder": np.array(list(decoder) + [0] * pad, dtype=np.int32).reshape(-1, 1),
        "input_ids": np.zeros((max_bsz, 2), dtype=np.int64),
        "stop_nums": np.array([max_bsz], dtype=np.int64),
        "next_tokens": np.arange(70, 70 + bsz, dtype=np.int64).reshape(-1, 1),
        "is_block_step": np.array(list(block_step) + [False] * pad, dtype=bool),
    }


def run_v0(s):
    return update_inputs_np(*(s[k] for k in (
        "stop_flags", "not_need_stop", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder",
        "input_ids", "stop_nums", "next_tokens", "is_block_step")))


def test_v0_lengths_after_prefill_decode_and_stop():
    s = v0_state(stop=[False, False, True], encoder=[6, 0, 4], decoder=[2, 10, 10], block_step=[False] * 3)
    assert run_v0(s) is True
    assert col(s["seq_lens_decoder"]) == [8, 11, 0]
    assert col(s["seq_lens_this_time"]) == [1, 1, 0]
    assert col(s["seq_lens_encoder"]) == [0, 0, 0]
    assert s["input_ids"][:, 0].tolist() == [70, 71, 72]  # also for the stopped slot


def test_v0_block_step_slot_keeps_batch_alive():
    s = v0_state(stop=[True, True], encoder=[0, 0], decoder=[1, 1], block_step=[True, False])
    assert run_v0(s) is True
    s = v0_state(stop=[True, True], encoder=[0, 0], decoder=[1, 1], block_step=[False, False])
    assert run_v0(s) is False
    assert s["not_need_stop"].tolist() == [False]


def test_non_contiguous_arrays_are_rejected_not_silently_dropped():
    s = v0_state(stop=[False] * 3, encoder=[0] * 3, decoder=[1] * 3, block_step=[False] * 3)
    s["seq_lens_decoder"] = np.zeros((3, 2), dtype=np.int32)[:, :1]
    with pytest.raises(ValueError, match="contiguous"):
        run_v0(s)
