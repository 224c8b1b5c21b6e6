#!/usr/bin/env python3
"""Check, on a machine with a GPU build of Paddle 3, what the project could not check itself.

Not run by the project: no GPU build of Paddle 3 can be installed on its machines. Run it on the machine that serves FastDeploy (paddlepaddle-gpu 3.3.x, after
``fd-async-copy build-ops``)::

    python benchmarks/paddle_gpu_check.py            # prints PASS/FAIL per check, exit 1 on a failure
    python benchmarks/paddle_gpu_check.py --json

Checks (each is an answer from Paddle the plugin's ``cuda`` backend relies on; the CUDA layer
itself, the backend, the ring and the kernels are checked on an H200 without Paddle by
``benchmarks/cuda_layer_check.py``):

1. The accessor probe (``runtime.probe.probe_accessors``, also run by the backend at first use):
   Paddle's current device, a GPU tensor's ``data_ptr()``, the raw handle of
   ``paddle.device.current_stream(place)`` (ordering after a Paddle op, for copies and for our
   kernel), and a pinned wrap reading back through Paddle.
2. The backend's asynchronous copy: ``copy_d2h`` returns with GPU work queued, the event is
   pending right after it, the data is right after the wait.
3. A pinned buffer is a CPU-place tensor over ``cudaHostAlloc`` memory (zero-copy), and a Paddle op
   on it runs on the CPU: the buffer stays where it is (a pinned-place tensor would move to the GPU).
4. Our CUDA stop-flag kernels, launched from Paddle GPU tensors on Paddle's current stream
   (``tensor.data_ptr()`` + the stream handle), give the same results as the host implementation.
5. The plugin's ``cuda`` backend + ``PinnedRing`` make zero pinned allocations after warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def check_accessor_probe(paddle):
    from fd_async_copy_plugin.ops import load_ops
    from fd_async_copy_plugin.runtime.probe import probe_accessors

    ops = load_ops()
    result = probe_accessors(paddle.device.current_device(), kernels=ops.cuda_library)
    detail = "; ".join(f"{c['check']}: {'ok' if c['ok'] else 'FAILED'} ({c['detail']})" for c in result["checks"])
    return result["ok"], detail


def check_async_copy(paddle):
    from fd_async_copy_plugin.runtime.cuda import CudaBackend

    backend = CudaBackend()
    dst = backend.new_pinned([1024], "int64", "check")
    busy = paddle.randn([4096, 4096], dtype="float32")
    src = paddle.full([1024], 7, dtype="int64")
    for _ in range(8):
        busy = paddle.matmul(busy, busy) * 1e-4  # queue GPU work ahead of the copy
    src_after = src + 0  # produced after the busy work, in stream order
    start = time.perf_counter()
    backend.copy_d2h(dst, src_after, "check")
    issued = time.perf_counter() - start
    event = backend.record("check")
    pending = not backend.query(event)
    host = backend.to_host(dst, "check")
    correct = bool((host.numpy() == 7).all())
    return pending and correct, (
        f"copy_d2h returned after {issued * 1e6:.0f} us with GPU work queued; event pending right after: "
        f"{pending} (False means the copy blocked); data correct after the wait: {correct}"
    )


def check_pinned_buffer_is_a_cpu_wrap(paddle):
    from fd_async_copy_plugin.runtime.cuda import CudaBackend

    backend = CudaBackend()
    buf = backend.new_pinned([64], "float32", "check")
    memory = backend.memory_of(buf)
    kind, _ = backend.rt.pointer_info(buf.data_ptr())
    backend.copy_d2h(buf, paddle.arange(8, dtype="float32"), "check")
    rows = backend.to_host(buf, "check", 2, 4).numpy().tolist()
    _ = buf + 1  # a Paddle op on the buffer: a CPU op, the buffer stays put
    ok = buf.place.is_cpu_place() and buf.data_ptr() == memory.ptr and kind == "host" and rows == [2.0, 3.0]
    return ok, (f"place {buf.place}, at the cudaHostAlloc address: {buf.data_ptr() == memory.ptr}, "
                f"CUDA says {kind} memory, rows read: {rows}")


def check_kernels_from_paddle(paddle):
    import numpy as np

    from fd_async_copy_plugin.ops import load_ops
    from fd_async_copy_plugin.testing.slot_states import copy_batch, random_v1_batch

    ops = load_ops()
    if not ops.has_cuda_kernels:
        return False, f"CUDA kernels not available: {ops.cuda_why}"
    rng = np.random.default_rng(0)
    mismatches = 0
    for _ in range(20):
        batch = random_v1_batch(rng)
        host = {k: paddle.to_tensor(v).cpu() if isinstance(v, np.ndarray) else v for k, v in copy_batch(batch).items()}
        gpu = {k: paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in copy_batch(batch).items()}
        args = (
            "stop_flags", "not_need_stop", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder",
            "step_seq_lens_decoder", "prompt_lens", "topk_ids", "input_ids", "block_tables", "stop_nums",
            "next_tokens", "is_block_step",
        )
        ops.update_inputs_v1_host(*(host[a] for a in args), host["block_size"], host.get("prefill_one_step_stop", False))
        ops.update_inputs_v1_cuda(*(gpu[a] for a in args), gpu["block_size"], gpu.get("prefill_one_step_stop", False))
        paddle.device.synchronize()
        for a in args:
            if not np.array_equal(host[a].numpy(), gpu[a].numpy()):
                mismatches += 1
    return mismatches == 0, f"{mismatches} mismatching arrays over 20 random batches"


def check_no_pinned_allocs_after_warmup(paddle):
    from fd_async_copy_plugin.runtime import PinnedRing, collecting
    from fd_async_copy_plugin.runtime.cuda import CudaBackend

    backend = CudaBackend()
    ring = PinnedRing(backend, "check", {"x": "float32"}, {"x": 128 * 21}, slots=2)
    x = paddle.randn([128, 21], dtype="float32")
    with collecting() as census:
        for _ in range(50):
            census.begin_step()
            slot = ring.acquire("check", {"x": list(x.shape)})
            backend.copy_d2h(slot.buffers["x"], x, "check")
            backend.to_host(slot.buffers["x"], "check")
    allocs = census.totals()["pinned_alloc"] + census.totals()["pinned_free"]
    return allocs == 0, f"pinned allocations/frees in 50 steps: {allocs}"


CHECKS = (
    ("accessor probe (device, data_ptr, stream handle, kernel order, pinned wrap)", check_accessor_probe),
    ("async copy into pinned + event", check_async_copy),
    ("pinned buffer is a zero-copy CPU tensor over cudaHostAlloc memory", check_pinned_buffer_is_a_cpu_wrap),
    ("CUDA stop-flag kernels from Paddle tensors", check_kernels_from_paddle),
    ("no pinned allocations after warm-up", check_no_pinned_allocs_after_warmup),
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import paddle

    if not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() < 1:
        print("this check needs a GPU build of Paddle and a GPU", file=sys.stderr)
        return 2
    paddle.set_device("gpu")
    results = []
    for name, check in CHECKS:
        try:
            ok, detail = check(paddle)
        except Exception as exc:  # report every check, then fail
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        results.append({"check": name, "ok": ok, "detail": detail})
    if args.json:
        json.dump(results, sys.stdout, indent=2)
    else:
        for r in results:
            print(f"{'PASS' if r['ok'] else 'FAIL'}  {r['check']}: {r['detail']}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
