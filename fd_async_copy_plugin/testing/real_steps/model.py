"""The forward of a real-steps runner: the replica's tiny deterministic model, fed the way
FastDeploy's runner feeds its model.

FastDeploy hands the model ``forward_meta.ids_remove_padding``, the whole packed-ids buffer
(``[max_num_seqs * max_model_len]``; only its first ``token_num`` rows are this step's tokens), and
the attention metadata. The tiny model has no attention: each row's output depends on its id and its
position, which it reads from the step's ``seq_lens_decoder`` / ``seq_lens_this_time`` as device
code (what the attention kernels read on the GPU; no host read is counted). Padded rows get
position 0; ``rebuild_padding`` never picks them.
"""

from __future__ import annotations

import numpy as np
import paddle

from ..reference.placement import as_device, device_code
from ..reference.tiny_model import TinyModel


class RealStepsModel(TinyModel):
    def __init__(self, share_inputs: dict, **kwargs) -> None:
        super().__init__(**kwargs)
        self.share_inputs = share_inputs
        for weight in (self.embedding, self.position_embedding, self.lm_head, self.mix):
            if weight is not None:  # the weights live on the GPU (loaded there by FastDeploy's loader)
                as_device(weight)

    def _position_ids(self, rows: int) -> paddle.Tensor:
        with device_code():
            dec = self.share_inputs["seq_lens_decoder"].numpy().reshape(-1)
            this_time = self.share_inputs["seq_lens_this_time"].numpy().reshape(-1)
        parts = [dec[b] + np.arange(n) for b, n in enumerate(this_time) if n > 0]
        flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros([0], dtype=np.int64)
        flat = np.concatenate([flat, np.zeros([max(rows - flat.shape[0], 0)], dtype=np.int64)])[:rows]
        return as_device(paddle.to_tensor(flat))

    def __call__(self, ids_remove_padding, forward_meta):
        if isinstance(ids_remove_padding, dict):  # develop hands the model a dict of inputs
            ids_remove_padding = ids_remove_padding["ids_remove_padding"]
        class _Meta:
            position_ids = self._position_ids(int(ids_remove_padding.shape[0]))

        return super().__call__(ids_remove_padding, _Meta)


    def compute_logits(self, hidden_states, forward_meta=None):  # develop passes forward_meta too
        return super().compute_logits(hidden_states)


class NoAttention:
    """The runner's attention backend: nothing to prepare (the tiny model has no attention)."""

    count_free_metadata = True  # reads no host token count (overlap ``launch``)

    def init_attention_metadata(self, forward_meta) -> None:
        pass
