#!/usr/bin/env python3
"""GPU check of the stop-flag CUDA kernels (custom_ops/stop_flag_kernels.cu), without Paddle.

What it does, on a machine with a GPU, nvcc and g++, and PyTorch or CuPy:

1. compiles ``libfd_async_copy_cuda.so`` (nvcc, for this GPU's architecture) and the host
   implementation ``stop_flag_host.cc`` as a plain shared library (g++) - or takes ``--cuda-lib``;
2. correctness: runs ``update_inputs_v1`` and ``update_inputs`` on >= 10,000 random slot states each
   (every branch: stopped, stopped in prefill, prefill chunk, one-step stop, decode, block step;
   bsz < max_bsz; batches up to 1024) on the GPU, through raw device pointers and a CUDA stream of
   the chosen framework, and compares every output array and the DEVICE ``not_need_stop`` with the
   host implementation and with the numpy reference (update_inputs_semantics.py); checks that
   ``max_bsz = 1025`` is refused with its status before any launch; checks stream ordering (the
   kernel waits for work queued before it on its stream);
3. timing, host side per decode step: kernel + async copy of the flag into pinned memory + event,
   against kernel + blocking D2H of the flag (what FD 2.4's op does), with the GPU idle and with
   ~2 ms of queued GPU work.

Exit status 1 on any mismatch. ``--output FILE`` also writes the report (with the command line).

    python3 benchmarks/gpu_kernel_check.py [--framework torch|cupy] [--output FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CUSTOM_OPS = REPO / "custom_ops"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _report  # noqa: E402 - benchmarks/_report.py, standard library only


def _load(name: str, relative: str):
    # By path: these modules need only numpy and the standard library (no Paddle on the GPU box).
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


library = _load("fdac_stop_flag_library", "fd_async_copy_plugin/ops/stop_flag_library.py")
states = _load("fdac_slot_states", "fd_async_copy_plugin/testing/slot_states.py")
semantics = _load("fdac_update_inputs_semantics", "fd_async_copy_plugin/testing/reference/update_inputs_semantics.py")


# --- frameworks: device arrays, pointers, streams, pinned buffers, events ---------------------


class TorchFramework:
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda")
        self.stream = torch.cuda.Stream()  # a non-default stream: the launcher must honour it

    def describe(self) -> str:
        t = self.torch
        props = t.cuda.get_device_properties(0)
        return f"PyTorch {t.__version__}, {props.name}, sm_{props.major}{props.minor}"

    def capability(self) -> str:
        major, minor = self.torch.cuda.get_device_capability(0)
        return f"{major}{minor}"

    def to_device(self, a: np.ndarray):
        with self.torch.cuda.stream(self.stream):
            return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=False)

    def to_host(self, d) -> np.ndarray:
        self.stream.synchronize()
        return d.cpu().numpy()

    def ptr(self, d) -> int | None:
        return None if d is None or d.numel() == 0 else d.data_ptr()

    def stream_handle(self) -> int:
        return self.stream.cuda_stream

    def synchronize(self) -> None:
        self.stream.synchronize()

    def device_synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def pinned_bool(self):
        return self.torch.zeros(1, dtype=self.torch.bool, pin_memory=True)

    def copy_async(self, dst, src) -> None:
        with self.torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)

    def blocking_read(self, d) -> bool:
        with self.torch.cuda.stream(self.stream):
            return bool(d.cpu()[0])  # pageable D2H: returns after the copy (and all before it)

    def new_event(self):
        return self.torch.cuda.Event()

    def record(self, event) -> None:
        event.record(self.stream)

    def event_done(self, event) -> bool:
        return event.query()

    def busy(self, cycles: int) -> None:
        with self.torch.cuda.stream(self.stream):
            self.torch.cuda._sleep(cycles)


class CupyFramework:
    name = "cupy"

    def __init__(self) -> None:
        import cupy
        import cupyx

        self.cupy = cupy
        self.cupyx = cupyx
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._spin = cupy.RawKernel(
            r"""extern "C" __global__ void spin(long long cycles) {
                  long long start = clock64();
                  while (clock64() - start < cycles) {}
                }""",
            "spin",
        )

    def describe(self) -> str:
        props = self.cupy.cuda.runtime.getDeviceProperties(0)
        return f"CuPy {self.cupy.__version__}, {props['name'].decode()}, sm_{props['major']}{props['minor']}"

    def capability(self) -> str:
        return self.cupy.cuda.Device(0).compute_capability

    def to_device(self, a: np.ndarray):
        with self.stream:
            d = self.cupy.asarray(np.ascontiguousarray(a))
        self.stream.synchronize()
        return d

    def to_host(self, d) -> np.ndarray:
        self.stream.synchronize()
        return self.cupy.asnumpy(d, stream=self.stream)

    def ptr(self, d) -> int | None:
        return None if d is None or d.size == 0 else d.data.ptr

    def stream_handle(self) -> int:
        return self.stream.ptr

    def synchronize(self) -> None:
        self.stream.synchronize()

    def device_synchronize(self) -> None:
        self.cupy.cuda.Device().synchronize()

    def pinned_bool(self):
        return self.cupyx.zeros_pinned(1, dtype=np.bool_)

    def copy_async(self, dst, src) -> None:
        src.get(stream=self.stream, out=dst, blocking=False)

    def blocking_read(self, d) -> bool:
        return bool(self.cupy.asnumpy(d, stream=self.stream, blocking=True)[0])

    def new_event(self):
        return self.cupy.cuda.Event(disable_timing=True)

    def record(self, event) -> None:
        event.record(self.stream)

    def event_done(self, event) -> bool:
        return event.done

    def busy(self, cycles: int) -> None:
        with self.stream:  # RawKernel launches on the current stream
            self._spin((1,), (1,), (np.int64(cycles),))


class DryRunFramework:
    """No GPU: numpy arrays stand in for device memory and the host library for the kernels.
    Only checks this script's plumbing on a machine without a GPU (``--framework dry-run``)."""

    name = "dry-run"

    class _Event:
        def synchronize(self) -> None:
            pass

    def describe(self) -> str:
        return "DRY RUN (no GPU): the host library stands in for the CUDA kernels"

    def capability(self) -> str:
        return "90"

    def to_device(self, a):
        return np.ascontiguousarray(a).copy()

    def to_host(self, d):
        return d.copy()

    def ptr(self, d):
        return None if d is None or d.size == 0 else d.ctypes.data

    def stream_handle(self):
        return None

    def synchronize(self) -> None:
        pass

    device_synchronize = synchronize

    def pinned_bool(self):
        return np.zeros(1, dtype=bool)

    def copy_async(self, dst, src) -> None:
        np.copyto(dst, src.reshape(dst.shape))

    def blocking_read(self, d) -> bool:
        return bool(d.reshape(-1)[0])

    def new_event(self):
        return self._Event()

    def record(self, event) -> None:
        pass

    def event_done(self, event) -> bool:
        return True

    def busy(self, cycles: int) -> None:
        pass


