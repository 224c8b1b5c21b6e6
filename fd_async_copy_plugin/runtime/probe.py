"""Startup probe: do the framework's accessors agree with the CUDA layer on this device?

The ``cuda`` backend trusts answers from Paddle that no machine of this project can check (no GPU
build of Paddle 3 installs here). ``probe_accessors(device)`` checks them once per device, at first
use, with a few microsecond-sized copies (about 1-3 ms in all, mostly queued GPU work):

- ``current_device``: Paddle's current device is the CUDA runtime's current device of this thread;
- ``data_ptr``: the address of a GPU tensor is device memory on that device (cudaPointerGetAttributes)
  and copying its bytes by address gives the tensor's values (and its place names that device);
- ``contiguous``: a fresh tensor is ``is_contiguous()``; a transposed view is not, or is dense at
  its ``data_ptr()`` (a copy by address reads a source flat);
- ``stream_order``: a copy by address on the handle Paddle reports, issued after a Paddle op that
  fills a tensor behind ~1 ms of queued GPU work, sees the filled values (the handle is the stream
  Paddle's ops run on);
- ``kernel_order`` (when the stop-flag kernels are given): our kernel, launched on that handle after
  a Paddle op, reads that op's result, and its output copied by the layer is what the kernel wrote;
- ``pinned_wrap``: pinned memory from the layer, wrapped as a host tensor, is the same memory
  (address), reads back through Paddle (``.numpy()``) and keeps its address when reshaped;
- ``batch_api`` (where the runtime offers ``cudaMemcpyBatchAsync``, CUDA 12.8 and later): three parts
  of a device tensor copied in one batch call on the reported stream land where a copy each puts
  them. This check decides the batch call, never the probe: it passes either way, and the batch
  call is used from then on only if the copies agreed (else a copy each, as before, saying why).

Any failed check makes the result ``ok: False`` with the reason; the backend then raises
``AccessorProbeError`` and the features stand down with that reason in ``status()`` (strict mode
refuses to start). The result is a plain dict, so ``fd-async-copy selftest`` can report it.

The logic is framework-neutral: ``glue`` (accessors), ``rt`` (the layer) and ``ops`` (a few framework
ops: make a device tensor, transpose it, fill it in place, queue work, synchronize) are parameters.
The CPU tests run it on CPU Paddle over ``HostRuntime`` with planted disagreements.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from .cudart import CopySet, runtime
from .glue import composed_facts, paddle_glue

_N = 256  # elements per probe tensor
_PATTERN = np.arange(_N, dtype=np.int64) * 7919 + 13


class PaddleProbeOps:
    """The framework ops the probe needs, for Paddle (``place`` None = ``CUDAPlace(device)``)."""

    def __init__(self, place=None) -> None:
        import paddle

        self.paddle, self.place = paddle, place

    def _place(self, device: int):
        return self.place if self.place is not None else self.paddle.CUDAPlace(device)

    def tensor(self, values: np.ndarray, device: int):
        return self.paddle.to_tensor(values, place=self._place(device))

    def fill(self, t, value) -> None:
        t.fill_(value)  # an in-place Paddle op on the device's current stream

    def transposed(self, t):
        return t.transpose([1, 0])  # a strided view where Paddle makes views (its stride kernels)

    def _on_gpu(self) -> bool:
        return self.place is None or self.place.is_gpu_place()

    def busy(self, device: int) -> None:
        """Queue about a millisecond of GPU work on the current stream (nothing on CPU)."""
        if not self._on_gpu():
            return
        x = self.paddle.to_tensor(np.full([1024, 1024], 1e-3, dtype=np.float32), place=self._place(device))
        for _ in range(8):
            x = self.paddle.matmul(x, x)

    def host_values(self, t) -> np.ndarray:
        return np.array(t.numpy(), copy=True)

    def synchronize(self, device: int) -> None:
        if self._on_gpu():
            self.paddle.device.synchronize()


def probe_accessors(device: int, glue=None, rt=None, ops=None, kernels=None) -> dict:
    """Run every check on ``device``; returns ``{"ok", "device", "reason", "checks": [...],
    "seconds"}`` where each check is ``{"check", "ok", "detail"}``. Never raises: an exception in a
    check is that check's failure."""
    glue, rt, ops = glue or paddle_glue(), rt or runtime(), ops or PaddleProbeOps()
    checks = [_check_current_device, _check_data_ptr, _check_contiguous, _check_stream_order, _check_pinned_wrap]
    if kernels is not None:
        checks.append(_check_kernel_order)
    if getattr(getattr(rt, "batch", None), "batch_api", None) is not None:
        checks.append(_check_batch_api)
    start, results = time.perf_counter(), []
    for check in checks:  # (each named for its function: ``_check_<name>``)
        try:
            ok, detail = check(device, glue, rt, ops, kernels)
        except Exception as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        results.append({"check": check.__name__.removeprefix("_check_"), "ok": bool(ok), "detail": detail})
    reason = "; ".join(f"{r['check']}: {r['detail']}" for r in results if not r["ok"])
    return {"ok": not reason, "device": device, "runtime": getattr(rt, "origin", ""),
            "reason": f"Paddle's accessors disagree with the CUDA layer ({reason})" if reason else "",
            "checks": results, "seconds": round(time.perf_counter() - start, 6)}


