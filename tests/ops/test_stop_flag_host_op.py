"""The host C++ stop-flag ops (the shared per-slot header compiled with g++, called through the
Paddle pybind module on real CPU tensors) against the numpy reference, and get_stop/set_stop."""

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.ops import load_ops
from fd_async_copy_plugin.testing.slot_states import (
    V0_ARRAYS, V1_ARRAYS, V1_BRANCHES, copy_batch, random_v0_batch, random_v1_batch, v1_branch,
)
from fd_async_copy_plugin.testing.reference.update_inputs_semantics import update_inputs_np, update_inputs_v1_np


@pytest.fixture(scope="module")
def ops():
    return load_ops(build=True)  # a no-op when the build in the ops dir is current


def to_paddle(batch, names):
    return {n: (None if batch[n] is None else paddle.to_tensor(batch[n])) for n in names}


def assert_same(expected, tensors, names, context):
    for n in names:
        if expected[n] is None:
            continue
        got = tensors[n].numpy()
        assert got.dtype == expected[n].dtype, (n, context)
        np.testing.assert_array_equal(got, expected[n], err_msg=f"{n} differs ({context})")


def test_v1_host_op_matches_reference_on_random_slot_states(ops):
    rng = np.random.default_rng(20240611)
    slots, branches, partial_batches, full_size = 0, dict.fromkeys(V1_BRANCHES, 0), 0, 0
    batch_index = 0
    while slots < 12_000 or batch_index < 40:
        batch = random_v1_batch(rng)
        bsz, max_bsz = len(batch["seq_lens_this_time"]), len(batch["stop_flags"])
        for i in range(bsz):
            branches[v1_branch(batch, i)] += 1
        tensors = to_paddle(batch, V1_ARRAYS)
        expected = copy_batch(batch)
        want = update_inputs_v1_np(
            *(expected[n] for n in V1_ARRAYS), expected["block_size"],
            prefill_one_step_stop=expected["prefill_one_step_stop"],
        )
        ops.update_inputs_v1_host(
            *(tensors[n] for n in V1_ARRAYS), batch["block_size"],
            prefill_one_step_stop=batch["prefill_one_step_stop"],
        )
        context = f"batch {batch_index}, bsz={bsz}, max_bsz={max_bsz}"
        assert_same(expected, tensors, V1_ARRAYS, context)
        assert bool(tensors["not_need_stop"].numpy()[0]) == want, context
        slots += bsz
        partial_batches += bsz < max_bsz
        full_size += max_bsz == 1024
        batch_index += 1
    assert slots >= 10_000
    assert min(branches.values()) >= 100, branches  # every branch is really exercised
    assert partial_batches and full_size


def test_v0_host_op_matches_reference_on_random_slot_states(ops):
    rng = np.random.default_rng(7)
    slots = batch_index = 0
    while slots < 10_000 or batch_index < 30:
        batch = random_v0_batch(rng)
        tensors = to_paddle(batch, V0_ARRAYS)
        expected = copy_batch(batch)
        want = update_inputs_np(*(expected[n] for n in V0_ARRAYS))
        ops.update_inputs_host(*(tensors[n] for n in V0_ARRAYS))
        assert_same(expected, tensors, V0_ARRAYS, f"batch {batch_index}")
        assert bool(tensors["not_need_stop"].numpy()[0]) == want
        slots += len(batch["seq_lens_this_time"])
        batch_index += 1


def test_one_step_stop_is_read_from_fd_environment_variable(ops, monkeypatch):
    def run():
        batch = random_v1_batch(np.random.default_rng(3), max_bsz=8, bsz=8)
        batch["stop_flags"][:] = False
        batch["seq_lens_decoder"][:] = batch["prompt_lens"].astype(np.int32)  # prompts consumed
        tensors = to_paddle(batch, V1_ARRAYS)
        ops.update_inputs_v1_host(*(tensors[n] for n in V1_ARRAYS), batch["block_size"])
        return tensors["stop_flags"].numpy().all()

    monkeypatch.setenv("PREFILL_NODE_ONE_STEP_STOP_V1", "1")
    assert run()
    monkeypatch.setenv("PREFILL_NODE_ONE_STEP_STOP_V1", "0")
    assert not run()