class HostAsCudaLibrary:
    """The host library behind the CUDA launchers' interface (dry run only)."""

    def __init__(self, host_lib) -> None:
        self.host_lib = host_lib

    def update_inputs_v1(self, *args, stream=None, **kwargs):
        return self.host_lib.update_inputs_v1(*args, **kwargs)

    def update_inputs(self, *args, stream=None, **kwargs):
        return self.host_lib.update_inputs(*args, **kwargs)

    def message(self, status):
        return self.host_lib.message(status)


def make_framework(name: str):
    if name == "dry-run":
        return DryRunFramework()
    if name in ("auto", "torch"):
        try:
            return TorchFramework()
        except ImportError:
            if name == "torch":
                raise
    return CupyFramework()


# --- building --------------------------------------------------------------------------------


def build_libraries(out_dir: Path, capability: str, report) -> tuple[Path, Path]:
    nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    cuda_lib, host_lib = out_dir / "libfd_async_copy_cuda.so", out_dir / "libfd_async_copy_host.so"
    commands = [
        [nvcc, "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", f"-I{CUSTOM_OPS}",
         "-gencode", f"arch=compute_{capability},code=sm_{capability}", "-Xptxas", "-v",
         "-o", str(cuda_lib), str(CUSTOM_OPS / "stop_flag_kernels.cu")],
        ["g++", "-O2", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
         f"-I{CUSTOM_OPS}", "-o", str(host_lib), str(CUSTOM_OPS / "stop_flag_host.cc")],
    ]
    for command in commands:
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        report(f"$ {' '.join(command)}  ({time.perf_counter() - started:.1f}s)")
        for line in (done.stdout + done.stderr).splitlines():
            if "registers" in line or "error" in line.lower() or "warning" in line.lower():
                report(f"    {line.strip()}")
        if done.returncode != 0:
            raise SystemExit(f"build failed:\n{done.stdout}{done.stderr}")
    return cuda_lib, host_lib


