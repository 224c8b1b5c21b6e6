"""Our ports of FastDeploy's compiled ops and kernels for real steps (``testing/real_steps/ops.py``),
against the replica's semantics (``update_inputs_semantics.py``, ``kernels.py``) and by hand."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.testing.real_steps import ops
from fd_async_copy_plugin.testing.reference.update_inputs_semantics import update_inputs_v1_np

PENALTY_ARGS = ("pre_ids", "prompt_ids", "prompt_len", "logits", "penalty", "frequency", "presence", "temperature",
                "bad_tokens", "cur_len", "min_len", "eos")


def _penalty_inputs(rng, bs=3, vocab=16):
    return dict(
        pre_ids=np.array([[1, 1, 2, -1], [3, -1, -1, -1], [5, 5, 5, 6]], dtype=np.int64)[:bs],
        prompt_ids=np.array([[7, 8, 0], [9, 9, 0], [4, 0, 0]], dtype=np.int64)[:bs],
        prompt_len=np.array([[2], [1], [1]], dtype=np.int64)[:bs],
        logits=rng.standard_normal([bs, vocab]).astype(np.float32),
        penalty=np.array([[1.5], [1.0], [0.5]], dtype=np.float32)[:bs],
        frequency=np.array([[0.25], [0.0], [0.5]], dtype=np.float32)[:bs],
        presence=np.array([[0.125], [0.0], [1.0]], dtype=np.float32)[:bs],
        temperature=np.array([[0.5], [1.0], [2.0]], dtype=np.float32)[:bs],
        bad_tokens=np.array([[11, -1], [12, 13], [14, 99]], dtype=np.int64)[:bs],
        cur_len=np.array([[0], [5], [-1]], dtype=np.int64)[:bs],
        min_len=np.array([[2], [1], [9]], dtype=np.int64)[:bs],
        eos=np.array([[10]], dtype=np.int64),
    )


def _by_hand(a, per_row_bad=None):
    """The kernel's arithmetic written out per element (float32), independently of the port."""
    out = a["logits"].copy()
    bs, vocab = out.shape
    for bi in range(bs):
        cur = a["cur_len"][bi, 0]
        if 0 <= cur < a["min_len"][bi, 0]:
            out[bi, a["eos"][0, 0]] = np.float32(-1e10)
        times = np.zeros(vocab, np.int64)
        seen = np.zeros(vocab, bool)
        if cur >= 0:
            for t in a["pre_ids"][bi]:
                if t >= 0:
                    times[t] += 1
                    seen[t] = True
            for t in a["prompt_ids"][bi, : a["prompt_len"][bi, 0]]:
                seen[t] = True
        alpha, beta, gamma = a["penalty"][bi, 0], a["frequency"][bi, 0], a["presence"][bi, 0]
        for v in range(vocab):
            x = np.float32(out[bi, v])
            if seen[v]:
                x = np.float32(x * alpha) if x < 0 else np.float32(x / alpha)
            if times[v]:
                x = np.float32(np.float32(x - np.float32(times[v]) * beta) - gamma)
            out[bi, v] = np.float32(x / a["temperature"][bi, 0])
        bad = a["bad_tokens"][0] if per_row_bad is None else a["bad_tokens"][bi, : per_row_bad[bi]]
        for t in bad:
            if 0 <= t < vocab:
                out[bi, t] = np.float32(-1e10)
    return out


def test_penalty_port_24_matches_the_kernel_arithmetic():
    a = _penalty_inputs(np.random.default_rng(0))
    got = ops.token_penalty_multi_scores_np(*(a[k].copy() if k == "logits" else a[k] for k in PENALTY_ARGS))
    np.testing.assert_array_equal(got, _by_hand(a))
    # FD 2.4's kernel bans row 0's bad words in every row: 11 everywhere, 12/13/14 nowhere
    assert (got[:, 11] == np.float32(-1e10)).all() and not (got[:, 12] == np.float32(-1e10)).any()


def test_penalty_port_25_bans_each_rows_own_bad_words():
    a = _penalty_inputs(np.random.default_rng(1))
    lens = np.array([[1], [2], [1]], dtype=np.int64)
    args = [a[k].copy() if k == "logits" else a[k] for k in PENALTY_ARGS]
    got = ops.token_penalty_multi_scores_np(*args, bad_tokens_len=lens)
    np.testing.assert_array_equal(got, _by_hand(a, per_row_bad=lens[:, 0]))
    assert got[1, 12] == got[1, 13] == np.float32(-1e10) and got[0, 12] != np.float32(-1e10)


def test_penalty_op_wrappers_take_each_lines_signature():
    a = _penalty_inputs(np.random.default_rng(2))
    t = {k: paddle.to_tensor(v) for k, v in a.items()}
    out24 = ops.get_token_penalty_multi_scores(*(t[k] for k in PENALTY_ARGS))
    np.testing.assert_array_equal(out24.numpy(), _by_hand(a))
    t = {k: paddle.to_tensor(v) for k, v in a.items()}
    lens = paddle.to_tensor(np.array([[1], [2], [1]], dtype=np.int64))
    args = [t[k] for k in PENALTY_ARGS]
    out25 = ops.get_token_penalty_multi_scores_v25(*args[:9], lens, *args[9:])
    np.testing.assert_array_equal(out25.numpy(), _by_hand(a, per_row_bad=[1, 2, 1]))
    assert ops.op_namespace("fd24").get_token_penalty_multi_scores is ops.get_token_penalty_multi_scores
    assert ops.op_namespace("fd25").get_token_penalty_multi_scores is ops.get_token_penalty_multi_scores_v25


