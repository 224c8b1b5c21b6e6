"""ctypes binding of the stop-flag C libraries: ``libfd_async_copy_cuda.so`` (the CUDA kernels) and
the host implementation built as a plain shared library (used by the GPU kernel check).

Framework-neutral: the launchers take integer addresses and an integer ``cudaStream_t``.
``stop_flag_ops`` feeds them Paddle tensors; ``benchmarks/gpu_kernel_check.py`` feeds them CuPy or
PyTorch tensors. Loading the CUDA library needs no GPU (the CUDA runtime is linked statically and
only talks to the driver at the first launch). Imports nothing but the standard library.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

MAX_BATCH = 1024

_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64

# Argument lists of stop_flag_api.h, in order.
_V1_ARGS = [_P] * 13 + [_I, _I, _L, _L, _L, _I, _I]
_V0_ARGS = [_P] * 9 + [_I, _I, _L]


class StopFlagLibrary:
    """One of the two C libraries (``cuda``: stream launchers; ``host``: the host loops)."""

    def __init__(self, path: str | Path, flavor: str = "cuda") -> None:
        self.path, self.flavor = str(path), flavor
        self._lib = ctypes.CDLL(self.path)
        stream = [_P] if flavor == "cuda" else []
        self._v1 = self._bind(f"fdac_update_inputs_v1_{flavor}", _V1_ARGS + stream, _I)
        self._v0 = self._bind(f"fdac_update_inputs_{flavor}", _V0_ARGS + stream, _I)
        self._message = self._bind(f"fdac_{flavor}_status_message", [_I], ctypes.c_char_p)

    def _bind(self, name: str, argtypes: list, restype):
        fn = getattr(self._lib, name)
        fn.argtypes, fn.restype = argtypes, restype
        return fn

    def update_inputs_v1(self, *addresses, bsz, max_bsz, input_ids_stride, block_tables_stride,
                         block_tables_numel, block_size, prefill_one_step_stop, stream=None) -> int:
        """The addresses (ints) of FastDeploy's 13 tensor arguments in its order (stop_flags,
        not_need_stop, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, step_seq_lens_decoder,
        prompt_lens, topk_ids, input_ids, block_tables, stop_nums - may be ``None`` -, next_tokens,
        is_block_step), then the scalars. Returns the C status (0 = ok)."""
        return self._v1(*addresses, bsz, max_bsz, input_ids_stride, block_tables_stride, block_tables_numel,
                        block_size, 1 if prefill_one_step_stop else 0, *self._stream_arg(stream))

    def update_inputs(self, *addresses, bsz, max_bsz, input_ids_stride, stream=None) -> int:
        """The addresses of the 9 tensor arguments (stop_flags, not_need_stop, seq_lens_this_time,
        seq_lens_encoder, seq_lens_decoder, input_ids, stop_nums, next_tokens, is_block_step)."""
        return self._v0(*addresses, bsz, max_bsz, input_ids_stride, *self._stream_arg(stream))

    def message(self, status: int) -> str:
        return self._message(status).decode(errors="replace")

    def _stream_arg(self, stream) -> list:
        if self.flavor == "host":
            if stream is not None:
                raise ValueError("the host library takes no stream")
            return []
        return [stream]