# --- correctness -----------------------------------------------------------------------------


def v1_shape_args(batch: dict) -> dict:
    return {
        "bsz": len(batch["seq_lens_this_time"]),
        "max_bsz": len(batch["stop_flags"]),
        "input_ids_stride": batch["input_ids"].shape[1],
        "block_tables_stride": batch["block_tables"].shape[1],
        "block_tables_numel": batch["block_tables"].size,
        "block_size": batch["block_size"],
        "prefill_one_step_stop": batch["prefill_one_step_stop"],
    }


def v0_shape_args(batch: dict) -> dict:
    return {
        "bsz": len(batch["seq_lens_this_time"]),
        "max_bsz": len(batch["stop_flags"]),
        "input_ids_stride": batch["input_ids"].shape[1],
    }


def host_address(a):
    return None if a is None or a.size == 0 else a.ctypes.data


def run_variant(fw, cuda_lib, host_lib, batch: dict, variant: str) -> list[str]:
    """One batch through GPU, host C++ and numpy; returns the names of arrays that differ."""
    names = states.V1_ARRAYS if variant == "v1" else states.V0_ARRAYS
    shape = v1_shape_args(batch) if variant == "v1" else v0_shape_args(batch)
    device = {n: (None if batch[n] is None else fw.to_device(batch[n])) for n in names}
    launch = cuda_lib.update_inputs_v1 if variant == "v1" else cuda_lib.update_inputs
    status = launch(*(fw.ptr(device[n]) for n in names), **shape, stream=fw.stream_handle())
    if status != 0:
        return [f"cuda status {status}: {cuda_lib.message(status)}"]

    host = states.copy_batch(batch)
    run_host = host_lib.update_inputs_v1 if variant == "v1" else host_lib.update_inputs
    status = run_host(*(host_address(host[n]) for n in names), **shape)
    if status != 0:
        return [f"host status {status}: {host_lib.message(status)}"]

    reference = states.copy_batch(batch)
    if variant == "v1":
        semantics.update_inputs_v1_np(
            *(reference[n] for n in names), reference["block_size"],
            prefill_one_step_stop=reference["prefill_one_step_stop"],
        )
    else:
        semantics.update_inputs_np(*(reference[n] for n in names))

    differs = []
    for n in names:
        if batch[n] is None:
            continue
        gpu = fw.to_host(device[n]).reshape(batch[n].shape)
        if not np.array_equal(gpu, host[n]):
            differs.append(f"{n}: gpu != host")
        if not np.array_equal(host[n], reference[n]):
            differs.append(f"{n}: host != numpy reference")
    return differs


