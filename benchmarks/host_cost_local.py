#!/usr/bin/env python3
"""The plugin's host cost on the output copies without a GPU: its Python and ctypes path alone (issue 24).

The real ``CudaRuntime`` ctypes bindings and the real ``fdac_d2h_batch`` (custom_ops/copy_batch.cc)
run over ``custom_ops/fake_cudart.cc`` (the simulator's stand-in for ``libcudart``) with
``fake_immediate`` set: its calls return at once (copies are ``memmove``, events are counters). What remains is exactly the host work the plugin adds
around the CUDA calls - on a quiet CPU, without the H200 host's swings, so two trees can be told
apart by a microsecond. Not a GPU measurement: the CUDA calls themselves cost nothing here.

Cases (per call, median over the measured calls; ``--rounds`` interleaved rounds, each tree in its
own process per round):

- ``fill, steady``: one ``PinnedRing.fill`` of B=128 rows x K+1=21 (ids, logprobs, ranks), the same
  shapes every step (the logprobs producer's call);
- ``fill, changing``: the same with the batch size changing every step (rows 128, 127, ... 113);
- ``step copies``: a decode step's own 6 copies + the event in one ``copy_d2h_many`` (FD 2.4's
  stop flag, tokens and step_syncs' snapshot) into the same pinned buffers every step;
- ``consumer``: the steady fill's consumer one step later, as the GPU scripts time it: the wait on
  its event and a ``read`` of each of the three buffers;
- ``consumer, Paddle`` (where Paddle is installed; the pinned buffers are then Paddle host wraps):
  what FD's guarded save gets - the three buffers through ``to_host`` (the wait, the rows, an owned
  Paddle tensor each) - and the stop flag read as the tree's ``stop_flag`` reads it
  (``host_array``, or ``to_host(...).numpy()`` before it): one step's logprob and flag reads.

    python3 benchmarks/host_cost_local.py [--tree DIR ...] [--rounds 5] [--steps 3000]

``--tree`` adds another checkout (e.g. an earlier commit's ``git archive``) to run side by side with
this one: its ``fd_async_copy_plugin`` package and its ``custom_ops/copy_batch.cc`` (the C signature
its Python binds) are used; the glue and the fake runtime are this repository's. Needs gcc and g++.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from math import prod
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = ("fill, steady", "fill, changing", "step copies", "consumer", "consumer, Paddle")


def build(out: Path, trees: list[str]) -> tuple[str, dict]:
    """The fake runtime, and each tree's ``fdac_d2h_batch`` from its own ``custom_ops/copy_batch.cc``
    (its Python binds that file's signature; a tree without one gets this repository's)."""
    cc, cxx = shutil.which("gcc") or shutil.which("cc"), shutil.which("g++")
    if cc is None or cxx is None:
        raise SystemExit("host_cost_local.py needs gcc and g++")
    fake = out / "libfakecudart.so"
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", str(fake), str(REPO / "custom_ops" / "fake_cudart.cc")],
                   check=True)
    batches = {}
    for i, tree in enumerate(trees):
        source = Path(tree) / "custom_ops" / "copy_batch.cc"
        batches[tree] = str(out / f"libcopybatch{i}.so")
        subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", batches[tree],
                        str(source if source.is_file() else REPO / "custom_ops" / "copy_batch.cc")], check=True)
    return str(fake), batches


def worker(tree: str, fake: str, batch: str, steps: int) -> dict:
    """One tree's cases in this process (``tree``'s package first on the path)."""
    import ctypes

    import numpy as np

    sys.path.insert(0, tree)
    from fd_async_copy_plugin.runtime.cuda import RuntimeBackend
    from fd_async_copy_plugin.runtime.cudart import CudaRuntime
    from fd_async_copy_plugin.runtime.ring import PinnedRing

    class Device:  # a "device" tensor: host memory the fake runtime copies from
        __slots__ = ("shape", "dtype", "ptr", "array", "__weakref__")

        def __init__(self, shape, dtype) -> None:
            self.array = np.zeros(shape, dtype)
            self.shape, self.dtype, self.ptr = tuple(shape), dtype, self.array.ctypes.data

    class Host:  # a pinned buffer's wrap: a numpy view, reshaped in place within its allocation
        __slots__ = ("base", "view", "addr", "__weakref__")

        def __init__(self, array) -> None:
            self.base, self.view, self.addr = array, array, array.ctypes.data

    class Glue:
        name = "local"

        def facts(self, t):
            if type(t) is Device:
                return 0, t.ptr, t.shape, t.dtype, True
            return None, t.addr, t.view.shape, t.view.dtype.name, True

        def address(self, t):
            return t.ptr if type(t) is Device else t.addr

        def shape(self, t):
            return t.shape if type(t) is Device else t.view.shape

        def dtype(self, t):
            return t.dtype if type(t) is Device else t.view.dtype.name

        def is_contiguous(self, t):
            return True

        def gpu_device(self, t):
            return 0 if type(t) is Device else None

        def current_device(self):
            return 0

        def stream(self, device):
            return 7

        def wrap(self, array):
            return Host(array)

        def set_shape(self, t, shape):
            if t.view.shape != tuple(shape):
                t.view = t.base.reshape(-1)[:prod(shape)].reshape(shape)

        def from_numpy(self, array):
            return Host(array)

    rt = CudaRuntime(lib=ctypes.CDLL(fake), origin="fake")
    ctypes.c_int.in_dll(rt.lib, "fake_immediate").value = 1  # calls that cost nothing, copies landed at once
    rt.use_batch(ctypes.CDLL(batch))
    backend = RuntimeBackend(rt, glue=Glue(), probe=False)
    dtypes = {"ids": "int64", "logprobs": "float32", "ranks": "int64"}
    labels = {f: f"gather_logprobs.{f}" for f in dtypes}

    def outs(rows):
        return {"ids": Device((rows, 21), "int64"), "logprobs": Device((rows, 21), "float32"),
                "ranks": Device((rows,), "int64")}

    def fills(batches, on=backend, consumer=None):
        """(producer, consumer) us per step: ``ring.fill`` now, and one step later the consumer of the
        last fill (by default the GPU scripts': the wait, then a ``read`` of each buffer)."""
        ring = PinnedRing(on, "local", dtypes, {"ids": 128 * 21, "logprobs": 128 * 21, "ranks": 128}, slots=2)
        times, consumed, previous = [], [], None

        def reads(event, held):  # (a function: no loop variable keeps a buffer referenced afterwards)
            on.wait(event, "consumer")
            for buf in held:
                on.read(buf, "consumer")

        for step in range(steps + 200):
            t0 = time.perf_counter_ns()
            slot, event = ring.fill("local", batches[step % len(batches)], labels, "gather_logprobs")
            t1 = time.perf_counter_ns()
            held = [slot.buffers[f] for f in dtypes]
            del slot
            if previous is not None:  # the consumer, one step later; then the buffers are dropped
                (consumer or reads)(*previous)
            t2 = time.perf_counter_ns()
            previous = (event, held)
            if step >= 200:
                times.append(t1 - t0)
                consumed.append(t2 - t1)
        return statistics.median(times) / 1e3, statistics.median(consumed) / 1e3

    def step_copies():
        sources = [Device((1,), "bool"), Device((128, 1), "int64"), Device((128,), "int32"), Device((1,), "int64"),
                   Device((128,), "int32"), Device((1,), "int32")]
        copies = [(backend.new_pinned(list(s.shape), s.dtype, f"step.{i}"), s, f"step.{i}")
                  for i, s in enumerate(sources)]
        times = []
        for step in range(steps + 200):
            t0 = time.perf_counter_ns()
            event = backend.copy_d2h_many(copies, "post_process")
            t1 = time.perf_counter_ns()
            backend.wait(event, "save")
            if step >= 200:
                times.append(t1 - t0)
        return statistics.median(times) / 1e3

    steady, consumer = fills([outs(128)])
    results = {"fill, steady": steady, "fill, changing": fills([outs(128 - i) for i in range(16)])[0],
               "step copies": step_copies(), "consumer": consumer, "consumer, Paddle": None}
    try:
        import paddle  # noqa: F401
    except ImportError:
        return results
    paddle_backend, paddle_reads = paddle_consumer(rt, Device)
    results["consumer, Paddle"] = fills([outs(128)], paddle_backend, paddle_reads)[1]
    return results


def paddle_consumer(rt, Device):
    """``consumer, Paddle``: a backend on the same runtime whose pinned buffers are Paddle host wraps,
    and one step's reads by FD's guarded save: the three logprob buffers through ``to_host``, and the
    stop flag as the tree's ``stop_flag`` reads it."""
    from fd_async_copy_plugin.runtime.cuda import RuntimeBackend
    from fd_async_copy_plugin.runtime.glue import PaddleGlue

    class Wraps(PaddleGlue):  # Paddle's accessors for the pinned wraps, the stand-in's for the sources
        def facts(self, t):
            return (0, t.ptr, t.shape, t.dtype, True) if type(t) is Device else super().facts(t)

        def address(self, t):
            return t.ptr if type(t) is Device else super().address(t)

        def shape(self, t):
            return t.shape if type(t) is Device else super().shape(t)

        def dtype(self, t):
            return t.dtype if type(t) is Device else super().dtype(t)

        def gpu_device(self, t):
            return 0 if type(t) is Device else None

        def stream(self, device):
            return 7

    backend = RuntimeBackend(rt, glue=Wraps(), probe=False)
    flag, flag_src = backend.new_pinned([1], "bool", "flag"), Device((1,), "bool")
    host_array = getattr(backend, "host_array", None)  # (before the eighth cut: to_host(...).numpy())

    def reads(event, held):
        backend.copy_d2h_many([(flag, flag_src, "not_need_stop")], "post_process")  # (not timed apart)
        for buf in held:
            backend.to_host(buf, "save_output_topk")
        if host_array is not None:
            bool(host_array(flag, "save_output")[0])
        else:
            bool(backend.to_host(flag, "save_output").numpy()[0])

    return backend, reads


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="another checkout to run beside this one")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000, help="measured calls per case and round")
    parser.add_argument("--worker", nargs=3, metavar=("TREE", "FAKE", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.steps)))
        return 0
    trees = [str(REPO)] + [str(Path(t).resolve()) for t in args.tree]
    results: dict = {t: {c: [] for c in CASES} for t in trees}
    with tempfile.TemporaryDirectory(prefix="fdac-local-") as tmp:
        fake, batches = build(Path(tmp), trees)
        for _ in range(args.rounds):
            for tree in trees:  # each tree in a fresh process, interleaved round by round
                command = [sys.executable, __file__, "--steps", str(args.steps), "--worker", tree, fake, batches[tree]]
                done = subprocess.run(command, check=True, capture_output=True, text=True)
                for case, value in json.loads(done.stdout).items():
                    results[tree][case].append(value)
    print(f"host_cost_local.py: the plugin's host path over a C stand-in for libcudart (no GPU); {args.rounds} "
          f"round(s) x {args.steps} calls per case; us per call, median of the round medians (range)")
    print(f"  {'tree':40s} " + " ".join(f"{c:>24s}" for c in CASES))
    for tree in trees:
        cells = []
        for case in CASES:
            values = sorted(v for v in results[tree][case] if v is not None)
            cells.append(f"{statistics.median(values):7.2f} ({values[0]:.2f}-{values[-1]:.2f})" if values else "-")
        name = Path(tree).name if tree != str(REPO) else "this checkout"
        print(f"  {name:40s} " + " ".join(f"{c:>24s}" for c in cells))
    for tree in trees[1:]:
        ratios = []
        for case in CASES:
            per_round = sorted(a / b for a, b in zip(results[str(REPO)][case], results[tree][case]) if a and b)
            ratios.append(f"{statistics.median(per_round):.2f}x" if per_round else "-")
        print(f"  this checkout / {Path(tree).name}, per round (median): " + ", ".join(
            f"{c} {r}" for c, r in zip(CASES, ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