class _Pinned:
    """Probe-local pinned memory from the layer (poisoned with the byte ``poison``) and an event,
    both freed after the probe's waits."""

    def __init__(self, rt, nbytes: int, poison: int | None = None) -> None:
        self.rt, self.nbytes, self.event = rt, nbytes, rt.event_create()
        self.ptr = rt.host_alloc(nbytes)  # (a failed allocation leaves the event: the probe then fails)
        if poison is not None:
            ctypes.memset(self.ptr, poison, nbytes)

    def values(self, dtype=np.int64, count=_N, offset: int = 0) -> np.ndarray:
        raw = (ctypes.c_byte * (self.nbytes - offset)).from_address(self.ptr + offset)
        return np.frombuffer(raw, dtype=dtype, count=count).copy()

    def copy(self, src: int, nbytes: int, stream: int, offset: int = 0) -> None:
        """``nbytes`` at device address ``src`` copied to byte ``offset`` on ``stream``, waited for."""
        self.rt.memcpy_d2h_async(self.ptr + offset, src, nbytes, stream)
        self.rt.event_record(self.event, stream)
        self.rt.event_synchronize(self.event)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.rt.event_destroy(self.event)
        self.rt.host_free(self.ptr)


def _pattern_copied(rt, src: int, stream: int) -> np.ndarray:
    """``_PATTERN.nbytes`` bytes at device address ``src`` copied by the layer into poisoned pinned
    memory on ``stream`` and waited for, as int64 values."""
    with _Pinned(rt, _PATTERN.nbytes, poison=0xAB) as pinned:
        pinned.copy(src, _PATTERN.nbytes, stream)
        return pinned.values()


def _check_current_device(device, glue, rt, ops, kernels):
    paddle_device, cuda_device = glue.current_device(), rt.get_device()
    return paddle_device == cuda_device == device, f"framework current device {paddle_device}, CUDA current device {cuda_device}, probed gpu:{device}"


def _facts_disagree(glue, t) -> str:
    """Why ``glue.facts`` (what the copies ask) disagrees with the accessors checked here ("": it agrees)."""
    facts = getattr(glue, "facts", None)
    if facts is None or facts(t) == composed_facts(glue, t):
        return ""
    return f"facts() answers {facts(t)}, the accessors {composed_facts(glue, t)}"


def _check_data_ptr(device, glue, rt, ops, kernels):
    t = ops.tensor(_PATTERN, device)
    ops.synchronize(device)
    if glue.gpu_device(t) != device:
        return False, f"a tensor made on gpu:{device} reports device {glue.gpu_device(t)}"
    if disagree := _facts_disagree(glue, t):
        return False, disagree
    address = glue.address(t)
    kind, where = rt.pointer_info(address)
    expected = "device" if rt.name == "cuda" else "host"
    if kind != expected or (expected == "device" and where != device):
        return False, f"data_ptr() {address:#x} is {kind} memory on device {where}, expected {expected} memory on gpu:{device}"
    got = _pattern_copied(rt, address, glue.stream(device))
    same = bool(np.array_equal(got, _PATTERN))
    return same, f"data_ptr() {address:#x} ({kind} memory): copying {_PATTERN.nbytes} bytes from it gives the tensor's values: {same}"


def _check_contiguous(device, glue, rt, ops, kernels):
    square = _PATTERN.reshape(16, 16)
    base = ops.tensor(square, device)
    view = ops.transposed(base)
    ops.synchronize(device)
    if not glue.is_contiguous(base):
        return False, "a fresh tensor reports is_contiguous() False"
    if disagree := _facts_disagree(glue, view):
        return False, disagree
    if not glue.is_contiguous(view):
        return True, "a fresh tensor reports contiguous, its transposed view not (never copied by address)"
    got = _pattern_copied(rt, glue.address(view), glue.stream(device)).reshape(16, 16)  # dense at its address?
    dense = bool(np.array_equal(got, square.T))
    return dense, f"a transposed tensor reports contiguous; copying it by address gives its values: {dense}"


def _check_stream_order(device, glue, rt, ops, kernels):
    t = ops.tensor(np.zeros(_N, dtype=np.int64), device)
    ops.synchronize(device)
    ops.busy(device)
    ops.fill(t, 7)  # queued behind the busy work on the framework's current stream
    got = _pattern_copied(rt, glue.address(t), glue.stream(device))
    ops.synchronize(device)
    ok = bool((got == 7).all())
    return ok, f"a copy on the reported stream after a framework op sees that op's result: {ok} (first values {got[:4].tolist()})"