def check_correctness(fw, cuda_lib, host_lib, report, min_slots: int) -> int:
    failures = 0
    for variant, generate in (("v1", states.random_v1_batch), ("v0", states.random_v0_batch)):
        rng = np.random.default_rng(6176 if variant == "v1" else 6362)
        slots = batches = partial = full = 0
        branches = dict.fromkeys(states.V1_BRANCHES, 0)
        # Edge batches first: empty, one slot, exactly 1024.
        fixed = [(1, 0), (1, 1), (1024, 1024), (1024, 0), (1024, 513)]
        while slots < min_slots or fixed:
            batch = generate(rng, *fixed.pop(0)) if fixed else generate(rng)
            bsz, max_bsz = len(batch["seq_lens_this_time"]), len(batch["stop_flags"])
            if variant == "v1":
                for i in range(bsz):
                    branches[states.v1_branch(batch, i)] += 1
            differs = run_variant(fw, cuda_lib, host_lib, batch, variant)
            if differs:
                failures += 1
                if failures <= 10:
                    report(f"  MISMATCH {variant} batch {batches} (bsz={bsz}, max_bsz={max_bsz}): {differs}")
            slots += bsz
            batches += 1
            partial += bsz < max_bsz
            full += max_bsz == 1024
        coverage = f"; branches {branches}" if variant == "v1" else ""
        # Every branch must really be exercised (a random generator can drift away from one).
        thin = [b for b, n in branches.items() if n < min(100, min_slots // 100)] if variant == "v1" else []
        if thin:
            failures += 1
            report(f"  COVERAGE {variant}: branches {thin} were exercised fewer than 100 times")
        report(f"  {variant}: {slots} slot states in {batches} batches ({partial} with bsz < max_bsz, "
               f"{full} with max_bsz = 1024){coverage}: {'OK' if not failures else 'FAILED'}")

    # max_bsz above one block: refused with a status, nothing launched or written.
    batch = states.random_v1_batch(np.random.default_rng(1), max_bsz=1024, bsz=1024)
    batch["stop_flags"] = np.zeros((1025, 1), dtype=bool)
    device = {n: (None if batch[n] is None else fw.to_device(batch[n])) for n in states.V1_ARRAYS}
    status = cuda_lib.update_inputs_v1(*(fw.ptr(device[n]) for n in states.V1_ARRAYS),
                                       **v1_shape_args(batch), stream=fw.stream_handle())
    untouched = np.array_equal(fw.to_host(device["seq_lens_decoder"]), batch["seq_lens_decoder"])
    ok = status == 1 and "1024" in cuda_lib.message(status) and untouched
    report(f"  max_bsz=1025: status {status} ({cuda_lib.message(status)!r}), inputs untouched: {untouched}: "
           f"{'OK' if ok else 'FAILED'}")
    failures += not ok

    # The legacy default stream (NULL) works too.
    batch = states.random_v0_batch(np.random.default_rng(2), max_bsz=64, bsz=64)
    device = {n: (None if batch[n] is None else fw.to_device(batch[n])) for n in states.V0_ARRAYS}
    status = cuda_lib.update_inputs(*(fw.ptr(device[n]) for n in states.V0_ARRAYS), **v0_shape_args(batch), stream=None)
    fw.device_synchronize()
    reference = states.copy_batch(batch)
    want = semantics.update_inputs_np(*(reference[n] for n in states.V0_ARRAYS))
    got = bool(fw.to_host(device["not_need_stop"])[0])
    ok = status == 0 and got == want
    report(f"  NULL (legacy default) stream launch: {'OK' if ok else 'FAILED'}")
    failures += not ok
    return failures


def check_stream_order(fw, cuda_lib, report, cycles: int) -> int:
    """The kernel runs after work queued before it on the same stream (it got the right stream)."""
    batch = states.random_v1_batch(np.random.default_rng(3), max_bsz=256, bsz=256)
    batch["stop_flags"][:] = False
    batch["seq_lens_decoder"][:] = batch["prompt_lens"].astype(np.int32)
    batch["block_tables"][:] = 1
    batch["prefill_one_step_stop"] = False
    batch["not_need_stop"][:] = False
    device = {n: (None if batch[n] is None else fw.to_device(batch[n])) for n in states.V1_ARRAYS}
    pinned = fw.pinned_bool()
    event = fw.new_event()
    fw.busy(cycles)
    status = cuda_lib.update_inputs_v1(*(fw.ptr(device[n]) for n in states.V1_ARRAYS),
                                       **v1_shape_args(batch), stream=fw.stream_handle())
    fw.copy_async(pinned, device["not_need_stop"])
    fw.record(event)
    pending_right_after = not fw.event_done(event)
    event.synchronize()
    ok = status == 0 and pending_right_after and bool(pinned[0])
    report(f"  stream order: event pending while queued work runs: {pending_right_after}; "
           f"flag after event wait: {bool(pinned[0])} (expected True): {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


# --- timing ----------------------------------------------------------------------------------


def time_steps(fw, cuda_lib, report, busy_cycles: int, steps: int) -> None:
    batch = states.random_v1_batch(np.random.default_rng(4), max_bsz=128, bsz=128)
    batch["prefill_one_step_stop"] = False
    device = {n: (None if batch[n] is None else fw.to_device(batch[n])) for n in states.V1_ARRAYS}
    args = [fw.ptr(device[n]) for n in states.V1_ARRAYS]
    shape = v1_shape_args(batch)
    handle = fw.stream_handle()
    pinned = fw.pinned_bool()
    event = fw.new_event()
    flag = device["not_need_stop"]

    def launch() -> None:
        cuda_lib.update_inputs_v1(*args, **shape, stream=handle)

    def async_step() -> None:  # issue only; the wait happens later, after the host's own work
        launch()
        fw.copy_async(pinned, flag)
        fw.record(event)

    def async_step_and_wait() -> None:
        async_step()
        event.synchronize()

    def blocking_step() -> None:
        launch()
        fw.blocking_read(flag)

    variants = [
        ("kernel launch only (ctypes)", launch),
        ("kernel + async D2H into pinned + event record (no wait)", async_step),
        ("kernel + async D2H + event record + event wait", async_step_and_wait),
        ("kernel + blocking D2H of the flag (FD 2.4 style)", blocking_step),
    ]
    for label, busy in (("GPU idle", 0), (f"GPU busy (~{busy_cycles / 1.98e6:.1f} ms queued per step)", busy_cycles)):
        report(f"  {label}: host time per step, median of {steps} (p90)")
        for name, step in variants:
            if busy and name.startswith("kernel launch only"):
                continue
            samples = []
            for i in range(steps + 20):
                if busy:
                    fw.busy(busy)
                started = time.perf_counter()
                step()
                elapsed = time.perf_counter() - started
                if busy:
                    fw.synchronize()  # drain so the next step starts from the same queue depth
                if i >= 20:
                    samples.append(elapsed * 1e6)
            fw.synchronize()
            report(f"    {name:58s} {np.median(samples):9.1f} us  ({np.percentile(samples, 90):.1f})")


# --- main ------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _report.add_common_arguments(parser)
    parser.add_argument("--steps", type=int, default=500, help="timed steps per variant")
    parser.add_argument("--busy-cycles", type=int, default=4_000_000, help="GPU cycles queued per busy step")
    args = parser.parse_args(argv)

    report = _report.Report("gpu_kernel_check.py", argv)
    fw = make_framework(args.framework)
    report(f"framework: {fw.describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        if bool(args.cuda_lib) != bool(args.host_lib):
            parser_error = "--cuda-lib and --host-lib go together (both prebuilt libraries, or neither)"
            report(f"error: {parser_error}")
            return 2
        if args.cuda_lib and args.host_lib:
            cuda_path, host_path = Path(args.cuda_lib), Path(args.host_lib)
        else:
            cuda_path, host_path = build_libraries(Path(tmp), fw.capability(), report)
        host_lib = library.StopFlagLibrary(host_path, "host")
        cuda_lib = library.StopFlagLibrary(cuda_path, "cuda")
        if fw.name == "dry-run":
            cuda_lib = HostAsCudaLibrary(host_lib)

        report("correctness (GPU kernel vs host C++ vs numpy reference, every array and the device flag):")
        failures = check_correctness(fw, cuda_lib, host_lib, report, args.slots)
        if fw.name == "dry-run":
            report("  stream order: skipped (dry-run: no GPU stream to queue work on)")
        else:
            failures += check_stream_order(fw, cuda_lib, report, args.busy_cycles)
        report("timing (host side, per decode step; max_bsz = 128):")
        time_steps(fw, cuda_lib, report, args.busy_cycles, args.steps)

    return report.finish(failures, args.output)


if __name__ == "__main__":
    sys.exit(main())
