"""Loading the built custom ops and calling them on Paddle tensors: ``load_ops()``, ``ops_status()``.

``load_ops()`` returns a ``StopFlagOps`` with

- ``get_stop(flag) -> paddle.Tensor`` (new CPU bool [1]) and ``set_stop(flag, value)``: read/write
  a CPU or pinned bool flag through its host pointer (never a Paddle op on pinned memory);
- ``update_inputs_v1_host(...)`` / ``update_inputs_host(...)``: FastDeploy's update semantics on
  CPU tensors, writing the ``not_need_stop`` bool [1] tensor given (the ``host`` backend);
- ``update_inputs_v1_cuda(...)`` / ``update_inputs_cuda(...)``, present only when the CUDA kernel
  library is built: the same on GPU tensors, writing a DEVICE ``not_need_stop`` on Paddle's current
  stream, with no host copy (the ``cuda`` backend).

The ``*_v1`` functions take FastDeploy 2.4's positional arguments (``stop_nums`` may be ``None``:
compare with max_bsz as 2.5+ does) plus ``prefill_one_step_stop``; ``None`` reads
``PREFILL_NODE_ONE_STEP_STOP_V1`` like FastDeploy's op does on every call.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from math import prod
from pathlib import Path

from ..runtime.glue import paddle_glue
from . import cache
from .stop_flag_library import MAX_BATCH, StopFlagLibrary

class OpsUnavailable(RuntimeError):
    """The custom ops cannot be used here; the message says what to do."""


def _v1_scalars(block_size: int, prefill_one_step_stop: bool | None = None) -> tuple[int, bool]:
    """``update_inputs_v1``'s scalars as the ops take them; ``prefill_one_step_stop`` None: read
    from the environment, as FastDeploy's op does on every call."""
    if prefill_one_step_stop is None:  # FastDeploy's rule: set, and its first character is ``1``
        prefill_one_step_stop = os.environ.get("PREFILL_NODE_ONE_STEP_STOP_V1", "").startswith("1")
    return int(block_size), bool(prefill_one_step_stop)


class StopFlagOps:
    def __init__(self, module, cuda_library: StopFlagLibrary | None, cuda_why: str) -> None:
        self.module, self.path = module, getattr(module, "__file__", None)
        self.cuda_library, self.cuda_why, self.has_cuda_kernels = cuda_library, cuda_why, cuda_library is not None
        # FastDeploy's update semantics on CPU tensors, its arguments as given (a pybind function)
        self.update_inputs_host, self.get_stop = module.update_inputs_host, module.get_stop
        if cuda_library is not None:
            self.update_inputs_v1_cuda = self._update_inputs_v1_cuda
            self.update_inputs_cuda = self._update_inputs_cuda

    # --- host-pointer flag access --------------------------------------------------------------

    def set_stop(self, flag, value: bool) -> None:
        self.module.set_stop(flag, bool(value))

    # --- host implementation (CPU tensors) -----------------------------------------------------

    def update_inputs_v1_host(self, *args, **one_step_stop) -> None:
        """FastDeploy 2.4's ``update_inputs_v1`` arguments (``V1_TENSORS``, ``block_size``), then
        ``prefill_one_step_stop`` (by position or name; absent or None: from the environment)."""
        self.module.update_inputs_v1_host(*args[:13], *_v1_scalars(*args[13:], **one_step_stop))

    # --- CUDA kernels (GPU tensors) ------------------------------------------------------------
    # The launch is framework-neutral (StopFlagLibrary: addresses, shapes, a cudaStream_t), checked
    # on an H200 by benchmarks/gpu_kernel_check.py and cuda_layer_check.py. Paddle is reduced to
    # accessors (data_ptr, shape, dtype, place, the current stream's handle), which
    # runtime.probe.probe_accessors checks on the GPU at first use; nothing here reads a device value.

    def _update_inputs_v1_cuda(self, *args, **one_step_stop) -> None:
        """``update_inputs_v1_host``'s arguments, on GPU tensors."""
        tensors = dict(zip(V1_TENSORS, args[:13], strict=True))
        block_size, one_step_stop = _v1_scalars(*args[13:], **one_step_stop)
        tables = tensors["block_tables"]
        self._launch("update_inputs_v1", tensors, block_tables_stride=_row_stride(tables),
                     block_tables_numel=_elements(tables), block_size=block_size,
                     prefill_one_step_stop=one_step_stop)

    def _update_inputs_cuda(self, *tensors) -> None:
        """FastDeploy's ``update_inputs`` arguments (``V0_TENSORS``), on GPU tensors."""
        self._launch("update_inputs", dict(zip(V0_TENSORS, tensors, strict=True)))

    def _launch(self, kernel: str, tensors: dict, **scalars) -> None:
        """Checks ``tensors`` (the kernel's tensor arguments by name, in its order; ``stop_nums`` may
        be None) and calls ``kernel`` of the CUDA library on Paddle's current stream of their device."""
        bsz, max_bsz = check_batch(tensors["seq_lens_this_time"], tensors["stop_flags"])
        ids_stride = _row_stride(tensors["input_ids"])
        # The elements the kernels index (any other tensor: one per running slot). They read
        # input_ids[i * stride] for i < bsz: the last row needs only its first element.
        need = {"stop_flags": max_bsz, "not_need_stop": 1, "stop_nums": 1, "block_tables": 0,
                "input_ids": (bsz - 1) * ids_stride + 1 if bsz else 0}
        device = check_device_tensors([(name, t, _DTYPES.get(name, "int32"), need.get(name, bsz))
                                       for name, t in tensors.items() if t is not None or name != "stop_nums"])
        check_current_device(device)
        lib = self.cuda_library
        status = getattr(lib, kernel)(*map(_address, tensors.values()), bsz=bsz, max_bsz=max_bsz, **scalars,
                                      input_ids_stride=ids_stride, stream=current_stream_handle(device))
        if status != 0:
            raise RuntimeError(f"fd_async_copy stop-flag kernel: {lib.message(status)} (status {status})")


