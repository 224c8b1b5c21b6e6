#!/usr/bin/env python3
"""The plugin's host cost on the output copies without a GPU: its Python and ctypes path alone (issue 24).

The real ``CudaRuntime`` ctypes bindings and the real ``fdac_d2h_batch`` (custom_ops/copy_batch.cc)
run over ``tests/runtime/fake_cudart.c``, a C stand-in for ``libcudart`` whose calls return at once
(copies are ``memmove``, events are counters). What remains is exactly the host work the plugin adds
around the CUDA calls - on a quiet CPU, without the H200 host's swings, so two trees can be told
apart by a microsecond. Not a GPU measurement: the CUDA calls themselves cost nothing here.

Cases (per call, median over the measured calls; ``--rounds`` interleaved rounds, each tree in its
own process per round):

- ``fill, steady``: one ``PinnedRing.fill`` of B=128 rows x K+1=21 (ids, logprobs, ranks), the same
  shapes every step (the logprobs producer's call);
- ``fill, changing``: the same with the batch size changing every step (rows 128, 127, ... 113);
- ``step copies``: a decode step's own 6 copies + the event in one ``copy_d2h_many`` (FD 2.4's
  stop flag, tokens and step_syncs' snapshot) into the same pinned buffers every step.

    python3 benchmarks/host_cost_local.py [--tree DIR ...] [--rounds 5] [--steps 3000]

``--tree`` adds another checkout (e.g. an earlier commit's ``git archive``) to run side by side with
this one: only its ``fd_async_copy_plugin`` package is used; the glue and the C sources are this
repository's. Needs gcc and g++.
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
CASES = ("fill, steady", "fill, changing", "step copies")


def build(out: Path) -> tuple[str, str]:
    cc, cxx = shutil.which("gcc") or shutil.which("cc"), shutil.which("g++")
    if cc is None or cxx is None:
        raise SystemExit("host_cost_local.py needs gcc and g++")
    fake, batch = out / "libfakecudart.so", out / "libcopybatch.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(fake), str(REPO / "tests" / "runtime" / "fake_cudart.c")],
                   check=True)
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", str(batch), str(REPO / "custom_ops" / "copy_batch.cc")],
                   check=True)
    return str(fake), str(batch)


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
    rt.use_batch(ctypes.CDLL(batch))
    backend = RuntimeBackend(rt, glue=Glue(), probe=False)
    dtypes = {"ids": "int64", "logprobs": "float32", "ranks": "int64"}
    labels = {f: f"gather_logprobs.{f}" for f in dtypes}

    def outs(rows):
        return {"ids": Device((rows, 21), "int64"), "logprobs": Device((rows, 21), "float32"),
                "ranks": Device((rows,), "int64")}

    def fills(batches):
        ring = PinnedRing(backend, "local", dtypes, {"ids": 128 * 21, "logprobs": 128 * 21, "ranks": 128}, slots=2)
        times, previous = [], None
        for step in range(steps + 200):
            t0 = time.perf_counter_ns()
            slot, event = ring.fill("local", batches[step % len(batches)], labels, "gather_logprobs")
            t1 = time.perf_counter_ns()
            held = [slot.buffers[f] for f in dtypes]
            del slot
            if previous is not None:  # the consumer, one step later: wait, then drop the buffers
                backend.wait(previous[0], "consumer")
            previous = (event, held)
            if step >= 200:
                times.append(t1 - t0)
        return statistics.median(times) / 1e3

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

    return {"fill, steady": fills([outs(128)]), "fill, changing": fills([outs(128 - i) for i in range(16)]),
            "step copies": step_copies()}


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
        fake, batch = build(Path(tmp))
        for _ in range(args.rounds):
            for tree in trees:  # each tree in a fresh process, interleaved round by round
                command = [sys.executable, __file__, "--steps", str(args.steps), "--worker", tree, fake, batch]
                done = subprocess.run(command, check=True, capture_output=True, text=True)
                for case, value in json.loads(done.stdout).items():
                    results[tree][case].append(value)
    print(f"host_cost_local.py: the plugin's host path over a C stand-in for libcudart (no GPU); {args.rounds} "
          f"round(s) x {args.steps} calls per case; us per call, median of the round medians (range)")
    print(f"  {'tree':40s} " + " ".join(f"{c:>24s}" for c in CASES))
    for tree in trees:
        cells = []
        for case in CASES:
            values = sorted(results[tree][case])
            cells.append(f"{statistics.median(values):7.2f} ({values[0]:.2f}-{values[-1]:.2f})")
        name = Path(tree).name if tree != str(REPO) else "this checkout"
        print(f"  {name:40s} " + " ".join(f"{c:>24s}" for c in cells))
    for tree in trees[1:]:
        ratios = []
        for case in CASES:
            per_round = sorted(a / b for a, b in zip(results[str(REPO)][case], results[tree][case]))
            ratios.append(f"{statistics.median(per_round):.2f}x")
        print(f"  this checkout / {Path(tree).name}, per round (median): " + ", ".join(
            f"{c} {r}" for c, r in zip(CASES, ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