def _check_kernel_order(device, glue, rt, ops, kernels):
    # update_inputs with one slot: input_ids[0] = next_tokens[0]; a stopped slot gives not_need_stop False.
    next_tokens = ops.tensor(np.zeros(1, dtype=np.int64), device)
    input_ids = ops.tensor(np.full(1, -1, dtype=np.int64), device)
    stop_flags = ops.tensor(np.ones(1, dtype=np.bool_), device)
    not_need_stop = ops.tensor(np.ones(1, dtype=np.bool_), device)
    seq = [ops.tensor(np.zeros(1, dtype=np.int32), device) for _ in range(3)]
    is_block_step = ops.tensor(np.zeros(1, dtype=np.bool_), device)
    ops.synchronize(device)
    ops.busy(device)
    ops.fill(next_tokens, 4242)  # the framework op our kernel must be ordered after
    stream = glue.stream(device)
    on_stream = {"stream": stream} if kernels.flavor == "cuda" else {}  # the host library: no stream
    addresses = [glue.address(t) for t in (stop_flags, not_need_stop, *seq, input_ids)]
    addresses += [None, glue.address(next_tokens), glue.address(is_block_step)]  # (stop_nums: none)
    status = kernels.update_inputs(*addresses, bsz=1, max_bsz=1, input_ids_stride=1, **on_stream)
    if status != 0:
        return False, f"kernel launch failed: {kernels.message(status)} (status {status})"
    with _Pinned(rt, 16) as pinned:
        pinned.copy(glue.address(input_ids), 8, stream)
        pinned.copy(glue.address(not_need_stop), 1, stream, offset=8)
        token, flag = int(pinned.values(np.int64, 1)[0]), bool(pinned.values(np.bool_, 1, offset=8)[0])
    ops.synchronize(device)
    ok = token == 4242 and flag is False
    return ok, f"kernel on the reported stream read the framework op's value: input_ids[0]={token} (expected 4242), not_need_stop={flag} (expected False)"


def _check_pinned_wrap(device, glue, rt, ops, kernels):
    count = 64
    with _Pinned(rt, count * 8) as pinned:
        raw = (ctypes.c_byte * pinned.nbytes).from_address(pinned.ptr)
        array = np.frombuffer(raw, dtype=np.int64, count=count)
        array[:] = _PATTERN[:count]
        t = glue.wrap(array)
        address = glue.address(t)
        if address != pinned.ptr:
            return False, f"the wrap is at {address:#x}, the pinned memory at {pinned.ptr:#x}: not zero-copy"
        if glue.gpu_device(t) is not None:
            return False, f"the wrap is a GPU tensor (gpu:{glue.gpu_device(t)}), expected a host tensor"
        array[0] = -5  # written after wrapping: visible only if the wrap is the same memory
        got = ops.host_values(t)
        if got[0] != -5 or not np.array_equal(got[1:], _PATTERN[1:count]):
            return False, f"reading the wrap through the framework gave {got[:4].tolist()}, expected {[-5] + _PATTERN[1:4].tolist()}"
        glue.set_shape(t, (count // 2, 1))
        kept = glue.address(t) == pinned.ptr and glue.shape(t) == (count // 2, 1)
        del t, array
        return kept, f"wrap at the pinned address, reads back through the framework; reshaped in place: {kept}"


def _check_batch_api(device, glue, rt, ops, kernels):
    batch, parts = rt.batch, (0, 40, 200, _N)  # three copies of unequal sizes: [0, 40), [40, 200), ...
    try:
        t = ops.tensor(_PATTERN, device)
        ops.synchronize(device)
        address, stream, sizes = glue.address(t), glue.stream(device), [8 * (b - a) for a, b in zip(parts, parts[1:])]
        batch.use_batch_api(True, "being checked")
        with _Pinned(rt, _PATTERN.nbytes, poison=0xAB) as pinned:  # (its event recorded by the C call)
            # the parts land in reverse order in the buffer: a batch that ignored a copy's address would show
            dsts = [pinned.ptr + _PATTERN.nbytes - 8 * b for b in parts[1:]]
            CopySet(batch, dsts, sizes).issue([address + 8 * a for a in parts[:-1]], sizes, stream, pinned.event)
            rt.event_synchronize(pinned.event)
            got = pinned.values()
        expected = np.concatenate([_PATTERN[a:b] for a, b in zip(parts[-2::-1], parts[:0:-1])])
        same = bool(np.array_equal(got, expected))
        why = "three copies in one call on the reported stream landed where a copy each puts them" if same else \
            f"three copies in one call gave {got[:4].tolist()}..., expected {expected[:4].tolist()}..."
    except Exception as exc:  # a runtime that refuses the call (or a check that could not run): a copy each
        same, why = False, f"the call failed ({type(exc).__name__}: {exc})"
    batch.use_batch_api(same, f"{why} (gpu:{device})")
    return True, f"cudaMemcpyBatchAsync {batch.batch_api_state}"