def test_batches_over_1024_slots_are_refused_before_anything_is_written(ops):
    batch = random_v1_batch(np.random.default_rng(1), max_bsz=1024, bsz=1024)
    batch["stop_flags"] = np.zeros((1025, 1), dtype=bool)
    tensors = to_paddle(batch, V1_ARRAYS)
    before = tensors["seq_lens_decoder"].numpy().copy()
    with pytest.raises(Exception, match="exceeds 1024"):
        ops.update_inputs_v1_host(*(tensors[n] for n in V1_ARRAYS), batch["block_size"])
    np.testing.assert_array_equal(tensors["seq_lens_decoder"].numpy(), before)

    batch = random_v0_batch(np.random.default_rng(1), max_bsz=1024, bsz=1024)
    batch["stop_flags"] = np.zeros((1025, 1), dtype=bool)
    tensors = to_paddle(batch, V0_ARRAYS)
    with pytest.raises(Exception, match="exceeds 1024"):
        ops.update_inputs_host(*(tensors[n] for n in V0_ARRAYS))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b.update(input_ids=b["input_ids"].astype(np.int32)), "input_ids has dtype"),
        (lambda b: b.update(seq_lens_this_time=np.zeros((9, 1), np.int32)), "bsz"),
        (lambda b: b.update(topk_ids=b["topk_ids"][:2]), "topk_ids has 2 elements"),
    ],
)
def test_malformed_arguments_raise_instead_of_corrupting_memory(ops, change, message):
    batch = random_v1_batch(np.random.default_rng(2), max_bsz=8, bsz=8)
    change(batch)
    tensors = to_paddle(batch, V1_ARRAYS)
    with pytest.raises(Exception, match=message):
        ops.update_inputs_v1_host(*(tensors[n] for n in V1_ARRAYS), batch["block_size"])


def test_block_size_must_be_positive(ops):
    batch = random_v1_batch(np.random.default_rng(2), max_bsz=4, bsz=4)
    tensors = to_paddle(batch, V1_ARRAYS)
    with pytest.raises(Exception, match="block_size must be positive"):
        ops.update_inputs_v1_host(*(tensors[n] for n in V1_ARRAYS), 0)  # would be a SIGFPE


def test_get_stop_returns_a_new_cpu_copy_and_set_stop_writes_through(ops):
    flag = paddle.to_tensor([False])
    ops.set_stop(flag, True)
    assert flag.numpy().tolist() == [True]
    copy = ops.get_stop(flag)
    assert copy.place.is_cpu_place() and copy.dtype == paddle.bool and copy.shape == [1]
    ops.set_stop(flag, False)
    assert copy.numpy().tolist() == [True]  # an independent tensor
    assert ops.get_stop(flag).item() is False


def test_get_stop_refuses_wrong_dtype(ops):
    with pytest.raises(Exception, match="dtype"):
        ops.get_stop(paddle.to_tensor([1], dtype="int32"))


def test_cuda_entry_points_fail_cleanly_on_cpu_paddle(ops):
    if paddle.is_compiled_with_cuda():
        pytest.skip("checks the CPU-only Paddle guard")
    if not ops.has_cuda_kernels:
        assert not hasattr(ops, "update_inputs_v1_cuda")
        pytest.skip(f"CUDA kernel library not built: {ops.cuda_why}")
    from fd_async_copy_plugin.ops import OpsUnavailable

    batch = random_v1_batch(np.random.default_rng(4), max_bsz=4, bsz=4)
    tensors = to_paddle(batch, V1_ARRAYS)
    with pytest.raises(OpsUnavailable, match="CPU-only"):  # not a segfault in current_stream()
        ops.update_inputs_v1_cuda(*(tensors[n] for n in V1_ARRAYS), batch["block_size"])
