"""Issue 13 defect 3: several threads producing and consuming logprobs at once (FastDeploy runs an
output thread beside the model loop) share the pinned ring and the backend's bookkeeping."""

from __future__ import annotations

import sys
import threading

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import ROOTS

FD24 = ROOTS["fd24"]
VOCAB = 96


@pytest.fixture(params=["host", "sim"])
def patched(request, lpkit):
    sampler_mod = lpkit.replica_module(FD24, "model_executor.layers.sample.sampler")
    lpkit.replica_module(FD24, "worker.gpu_model_runner")
    original = sampler_mod.Sampler.gather_logprobs
    fd_async_copy_plugin.disable()
    fd_async_copy_plugin.enable(features=["logprobs"], backend=request.param, root=FD24)
    assert fd_async_copy_plugin.status()["features"]["logprobs"]["state"] == "applied"
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show in milliseconds
    yield sampler_mod.Sampler(fd_config=None), original
    sys.setswitchinterval(switch)
    fd_async_copy_plugin.disable()


def _inputs(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((rows, VOCAB)).astype("float32")
    logprobs = paddle.nn.functional.log_softmax(paddle.to_tensor(logits), axis=-1)
    tokens = paddle.to_tensor(rng.integers(0, VOCAB, size=(rows, 1)), dtype="int64")
    return logprobs, tokens


@pytest.mark.parametrize("abandon", [0, 3], ids=["read-all", "abandon-every-3rd"])
def test_concurrent_producers_and_consumers_each_get_their_own_results(patched, abandon):
    # ``abandon``: every n-th result is dropped unread (a request cancelled before its output was
    # read), so free slots with copies still in flight are reused with other threads' shapes while
    # other threads' waits land those copies. (A CI run once failed here when a thread's last
    # results were dropped that way: the simulator landed a copy through the buffer's new shape.
    # The window is microseconds wide; ``test_simulator``'s refit test pins it down.)
    sampler, original = patched
    threads_n, rounds = 6, 60
    errors: list = []
    start = threading.Barrier(threads_n)

    def worker(index: int) -> None:
        try:
            rows, width = 2 + index, 1 + index  # every thread its own shapes and values
            cases = []
            for r in range(4):
                logprobs, tokens = _inputs(rows, seed=100 * index + r)
                expected = original(sampler, logprobs.clone(), width, tokens)
                cases.append((logprobs, tokens, [np.array(f.numpy()) for f in expected]))
            start.wait()
            held = []
            for step in range(rounds):
                logprobs, tokens, expected = cases[step % len(cases)]
                result = sampler.gather_logprobs(logprobs.clone(), width, tokens)
                if abandon and step % abandon == abandon - 1:
                    del result  # never read: its slot is free with its copies in flight
                    continue
                held.append((result, expected))
                if len(held) > 2:  # a consumer one or two steps behind, like a deferred save
                    old, want = held.pop(0)
                    got = [np.array(f.numpy()) for f in old.materialize()]
                    for g, w in zip(got, want):
                        if g.shape != w.shape or not np.array_equal(g, w):
                            raise AssertionError(f"thread {index} step {step}: got {g.shape} {g.ravel()[:4]}, "
                                                 f"expected {w.shape} {w.ravel()[:4]}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors, errors[:5]


def test_the_backend_bookkeeping_survives_concurrent_records_and_waits():
    """Each thread's buffer keeps its own copy set's event while other threads issue and record."""
    backend = runtime.SimulatedBackend()
    errors: list = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def producer(index: int) -> None:
        try:
            buf = backend.new_pinned([4], "int64", f"b{index}")
            for step in range(400):
                backend.copy_d2h(buf, paddle.full([4], step, dtype="int64"), f"p{index}")
                backend.record(f"p{index}")
                value = backend.to_host(buf, f"c{index}").numpy()
                if int(value[0]) != step:
                    raise AssertionError(f"thread {index}: read {value[0]} for step {step}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}")

    try:
        workers = [threading.Thread(target=producer, args=(i,)) for i in range(6)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors[:5]
