"""Host cost of ``step_syncs``' tensor watch per decode step (CPU Paddle, our FD 2.4 replica).

While ``step_syncs`` is enabled, Paddle's ``Tensor.__setitem__``, ``__getitem__`` and ``numpy`` are
the plugin's junctions (declared patches, ``patches/_tensor_watch.py``); outside a thread's
``watching()`` scope their links only look up the thread's scope and call Paddle's method. This
prints, side by side in one run:

- how many calls of each method one replica decode step makes (plugin enabled, all features);
- ns per call of each method with the patches in place (outside a scope) and without them;
- the product: us of host time per decode step the watch adds outside its scopes.

The replica's step makes more tensor calls than FD's (its stand-in ops are Python), so the product
is an upper bound for FD's own calls. Run: ``python benchmarks/tensor_watch_overhead.py [--steps N]``.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import paddle

METHODS = ("__setitem__", "__getitem__", "numpy")


def calls_per_step(steps: int) -> tuple[dict, int]:
    """Calls of each method per executed decode step, through the plugin's junctions."""
    import fd_async_copy_plugin
    from fd_async_copy_plugin.registry.patch import Junction
    from fd_async_copy_plugin.runtime import collecting
    from fd_async_copy_plugin.testing.harness import Variant, device_for, plugin_state
    from fd_async_copy_plugin.testing.reference import ROOTS
    from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

    counts: collections.Counter = collections.Counter()
    config = DriverConfig(max_num_seqs=16, vocab_size=256, max_model_len=96, chunk_size=16)
    requests = [Request(f"w{i}", [(7 * i + j) % 200 + 3 for j in range(4 + i % 9)], max_tokens=steps,
                        eos_token_ids=[-1]) for i in range(12)]
    features = ("logprobs", "stop_flag", "sampled_tokens", "step_syncs")
    for module in ("worker.gpu_model_runner", "model_executor.pre_and_post_process", "model_executor.layers.sample.sampler"):
        __import__(f"{ROOTS['fd24']}.{module}")  # applied at enable, not later in the run
    with device_for("host"), plugin_state(Variant("p", ROOTS["fd24"], True, features), "host"), collecting():
        for name in METHODS:  # count beneath the plugin's link: every call of Paddle's method
            junction = Junction.at(paddle.Tensor, name)
            assert junction is not None and "step_syncs" in junction.links, fd_async_copy_plugin.status()
            junction.set_bottom(_counting(junction.bottom, name, counts))
        try:
            result = run_decode(ROOTS["fd24"], config, requests, max_steps=steps + 8)
        finally:
            for name in METHODS:
                junction = Junction.at(paddle.Tensor, name)
                junction.set_bottom(junction.original)
    return {name: counts[name] / result.executed_steps for name in METHODS}, result.executed_steps


def _counting(method, name, counts):
    def counted(*args, **kwargs):
        counts[name] += 1
        return method(*args, **kwargs)

    return counted


def ns_per_call(repeat: int) -> dict:
    """ns per call of each method on a small host tensor: Paddle's own, and with the watch patched."""
    import fd_async_copy_plugin
    from fd_async_copy_plugin.testing.reference import ROOTS

    t = paddle.to_tensor(np.arange(16, dtype="int64"))
    calls = {
        "__setitem__": lambda: t.__setitem__(3, 5),
        "__getitem__": lambda: t[3],
        "numpy": lambda: t.numpy(),
    }

    def best(fn) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            times.append((time.perf_counter() - start) / repeat)
        return min(times) * 1e9

    fd_async_copy_plugin.disable()
    plain = {name: best(fn) for name, fn in calls.items()}
    fd_async_copy_plugin.enable(features=("stop_flag", "step_syncs"), backend="host", root=ROOTS["fd24"])
    __import__(f"{ROOTS['fd24']}.worker.gpu_model_runner")
    __import__(f"{ROOTS['fd24']}.model_executor.pre_and_post_process")
    try:
        assert fd_async_copy_plugin.status()["features"]["step_syncs"]["state"] == "applied"
        watched = {name: best(fn) for name, fn in calls.items()}
    finally:
        fd_async_copy_plugin.disable()
    return {name: (plain[name], watched[name]) for name in calls}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="decode steps of the replica run (default 24)")
    parser.add_argument("--repeat", type=int, default=20000, help="calls per timing loop (default 20000)")
    args = parser.parse_args(argv)
    per_step, steps = calls_per_step(args.steps)
    timing = ns_per_call(args.repeat)
    print(f"step_syncs tensor watch: replica FD 2.4, {steps} decode steps, CPU Paddle {paddle.__version__}")
    print(f"{'method':<12} {'calls/step':>10} {'Paddle ns':>10} {'watched ns':>11} {'added ns':>9} {'us/step':>8}")
    total = 0.0
    for name in METHODS:
        plain, watched = timing[name]
        added = max(0.0, watched - plain) * per_step[name] / 1000
        total += added
        print(f"{name:<12} {per_step[name]:>10.1f} {plain:>10.0f} {watched:>11.0f} {watched - plain:>9.0f} "
              f"{added:>8.1f}")
    print(f"added host time per decode step outside watching scopes: {total:.1f} us (upper bound: the "
          "replica's Python ops make more tensor calls than FD's)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
