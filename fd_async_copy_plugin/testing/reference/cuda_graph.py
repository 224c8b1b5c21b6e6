"""The replica's stand-in for FastDeploy 2.4's CUDA-graph decode (``DriverConfig(cuda_graph=True)``).

What FD 2.4 does (``model_executor/graph_optimization/graph_optimization_backend.py:128-153``,
``cudagraph_piecewise_backend.py:146-157, 213``):

- A step's forward runs under a graph when the step is decode-only with tokens
  (``forward_meta.step_use_cudagraph``) and its token count M, ``forward_meta.ids_remove_padding
  .shape[0]``, is at most the largest captured size.
- It replays the graph of the smallest captured size C >= M (``real_shape_to_captured_size``).
- The graph reads the buffers it was captured on, at their addresses, C rows each; nothing is
  padded or copied for it. FD copies M rows into ``share_inputs["ids_remove_padding"]`` and
  ``batch_id_per_token`` each step (``gpu_model_runner.py:1604-1609``), so rows M..C hold what
  the buffers held before.
- The runner keeps the first ``real_token_num`` rows of the output (``:2448-2449``, set in
  ``padding_cudagraph_inputs``).

``GraphReplay`` wraps the replica's model the same way. For such a step it runs the model on the
first C rows of the two buffers, read past their shape as the graph reads memory (the replica's
own position ids are 0 in the padding rows), and returns C rows. It checks that each captured size
replays on the addresses of its first replay. It records every replay in ``replays`` (C, M, the
two buffers' shapes and their first C rows), which ``DecodeResult.differences`` compares: what the
graph read, padding rows included.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import paddle

from .placement import device_code


def static_rows(t: paddle.Tensor, rows: int) -> paddle.Tensor:
    """The first ``rows`` rows of ``t``'s memory, past its shape too (what a graph captured on
    ``t`` reads): a copy, on the device."""
    shape = [rows, *t.shape[1:]]
    strides = [int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape))]
    return paddle.as_strided(t, shape, strides).clone()


class GraphReplay:
    """The runner's model under FD 2.4's CUDA-graph backend (module doc)."""

    STATIC = ("ids_remove_padding", "batch_id_per_token")

    def __init__(self, model, graph_opt_config, runner) -> None:
        self.model, self.config, self.runner = model, graph_opt_config, runner
        self.addresses: dict = {}  # captured size -> the static buffers' addresses at its first replay
        self.replays: list = []

    def __getattr__(self, name):
        return getattr(self.model, name)  # compute_logits, weights

    def __call__(self, ids_remove_padding: paddle.Tensor, forward_meta) -> paddle.Tensor:
        real = int(ids_remove_padding.shape[0])
        if not forward_meta.step_use_cudagraph or real > self.config.max_capture_size:
            return self.model(ids_remove_padding, forward_meta)  # eager
        size = self.config.real_shape_to_captured_size[real]
        static = [self.runner.share_inputs[name] for name in self.STATIC]
        given = (ids_remove_padding.data_ptr(), forward_meta.batch_id_per_token.data_ptr())
        captured = self.addresses.setdefault(size, tuple(t.data_ptr() for t in static))
        if given != captured:
            raise AssertionError(f"graph of size {size} replayed on other buffers than it was captured on")
        ids, batch_ids = (static_rows(t, size) for t in static)
        positions = paddle.concat([forward_meta.position_ids.reshape([-1]), paddle.zeros([size - real], "int64")])
        with device_code():
            self.replays.append((size, real, *(tuple(t.shape) for t in static),
                                 ids.numpy().tobytes(), batch_ids.numpy().tobytes()))
        meta = dataclasses.replace(forward_meta, ids_remove_padding=ids, batch_id_per_token=batch_ids,
                                   position_ids=positions)
        return self.model(ids, meta)