# --- argument checks for the raw-pointer path (the C++ host path checks in C++) -----------------

#: The tensor arguments of the kernels, in their order (stop_flag_api.h), and their dtypes (int32
#: where not listed).
V0_TENSORS = ("stop_flags", "not_need_stop", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder",
              "input_ids", "stop_nums", "next_tokens", "is_block_step")
V1_TENSORS = (*V0_TENSORS[:5], "step_seq_lens_decoder", "prompt_lens", "topk_ids", "input_ids", "block_tables",
              *V0_TENSORS[6:])
_DTYPES = {**dict.fromkeys(("stop_flags", "not_need_stop", "is_block_step"), "bool"),
           **dict.fromkeys(("prompt_lens", "topk_ids", "input_ids", "stop_nums", "next_tokens"), "int64")}


def check_current_device(device: int) -> None:
    """The launcher runs on the calling thread's current CUDA device: it must hold the tensors.
    (FastDeploy selects one GPU per worker; the runner-construction probe surfaces a mismatch.)"""
    import paddle

    current = paddle.device.current_device()
    if current != device:
        raise ValueError(f"the stop-flag tensors are on gpu:{device} but the current device is gpu:{current}; "
                         "the kernel would launch on the wrong GPU")


def check_batch(seq_lens_this_time, stop_flags) -> tuple[int, int]:
    bsz, max_bsz = _rows(seq_lens_this_time), _rows(stop_flags)
    if max_bsz > MAX_BATCH:
        raise ValueError(f"max_bsz={max_bsz} (stop_flags.shape[0]) exceeds {MAX_BATCH}, the one-block limit of "
                         "the stop-flag kernel (and of FastDeploy's update_inputs kernels); lower max_num_seqs")
    if bsz > max_bsz:
        raise ValueError(f"bsz={bsz} (seq_lens_this_time) exceeds max_bsz={max_bsz} (stop_flags)")
    return bsz, max_bsz


def check_device_tensors(tensors) -> int:
    """Every tensor on one GPU, contiguous, of the dtype and size the kernel indexes.
    Returns the device id. Raises ``OpsUnavailable`` on a CPU-only Paddle (whose CUDA stream API
    segfaults instead of raising). Accessors only (place, dtype, shape, is_contiguous): no
    ``numel()`` or other op, each of which would be a GPU kernel and ``int()`` of it a host sync."""
    import paddle

    if not paddle.is_compiled_with_cuda():
        raise OpsUnavailable("the CUDA stop-flag kernels need a CUDA build of Paddle (this one is CPU-only)")
    glue, devices = paddle_glue(), set()
    for name, t, dtype, min_numel in tensors:
        device = glue.gpu_device(t)
        if device is None:
            raise ValueError(f"{name} must be a GPU tensor for the CUDA kernel (it is on {t.place})")
        devices.add(device)
        if glue.dtype(t) != dtype:
            raise ValueError(f"{name} has dtype {t.dtype}, expected {dtype}")
        if not glue.is_contiguous(t):
            raise ValueError(f"{name} must be contiguous")
        if _elements(t) < min_numel:
            raise ValueError(f"{name} has {_elements(t)} elements, needs at least {min_numel}")
    if len(devices) != 1:
        raise ValueError(f"stop-flag tensors are spread over GPUs {sorted(devices)}")
    return devices.pop()


def current_stream_handle(device_id: int) -> int:
    """The ``cudaStream_t`` of Paddle's current stream on ``device_id``, as an int.

    Paddle 3.3 (``paddle/device/__init__.py``): ``current_stream(place)`` returns a ``Stream``
    whose ``stream_base`` is a ``core.CUDAStream``; its ``cuda_stream`` attribute is the raw handle
    (what FastDeploy 2.5 passes to C++). Checked at first use by ``runtime.probe`` (stream order).
    """
    return paddle_glue().stream(device_id)


def _address(t) -> int | None:
    """Device address, or None (NULL) for an absent or empty tensor, which no slot touches."""
    return None if t is None or _elements(t) == 0 else paddle_glue().address(t)


