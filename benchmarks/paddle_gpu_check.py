#!/usr/bin/env python3
"""Check, on a machine with a GPU build of Paddle 3, what the project could not check itself.

UNVERIFIED ON GPU until someone runs this: no GPU build of Paddle 3 can be installed on the
project's machines. Run it on the machine that serves FastDeploy (paddlepaddle-gpu 3.3.x, after
``fd-async-copy build-ops``)::

    python benchmarks/paddle_gpu_check.py            # prints PASS/FAIL per check, exit 1 on a failure
    python benchmarks/paddle_gpu_check.py --json

Checks (each is an assumption the plugin's ``cuda`` backend relies on):

1. ``copy_(gpu_src, False)`` into a pinned buffer is asynchronous, and the data is there after
   an event recorded behind it is waited on; ``.numpy()`` before the wait may see old data.
2. ``copy_`` resizes a pinned destination to the source shape and keeps its allocation (same
   ``data_ptr``) when the source is smaller, so the ring never reallocates after warm-up.
3. The pinned buffer stays pinned after ``copy_`` and after the plugin's host reads.
4. Our CUDA stop-flag kernels, launched from Paddle GPU tensors on Paddle's current stream
   (``tensor.data_ptr()`` + the stream handle), give the same results as the host implementation.
5. The plugin's ``cuda`` backend + ``PinnedRing`` make zero pinned allocations after warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def check_async_copy(paddle):
    busy = paddle.randn([4096, 4096], dtype="float32")
    src = paddle.full([1024], 7, dtype="int64")
    dst = paddle.zeros([1024], dtype="int64").cpu().pin_memory()
    for _ in range(8):
        busy = paddle.matmul(busy, busy) * 1e-4  # queue GPU work ahead of the copy
    src_after = src + 0  # produced after the busy work, in stream order
    start = time.perf_counter()
    dst.copy_(src_after, False)
    issued = time.perf_counter() - start
    event = paddle.device.cuda.Event(blocking=True)
    event.record()
    pending = not event.query()  # an asynchronous copy is still queued behind the busy work
    event.synchronize()
    correct = bool((dst.numpy() == 7).all())
    ok = pending and correct
    return ok, (
        f"copy_ returned after {issued * 1e6:.0f} us with GPU work queued; event still pending right "
        f"after copy_: {pending} (False means copy_ blocked); data correct after the event: {correct}"
    )


def check_resize_keeps_allocation(paddle):
    dst = paddle.zeros([4096], dtype="int64").cpu().pin_memory()
    ptr = dst.data_ptr()
    dst.copy_(paddle.arange(100, dtype="int64").reshape([10, 10]), False)
    paddle.device.synchronize()
    same = dst.data_ptr() == ptr and list(dst.shape) == [10, 10]
    pinned = dst.place.is_cuda_pinned_place()
    return same and pinned, f"shape {list(dst.shape)}, same allocation {dst.data_ptr() == ptr}, still pinned {pinned}"


def check_host_read_keeps_pinned(paddle):
    from fd_async_copy_plugin.runtime.cuda import CudaBackend

    backend = CudaBackend()
    buf = backend.new_pinned([64], "float32", "check")
    backend.copy_d2h(buf, paddle.arange(8, dtype="float32"), "check")
    host = backend.to_host(buf, "check", 2, 4)
    ok = buf.place.is_cuda_pinned_place() and host.numpy().tolist() == [2.0, 3.0]
    return ok, f"pinned after read: {buf.place.is_cuda_pinned_place()}, rows read: {host.numpy().tolist()}"


def check_kernels_from_paddle(paddle):
    import numpy as np

    from fd_async_copy_plugin.ops import load_ops
    from fd_async_copy_plugin.ops.slot_states import copy_batch, random_v1_batch

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
    ("async copy into pinned + event", check_async_copy),
    ("copy_ resize keeps the pinned allocation", check_resize_keeps_allocation),
    ("host read keeps the buffer pinned", check_host_read_keeps_pinned),
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
