"""A tiny deterministic language model for the replica runners.

Token embedding plus position embedding, then one linear layer to the vocabulary. Weights come
from a fixed seed, so every run (and every process) computes the same logits. It follows
FastDeploy's model interface: ``model(ids_remove_padding, forward_meta)`` returns one hidden row
per packed token, and ``compute_logits(hidden_states)`` returns float32 logits, as FastDeploy's
models do (e.g. ``qwen2.py`` casts to float32).

``rows_dependent_gemm``: one more per-token dense layer whose summation order depends on the number
of packed rows M (1 + M % 3 partial sums over K), as a GPU GEMM's kernel choice (tiles, split-K)
depends on its shape: a real row's bits then depend on how many rows share the step. Off, every
row is computed on its own (the replica's default; FastDeploy's models are not).

``moe_experts`` (E > 0): a layer standing for MoE. Every packed row, padding rows included (MoE
routes them like real rows), goes to expert ``token id % E``; each expert sums its rows' products
in ``1 + n % 3`` partial sums over K, n being that expert's row count, as a grouped GEMM's kernel
choice may depend on its per-expert M. A real row's bits then depend on the padding rows' token
ids, not only on their number: under the replica's CUDA-graph stand-in (``cuda_graph.py``) the
padding rows are whatever the static buffer held.

Tensor parallelism (``tp.run_decode_tp``): the forward's all-reduce is a collective every rank must
make with inputs of one shape (``all_reduce``). The weights are not split (each rank computes the
whole model), so the reduction itself is the identity; the call checks the ranks meet there with
the same rows.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import paddle

from .placement import as_device, device_array, device_code, heavy

_tp = threading.local()  # the rank thread's collective (tp.run_decode_tp), if any


@contextlib.contextmanager
def tensor_parallel(collective):
    """On this thread the forward's all-reduce calls ``collective(kind, payload)``."""
    _tp.collective = collective
    try:
        yield
    finally:
        _tp.collective = None


def all_reduce(hidden: paddle.Tensor, ids: paddle.Tensor) -> paddle.Tensor:
    """The forward's tensor-parallel all-reduce of ``hidden`` (identity: weights are not split); a
    collective of the rank's thread, whose payload is the rows' shape and token ids."""
    collective = getattr(_tp, "collective", None)
    if collective is not None:
        collective("all_reduce(forward)", (tuple(hidden.shape), device_array(ids).tobytes().hex()))
    return hidden


class TinyModel:
    def __init__(self, vocab_size: int, max_model_len: int, hidden_size: int = 32, seed: int = 2024,
                 rows_dependent_gemm: bool = False, moe_experts: int = 0) -> None:
        rng = np.random.RandomState(seed)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.embedding = paddle.to_tensor(rng.standard_normal([vocab_size, hidden_size]).astype(np.float32))
        self.position_embedding = paddle.to_tensor(
            (0.5 * rng.standard_normal([max_model_len + 1, hidden_size])).astype(np.float32)
        )
        scale = 4.0 / np.sqrt(hidden_size)
        self.lm_head = paddle.to_tensor((scale * rng.standard_normal([hidden_size, vocab_size])).astype(np.float32))
        self.mix = None
        if rows_dependent_gemm:
            self.mix = paddle.to_tensor((rng.standard_normal([hidden_size, hidden_size]) / hidden_size).astype(np.float32))
        self.experts = [
            paddle.to_tensor((rng.standard_normal([hidden_size, hidden_size]) / hidden_size).astype(np.float32))
            for _ in range(moe_experts)]

    def __call__(self, ids_remove_padding: paddle.Tensor, forward_meta) -> paddle.Tensor:
        heavy("forward")
        ids = ids_remove_padding.reshape([-1])
        hidden = paddle.gather(self.embedding, ids) + paddle.gather(
            self.position_embedding, forward_meta.position_ids.reshape([-1])
        )
        hidden = paddle.tanh(hidden)
        if self.mix is not None:
            hidden = paddle.tanh(hidden + _split_k(hidden, self.mix))
        if self.experts:
            with device_code():  # the routing kernel reads the ids on the device
                route = device_array(ids) % len(self.experts)
            mixed = paddle.zeros_like(hidden)
            for e, weight in enumerate(self.experts):
                rows = np.nonzero(route == e)[0]
                if len(rows):
                    index = paddle.to_tensor(rows.astype(np.int64))
                    mixed = paddle.scatter(mixed, index, _split_k(paddle.gather(hidden, index), weight))
            hidden = paddle.tanh(hidden + mixed)
        return as_device(all_reduce(hidden, ids))

    def compute_logits(self, hidden_states: paddle.Tensor) -> paddle.Tensor:
        heavy("compute_logits")
        return as_device(paddle.matmul(hidden_states, self.lm_head).astype("float32"))


def _split_k(x: paddle.Tensor, weight: paddle.Tensor) -> paddle.Tensor:
    """``x @ weight`` summed in ``1 + rows % 3`` partial sums over K: the bits of a row depend on
    how many rows ``x`` has, as a GPU GEMM's do through its kernel choice."""
    edges = np.linspace(0, weight.shape[0], 2 + x.shape[0] % 3).astype(int)
    out = None
    for a, b in zip(edges[:-1], edges[1:]):
        part = paddle.matmul(x[:, a:b], weight[a:b])
        out = part if out is None else out + part
    return out