def test_eos_past_the_vocabulary_lands_in_the_next_row_as_the_kernel_writes_it():
    a = _penalty_inputs(np.random.default_rng(3))
    a["eos"] = np.array([[16 + 3]], dtype=np.int64)  # vocab 16: row 0's write is row 1's column 3
    a["cur_len"] = np.array([[0], [5], [5]], dtype=np.int64)
    got = ops.token_penalty_multi_scores_np(*(a[k].copy() if k == "logits" else a[k] for k in PENALTY_ARGS))
    assert got[1, 3] == np.float32(-1e10)


def test_count_greater_kernel_port():
    rng = np.random.default_rng(4)
    x = paddle.to_tensor(rng.standard_normal([5, 33]).astype(np.float32))
    y = paddle.to_tensor(x.numpy()[:, 7:8])
    out = paddle.empty([5], dtype="int64")
    ops.CountGreaterKernel()[(5,)](x_ptr=x, y_ptr=y, out_ptr=out, n_elements=33, BLOCK_SIZE=4096, num_warps=16)
    np.testing.assert_array_equal(out.numpy(), (x.numpy() >= y.numpy()).sum(-1))


def test_unported_ops_resolve_and_fail_loudly():
    namespace = ops.op_namespace("fd24")
    op = namespace.speculate_made_up_op
    with pytest.raises(NotImplementedError, match="speculate_made_up_op"):
        op()
    # the replica's helpers are not ops
    assert "as_device" not in vars(namespace) and "update_inputs_v1" in vars(namespace)


@pytest.mark.parametrize("line", ["fd24", "fd25"])
def test_update_inputs_v1_port_matches_the_semantics(line):
    """The op FastDeploy's post_process calls (our port, through the namespace) against
    ``update_inputs_v1_np`` on random slot states, 2.4's 13 tensors and 2.5's 12."""
    rng = np.random.default_rng(5 if line == "fd24" else 6)
    namespace = ops.op_namespace(line)
    for trial in range(20):
        bsz, max_bsz, blocks, block_size = int(rng.integers(1, 6)), 6, 4, 4
        state = dict(
            stop_flags=rng.random([max_bsz, 1]) < 0.3,
            seq_lens_this_time=rng.integers(0, 3, [bsz, 1]).astype(np.int32),
            seq_lens_encoder=rng.integers(0, 3, [max_bsz, 1]).astype(np.int32),
            seq_lens_decoder=rng.integers(0, 12, [max_bsz, 1]).astype(np.int32),
            step_seq_lens_decoder=np.zeros([max_bsz, 1], np.int32),
            prompt_lens=rng.integers(1, 10, [max_bsz, 1]).astype(np.int64),
            topk_ids=rng.integers(0, 50, [max_bsz, 1]).astype(np.int64),
            input_ids=rng.integers(0, 50, [max_bsz, 8]).astype(np.int64),
            block_tables=np.where(rng.random([max_bsz, blocks]) < 0.7, 1, -1).astype(np.int32),
            next_tokens=rng.integers(0, 50, [max_bsz, 1]).astype(np.int64),
            is_block_step=np.zeros([max_bsz, 1], bool),
        )
        expected = {k: v.copy() for k, v in state.items()}
        stop_nums = np.array([max_bsz], np.int64) if line == "fd24" else None
        want = update_inputs_v1_np(
            expected["stop_flags"], None, expected["seq_lens_this_time"], expected["seq_lens_encoder"],
            expected["seq_lens_decoder"], expected["step_seq_lens_decoder"], expected["prompt_lens"],
            expected["topk_ids"], expected["input_ids"], expected["block_tables"], stop_nums,
            expected["next_tokens"], expected["is_block_step"], block_size)
        t = {k: paddle.to_tensor(v) for k, v in state.items()}
        flag = paddle.to_tensor(np.array([not want], bool))
        names = ["stop_flags", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder", "step_seq_lens_decoder",
                 "prompt_lens", "topk_ids", "input_ids", "block_tables"]
        if line == "fd24":
            namespace.update_inputs_v1(t["stop_flags"], flag, *(t[n] for n in names[1:]), paddle.to_tensor(stop_nums),
                                       t["next_tokens"], t["is_block_step"], block_size)
            got_flag = bool(flag.numpy()[0])
        else:
            device_flag = paddle.to_tensor(np.array([not want], bool))
            namespace.update_inputs_v1(t["stop_flags"], device_flag, *(t[n] for n in names[1:]), t["next_tokens"],
                                       t["is_block_step"], block_size)
            got_flag = bool(device_flag.numpy()[0])
        assert got_flag == want, trial
        for k in state:
            np.testing.assert_array_equal(t[k].numpy(), expected[k], err_msg=f"{line} trial {trial}: {k}")
