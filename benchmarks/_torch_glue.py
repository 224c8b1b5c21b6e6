"""PyTorch as the framework of the GPU checks: the whole binding the plugin's backend and probe see.

``TorchGlue`` answers what ``runtime/glue.py``'s ``PaddleGlue`` answers for Paddle (accessors, host
wraps); ``TorchProbeOps`` gives the accessor probe (``runtime/probe.py``) the few framework ops it
needs, with ``torch.cuda._sleep`` as the queued GPU work. Shared by ``cuda_layer_check.py`` and
``step_model.py``; imported after their "no Paddle" assertion (the plugin's modules load without it).
"""

from __future__ import annotations

import numpy as np
import torch

from fd_async_copy_plugin.runtime.glue import FactsInOneCall


class TorchGlue(FactsInOneCall):
    name = "torch"

    def __init__(self) -> None:
        self._dtypes: dict = {}  # torch dtype -> its name (as ``PaddleGlue`` caches Paddle's)

    def address(self, t):
        return int(t.data_ptr())

    def shape(self, t):
        return tuple(t.shape)  # torch.Size: a tuple of ints

    def dtype(self, t):
        name = self._dtypes.get(t.dtype)
        if name is None:
            name = self._dtypes[t.dtype] = str(t.dtype).rsplit(".", 1)[-1]
        return name

    def is_contiguous(self, t):
        return t.is_contiguous()

    def gpu_device(self, t):
        return t.device.index if t.is_cuda else None

    def facts(self, t):
        """The five accessors in one call, as ``PaddleGlue.facts`` (what the copies ask of a source)."""
        return (t.device.index if t.is_cuda else None), t.data_ptr(), tuple(t.shape), self.dtype(t), t.is_contiguous()

    def current_device(self):
        return torch.cuda.current_device()

    def stream(self, device):
        # The raw handle of the current stream, as PyTorch's C++ asks it (``current_stream`` wraps
        # this in a ``Stream`` object); ``PaddleGlue.stream`` likewise calls Paddle's core directly.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return int(raw(device)) if raw is not None else int(torch.cuda.current_stream(device).cuda_stream)

    def wrap(self, array):
        return torch.from_numpy(array)  # zero-copy; keeps ``array`` (and the pinned memory) alive

    def set_shape(self, t, shape):
        if tuple(t.shape) != tuple(shape):
            t.set_(t.untyped_storage(), 0, tuple(shape))

    def from_numpy(self, array):
        return torch.from_numpy(array)

    def blocking_d2h(self, t):
        return t.cpu()

    def snapshot(self, t):
        return t.cpu().numpy().copy()


class TorchProbeOps:
    def __init__(self, sleep_cycles: int) -> None:
        self.cycles = sleep_cycles

    def tensor(self, values, device):
        return torch.from_numpy(np.ascontiguousarray(values)).to(f"cuda:{device}")

    def fill(self, t, value):
        t.fill_(value)

    def transposed(self, t):
        return t.t()  # a strided view: is_contiguous() False

    def busy(self, device):
        torch.cuda._sleep(self.cycles)

    def host_values(self, t):
        return t.numpy().copy()

    def synchronize(self, device):
        torch.cuda.synchronize(device)
