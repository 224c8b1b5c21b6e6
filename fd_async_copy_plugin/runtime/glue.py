"""The only place the copy backends touch a framework: tensor accessors, and wrapping host memory.

A glue object answers, for a tensor: its address (``data_ptr()``), shape, dtype name, whether it is
contiguous and which GPU holds it (None: host memory); for a device: the raw ``cudaStream_t`` of the
framework's current stream. It also wraps host memory as a zero-copy host tensor, resizes such a
wrap within its allocation, and turns a numpy array into an owned host tensor. Nothing else: no
``numel()``, no op on a device tensor (on GPU each would be a kernel, ``int(...)`` of it a sync).

``PaddleGlue`` is the plugin's; ``benchmarks/cuda_layer_check.py`` supplies a PyTorch one so that
the same backend, ring and event code runs on the H200 without Paddle. What the Paddle accessors
answer on a GPU build is checked at first use by ``runtime.probe.probe_accessors``.
"""

from __future__ import annotations

import functools

import numpy as np

#: The accessors ``facts`` answers in one call, in its order.
FACTS = ("gpu_device", "address", "shape", "dtype", "is_contiguous")


def composed_facts(glue, t) -> tuple:
    """``facts`` of a glue that has none (or overrides an accessor): its accessors, one by one."""
    return glue.gpu_device(t), glue.address(t), glue.shape(t), glue.dtype(t), glue.is_contiguous(t)


class FactsInOneCall:
    """A glue's ``facts(t)``: what the copies ask of each source, in one call instead of five (a
    step's copies are issued in Python). A subclass that overrides one of the accessors but not
    ``facts`` gets them composed, so the copies always see what the accessors (and the probe) see."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "facts" not in vars(cls) and any(name in vars(cls) for name in FACTS):
            cls.facts = composed_facts


class PaddleGlue(FactsInOneCall):
    name = "paddle"

    def __init__(self) -> None:
        import paddle

        from paddle.utils.dlpack import from_dlpack  # (Paddle 2.x and 3.x)

        self.paddle, self._from_dlpack, self._cpu = paddle, from_dlpack, paddle.CPUPlace()
        # id(Paddle dtype) -> (the dtype, its name): ``str()`` of a dtype costs ~2 us and hashing one
        # ~1 us; Paddle's dtypes are singletons, so the identity check makes the id safe.
        self._dtypes: dict = {}
        # The core call under ``paddle.device.current_stream`` (GPU builds): that function builds a
        # place and a ``Stream`` wrapper around this call's result every time it is asked.
        core = getattr(getattr(paddle, "base", None), "core", None)
        self._current_stream = getattr(core, "_get_current_stream", None) if paddle.is_compiled_with_cuda() else None

    # -- accessors (metadata only) -----------------------------------------------------------------
    def address(self, t) -> int:
        return int(t.data_ptr())

    def shape(self, t) -> tuple[int, ...]:
        return tuple(t.shape)  # a list of ints

    def dtype(self, t) -> str:
        dtype = t.dtype
        known = self._dtypes.get(id(dtype))
        if known is None or known[0] is not dtype:
            known = self._dtypes[id(dtype)] = (dtype, str(dtype).rsplit(".", 1)[-1])
        return known[1]

    def is_contiguous(self, t) -> bool:
        return bool(t.is_contiguous())

    def gpu_device(self, t) -> int | None:
        place = t.place
        return int(place.gpu_device_id()) if place.is_gpu_place() else None

    def facts(self, t) -> tuple:
        """(``gpu_device``, ``address``, ``shape``, ``dtype``, ``is_contiguous``) of ``t``."""
        place = t.place  # (Paddle answers ints and a bool: no int()/bool() needed)
        return (place.gpu_device_id() if place.is_gpu_place() else None, t.data_ptr(), tuple(t.shape), self.dtype(t),
                t.is_contiguous())

    def current_device(self) -> int:
        """Paddle's idea of the thread's device (parsed from its expected place, not cudaGetDevice)."""
        return int(self.paddle.device.current_device())

    def stream(self, device: int) -> int:
        """The raw ``cudaStream_t`` of Paddle's current stream on ``device`` (what FD 2.5 passes to
        C++), asked every copy (a ``stream_guard`` may change it). Only for a GPU build: on the CPU
        build ``current_stream`` segfaults. The probe's ``stream_order`` check tests the answer."""
        if self._current_stream is not None:  # what ``current_stream`` answers, minus its wrappers
            return int(self._current_stream(int(device)).cuda_stream)
        place = self.paddle.CUDAPlace(int(device))
        return int(self.paddle.device.current_stream(place).stream_base.cuda_stream)

    # -- host tensors --------------------------------------------------------------------------------
    def wrap(self, array: np.ndarray):
        """A CPU-place Paddle tensor over ``array``'s memory (DLPack, zero-copy). The tensor keeps
        the array - and through it the allocation - alive. CPU place on purpose: no Paddle op can
        move it to the GPU (ops on pinned-place tensors do), and ``.numpy()`` reads it in place."""
        return self._from_dlpack(array)

    def set_shape(self, t, shape: tuple[int, ...]) -> None:
        """Reshape a host wrap (the backend checked the bound) or an FD buffer within its allocation.

        Sets the dims of its DenseTensor (``_set_dims``: 1.4 us on CPU Paddle 3.3) rather than
        ``t.set_(t, shape)``, which costs 15 us and, from an empty shape, leaves the tensor without
        its storage: ``set_(t, [0, 3])`` then ``set_(t, [2, 3])`` gives an uninitialised tensor
        (CPU Paddle 3.3) - every later step of that buffer would fail. (Paddle reshapes its fused
        buffers the same way: ``paddle/optimizer/fusion_utils.py``.) ``set_`` only where a Paddle
        has no ``_set_dims``, refused from an empty shape.
        """
        shape = list(shape)
        if list(t.shape) == shape:
            return
        if (set_dims := getattr(t.get_tensor(), "_set_dims", None)) is not None:
            set_dims(shape)
        elif 0 in t.shape:  # pragma: no cover - Paddle 3.0-3.3 have ``_set_dims``
            from .backend import AsyncCopyError

            raise AsyncCopyError("this Paddle cannot give an empty host wrap a shape again without "
                                 "losing its memory (no DenseTensor._set_dims)")
        else:
            t.set_(t, shape)  # pragma: no cover

    def from_numpy(self, array: np.ndarray):
        """An owned CPU tensor holding a copy of ``array``: what ``paddle.to_tensor(array,
        place=CPUPlace())`` makes (same dtype, shape, place, ``stop_gradient``), through the tensor
        constructor it ends in, without its argument handling (7 instead of 10 us on CPU Paddle 3.3;
        ``tests/runtime/test_glue_from_numpy.py``)."""
        return self.paddle.Tensor(array, self._cpu)

    def blocking_d2h(self, t):
        """FastDeploy 2.4's ``.cpu()`` (the host waits)."""
        return t.cpu()

    def snapshot(self, t) -> np.ndarray:
        """An owned numpy copy of a host tensor (``host``/``sim`` backends: CPU sources only)."""
        return np.array(t.numpy(), copy=True)


@functools.cache
def paddle_glue() -> PaddleGlue:
    """The process's ``PaddleGlue`` (made once)."""
    return PaddleGlue()
