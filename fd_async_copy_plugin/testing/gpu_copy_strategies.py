"""Copy strategies for the logprob payload on a Paddle GPU build (part of ``fd-async-copy bench``).

Not run by the project (no GPU build of Paddle 3 installs on its machines); the same comparison
runs without Paddle in benchmarks/cuda_layer_check.py. It measures host time per step of the three strategies this project compares:

- ``blocking .cpu()``: FastDeploy 2.4 (three blocking D2H copies);
- ``fresh pin_memory() per step``: FastDeploy 2.5 / PR #6362 (new pinned tensors every step);
- ``preallocated pinned ring``: this plugin (copies into reused pinned buffers + one event).
"""

from __future__ import annotations

import time


def compare_copy_strategies(batch: int, top_k: int, vocab: int, steps: int = 200) -> dict:  # pragma: no cover
    import paddle

    from ..runtime import PinnedRing
    from ..runtime.cuda import CudaBackend

    paddle.set_device("gpu")
    ids = paddle.randint(0, vocab, [batch, top_k + 1], dtype="int64")
    lps = paddle.randn([batch, top_k + 1], dtype="float32")
    ranks = paddle.randint(0, vocab, [batch], dtype="int64")
    busy = paddle.randn([2048, 2048], dtype="float32")

    def gpu_work():
        paddle.matmul(busy, busy)  # queue device work so that a blocking copy has to wait

    def blocking():
        return ids.cpu(), lps.cpu(), ranks.cpu()

    def fresh_pinned():
        out = []
        for t in (ids, lps, ranks):
            host = paddle.empty_like(t, device="cpu").pin_memory()
            host.copy_(t, False)
            out.append(host)
        event = paddle.device.cuda.create_event()
        event.record()
        event.synchronize()
        return out

    backend = CudaBackend()
    ring = PinnedRing(
        backend,
        "bench",
        {"a": "int64", "b": "float32", "c": "int64"},
        {"a": batch * (top_k + 1), "b": batch * (top_k + 1), "c": batch},
    )

    def preallocated():
        slot = ring.acquire("bench", {"a": ids.shape, "b": lps.shape, "c": ranks.shape})
        for name, t in zip("abc", (ids, lps, ranks)):
            backend.copy_d2h(slot.buffers[name], t, name)
        backend.wait(backend.record("bench"), "bench")

    results = {}
    for name, fn in (
        ("blocking .cpu()", blocking),
        ("fresh pin_memory() per step", fresh_pinned),
        ("preallocated pinned ring + event", preallocated),
    ):
        for _ in range(10):
            gpu_work()
            fn()
        paddle.device.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            gpu_work()
            fn()
        paddle.device.synchronize()
        results[name] = (time.perf_counter() - start) / steps * 1e6
    return results