def _elements(t) -> int:
    """Element count from the shape (host metadata); ``numel()`` would be a device op."""
    return prod(paddle_glue().shape(t))


def _rows(t) -> int:
    return int(t.shape[0]) if len(t.shape) else 1  # (a 0-d tensor: one row)


def _row_stride(t) -> int:
    return prod(list(t.shape)[1:])  # (1 for a tensor of fewer than two dimensions)


# --- loading and status --------------------------------------------------------------------------

_load_lock = threading.Lock()
_loaded: dict[Path, StopFlagOps] = {}  # by ops dir


def load_ops(build: bool = False) -> StopFlagOps:
    """The ops of this process (loaded once). ``build=True`` first builds what is missing or stale.

    Raises ``OpsUnavailable`` with what to do. A rebuild after loading takes effect in new
    processes only (a shared library cannot be reloaded in place).
    """
    with _load_lock:
        try:
            directory = cache.ops_dir()
            import paddle  # noqa: F401  - the module's tensor caster needs Paddle initialised
        except ImportError as exc:
            raise OpsUnavailable(f"Paddle is not importable: {exc}") from exc
        if directory in _loaded:
            return _loaded[directory]
        if build:
            from .build import BuildError, build_ops

            try:
                build_ops()
            except (BuildError, ValueError, OSError) as exc:
                raise OpsUnavailable(f"building the custom ops failed: {exc}") from exc
        ops = _loaded[directory] = StopFlagOps(_import_pybind_module(), *_load_cuda_library())
        return ops


def _import_pybind_module():
    artifact = cache.ops_dir() / cache.PYBIND_FILE
    why = cache.staleness(artifact, cache.pybind_fingerprint())
    if why is not None:
        hint = "" if cache.REBUILD in why else "; run `fd-async-copy build-ops`"
        raise OpsUnavailable(f"custom ops unavailable: {why}{hint}")
    try:
        spec = importlib.util.spec_from_file_location(cache.PYBIND_MODULE, artifact)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # an ImportError or a symbol error from a mismatched Paddle
        raise OpsUnavailable(f"cannot import {artifact}: {exc}; run `fd-async-copy build-ops --force`") from exc
    return module


def _load_cuda_library() -> tuple[StopFlagLibrary | None, str]:
    artifact = cache.ops_dir() / cache.CUDA_LIB_FILE
    why = cache.staleness(artifact, cache.cuda_fingerprint())
    if why is not None:
        if cache.REBUILD in why:  # built, but not what was built: never loaded
            return None, why
        nvcc, origin = cache.find_nvcc()
        return None, f"{why}; run `fd-async-copy build-ops` with nvcc available" if nvcc else \
            f"not built: {origin}, then run `fd-async-copy build-ops`"
    try:
        return StopFlagLibrary(artifact, "cuda"), f"loaded {artifact}"
    except OSError as exc:
        return None, f"cannot load {artifact}: {exc}"


def ops_status(load: bool = True) -> dict:
    """JSON-serialisable state of the custom ops; never raises. ``load=False``: describe only what
    this process has loaded already (``loadable`` is ``None`` when nothing was loaded)."""
    kernels = {"built": False, "loadable": False, "available": False, "path": None, "why": ""}
    status: dict = {"ops_dir": None, "sources": None, "built": False, "stale": None, "loadable": False,
                    "path": None, "error": None, "cuda_kernels": kernels}
    try:
        src = cache.sources_dir()
        status["sources"] = str(src) if src else None
        directory = cache.ops_dir()
        artifact = directory / cache.PYBIND_FILE
        status.update(ops_dir=str(directory), path=str(artifact), built=artifact.is_file())
        status["stale"] = cache.staleness(artifact, cache.pybind_fingerprint()) if status["built"] else None
        ops = None if load else _loaded.get(directory)
        if load:
            try:
                ops = load_ops()
            except OpsUnavailable as exc:
                status["error"] = str(exc)
        elif ops is None:
            status.update(loadable=None, error="not loaded in this process (`fd-async-copy doctor` checks them)")
            return status
        status.update(loadable=ops is not None, cuda_kernels=_cuda_status(directory, ops))
    except Exception as exc:  # status must describe, never fail
        status["error"] = f"{type(exc).__name__}: {exc}"
    return status


def _cuda_status(directory: Path, ops: StopFlagOps | None) -> dict:
    artifact = directory / cache.CUDA_LIB_FILE
    library, why = (ops.cuda_library, ops.cuda_why) if ops is not None else _load_cuda_library()
    entry = {"built": artifact.is_file(), "loadable": library is not None, "available": False,
             "path": str(artifact)}
    import paddle

    if library is not None and not paddle.is_compiled_with_cuda():
        why = "library loaded, but this Paddle is CPU-only"
    elif library is not None and ops is None:
        why = "library loaded, but the pybind module is not (see error)"
    else:
        entry["available"] = library is not None
    return {**entry, "why": why}
