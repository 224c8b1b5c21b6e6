#!/usr/bin/env python3
"""The selftest's stop-flag kernel comparison, Paddle-free, on a GPU machine.

``fd-async-copy selftest`` compares FastDeploy's compiled ``update_inputs_v1`` / ``update_inputs``
with the plugin's kernels through Paddle tensors, using the framework-neutral core in
``fd_async_copy_plugin/testing/selftest_fd/kernel_compare.py`` (numpy arrays in, mismatches out). This
script runs the same core, with the same random slot states (>= 10,000 per op, batch sizes up to
``--max-num-seqs``), on a machine without Paddle or FastDeploy: the plugin's CUDA kernels
(``libfd_async_copy_cuda.so``, launched through CuPy or PyTorch pointers and streams) against the
independent numpy statement of FastDeploy's semantics (``reference/update_inputs_semantics.py``).
A planted bug (a kernel result with one flag flipped) must be reported as a mismatch.

    python3 benchmarks/selftest_kernel_compare.py --cuda-lib libfd_async_copy_cuda.so \
        [--framework torch|cupy|dry-run] [--slots 12000] [--output FILE]

Exit status 1 on any mismatch (or if the planted bug goes unnoticed).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _report  # noqa: E402 - benchmarks/_report.py, standard library only

from fd_async_copy_plugin.testing import slot_states as states  # noqa: E402 - numpy only
from fd_async_copy_plugin.testing.selftest_fd import kernel_compare  # noqa: E402 - numpy only


def _load_gpu_kernel_check():
    spec = importlib.util.spec_from_file_location("fdac_gpu_kernel_check", REPO / "benchmarks" / "gpu_kernel_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _build_host(out_dir: Path, report) -> Path:
    import subprocess

    path = out_dir / "libfd_async_copy_host.so"
    command = ["g++", "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{REPO / 'custom_ops'}", "-o", str(path),
               str(REPO / "custom_ops" / "stop_flag_host.cc")]
    report("$ " + " ".join(command))
    subprocess.run(command, check=True)
    return path


def cuda_runner(gkc, fw, cuda_lib, variant: str):
    """A ``kernel_compare`` runner: the batch to device arrays of ``fw``, the plugin's CUDA kernel on
    ``fw``'s stream, every array and the DEVICE flag back into the batch."""
    names = kernel_compare.arrays(variant)
    launch = cuda_lib.update_inputs_v1 if variant == "v1" else cuda_lib.update_inputs
    shape_args = gkc.v1_shape_args if variant == "v1" else gkc.v0_shape_args

    def run(batch: dict) -> bool:
        device = {n: (None if batch[n] is None else fw.to_device(batch[n])) for n in names}
        status = launch(*(fw.ptr(device[n]) for n in names), **shape_args(batch), stream=fw.stream_handle())
        if status != 0:
            raise RuntimeError(f"cuda status {status}: {cuda_lib.message(status)}")
        for n in names:
            if batch[n] is not None and n != "not_need_stop":
                np.copyto(batch[n], fw.to_host(device[n]).reshape(batch[n].shape))
        return bool(fw.to_host(device["not_need_stop"]).reshape(-1)[0])

    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _report.add_common_arguments(parser)  # here --host-lib serves --framework dry-run only
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    args = parser.parse_args(argv)

    report = _report.Report("selftest_kernel_compare.py", argv)
    gkc = _load_gpu_kernel_check()
    fw = gkc.make_framework(args.framework)
    report(f"framework: {fw.describe()}")
    import tempfile

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        if fw.name == "dry-run":  # no GPU: the host library (g++) stands in for the CUDA one
            cuda_path, host_path = None, Path(args.host_lib).resolve() if args.host_lib else _build_host(Path(tmp), report)
        elif args.cuda_lib:
            cuda_path = Path(args.cuda_lib).resolve()  # dlopen of a bare name searches the library path
        else:
            cuda_path, host_path = gkc.build_libraries(Path(tmp), fw.capability(), report)
        if fw.name == "dry-run":
            cuda_lib = gkc.HostAsCudaLibrary(gkc.library.StopFlagLibrary(host_path, "host"))
        else:
            cuda_lib = gkc.library.StopFlagLibrary(cuda_path, "cuda")
        report(f"the plugin's kernels ({'host library standing in' if cuda_path is None else cuda_path.name}) "
               "vs the numpy statement of FastDeploy's semantics, through selftest_fd.kernel_compare:")
        for variant, seed in (("v1", 6176), ("v0", 6362)):
            result = kernel_compare.compare(
                variant, kernel_compare.reference_runner(variant), cuda_runner(gkc, fw, cuda_lib, variant),
                min_slots=args.slots, seed=seed, max_num_seqs=args.max_num_seqs)
            coverage = f"; branches {result['branches']}" if variant == "v1" else ""
            report(f"  {kernel_compare.summary(result)} in {result['seconds']} s{coverage}")
            for line in result["mismatches"]:
                report(f"    MISMATCH {line}")
            failures += result["mismatching_batches"] > 0 or result["slots"] < args.slots
            if variant == "v1" and min(result["branches"].values()) < 100:
                report(f"  COVERAGE: some branch ran fewer than 100 times: {result['branches']}")
                failures += 1

        # Control: the comparison must see a wrong kernel result (one not_need_stop flipped).
        real = cuda_runner(gkc, fw, cuda_lib, "v1")
        calls = [0]

        def planted(batch: dict) -> bool:
            calls[0] += 1
            flag = real(batch)
            return (not flag) if calls[0] == 3 else flag

        started = time.perf_counter()
        control = kernel_compare.compare("v1", kernel_compare.reference_runner("v1"), planted, min_slots=200,
                                         seed=1, max_num_seqs=64)
        caught = control["mismatching_batches"] == 1 and "not_need_stop" in control["mismatches"][0]
        report(f"  planted bug (flag flipped in batch 2): {'caught' if caught else 'NOT CAUGHT'} "
               f"({control['mismatches'][:1]}, {time.perf_counter() - started:.1f} s)")
        failures += not caught

    return report.finish(failures, args.output)


if __name__ == "__main__":
    sys.exit(main())
