#!/usr/bin/env python3
"""H200 check of the plugin's asynchronous H2D path (``step_syncs``' block-table rows), without Paddle.

PyTorch provides the device tensor, the queued GPU work and the stream; the copies go through the
plugin's own ``runtime.cuda.CudaBackend.copy_h2d`` / ``before_host_write`` (``cudaMemcpyAsync`` H2D
from ``cudaHostAlloc`` memory on the current stream). Per step, with ~2 ms of GPU work queued ahead:

1. rows of a pinned mirror of ``block_tables`` [M, cols] int32 are rewritten on the host (after
   ``before_host_write``), copied to the device rows asynchronously, and a GPU reduction reads the
   table behind them in stream order: every step's device table equals the host's, byte for byte;
2. a planted bug - rewriting a row of the mirror right after its copy was issued, without
   ``before_host_write`` - is caught (the device sees the later value);
3. host time per step of the writes: the plugin's path vs FastDeploy 2.4's synchronous pageable
   ``tensor[idx, :n] = numpy`` (which waits for the queued work), side by side.

    python3 benchmarks/h2d_staging_check.py [--steps N] [--output FILE]

RESULT: PASS when 1 holds on every step, 2 is caught, and 3's plugin path does not wait for the
queued GPU work (its host time per step below a quarter of the 2 ms queued; the synchronous
setitem's is printed beside it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fd_async_copy_plugin.runtime.backend import host_view  # noqa: E402
from fd_async_copy_plugin.runtime.cuda import CudaBackend  # noqa: E402
from fd_async_copy_plugin.runtime.cudart import runtime as cuda_runtime  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    assert "paddle" not in sys.modules
    import torch
    from _torch_glue import TorchGlue, TorchProbeOps

    lines: list[str] = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    torch.cuda.init()
    rt = cuda_runtime()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(), torch.cuda._sleep(20_000_000), end.record(), end.synchronize()
    per_ms = int(20_000_000 / start.elapsed_time(end))
    backend = CudaBackend(glue=TorchGlue(), rt=rt, probe_ops=TorchProbeOps(per_ms))
    probe = backend.ensure_probed(0)
    say(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}; accessor probe: {'ok' if probe['ok'] else probe}")
    M, cols = 1024, 2048
    table = torch.full((M, cols), -1, dtype=torch.int32, device="cuda")
    mirror = backend.new_pinned([M, cols], "int32", "block_tables mirror")
    view = host_view(mirror, backend.glue)
    view[...] = -1
    reference = np.full((M, cols), -1, dtype=np.int32)
    row_bytes = cols * 4
    base = int(table.data_ptr())
    rng = np.random.default_rng(0)

    def write_rows(rows, values, check_first=True):
        if check_first:
            backend.before_host_write(mirror, "insert.block_tables")
        for r, v in zip(rows, values):
            view[r, :] = -1
            view[r, : len(v)] = v
        for r in rows:  # one copy per row, as StepShadow.flush for scattered rows
            backend.copy_h2d(base + r * row_bytes, 0, mirror, r * row_bytes, row_bytes, "block_tables")

    mismatches = 0
    plugin_us, sync_us = [], []
    for step in range(args.steps):
        torch.cuda._sleep(2 * per_ms)  # the step's forward, queued ahead of the copies
        rows = sorted(set(rng.integers(0, M, size=int(rng.integers(1, 9))).tolist()))
        values = [rng.integers(0, 1 << 20, size=int(rng.integers(1, cols)), dtype=np.int32) for _ in rows]
        for r, v in zip(rows, values):
            reference[r, :] = -1
            reference[r, : len(v)] = v
        t0 = time.perf_counter()
        write_rows(rows, values)
        plugin_us.append((time.perf_counter() - t0) * 1e6)
        checksum = table.to(torch.int64).sum(dim=1)  # reads the table in stream order
        event = backend.record("step")
        backend.wait(event, "save")
        got = checksum.cpu().numpy()
        mismatches += int((got != reference.astype(np.int64).sum(axis=1)).sum())
        if step % 50 == 0:
            mismatches += int(not np.array_equal(table.cpu().numpy(), reference))

    # the same writes FastDeploy 2.4's way: pageable numpy into the device tensor (synchronous)
    for step in range(min(args.steps, 100)):
        torch.cuda._sleep(2 * per_ms)
        rows = sorted(set(rng.integers(0, M, size=int(rng.integers(1, 9))).tolist()))
        t0 = time.perf_counter()
        for r in rows:
            v = rng.integers(0, 1 << 20, size=int(rng.integers(1, cols)), dtype=np.int32)
            table[r, :] = -1
            table[r, : len(v)] = torch.from_numpy(v).to("cuda", non_blocking=False)
        sync_us.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()

    # planted bug: the mirror row is rewritten right after its copy was issued (no before_host_write)
    torch.cuda.synchronize()
    table.fill_(-1), view.fill(-1)
    torch.cuda._sleep(20 * per_ms)  # the copy will run ~10 ms from now
    view[7, :4] = [1, 2, 3, 4]
    backend.copy_h2d(base + 7 * row_bytes, 0, mirror, 7 * row_bytes, row_bytes, "planted")
    view[7, :4] = [9, 9, 9, 9]  # the bug: the DMA has not read the row yet
    torch.cuda.synchronize()
    caught = table[7, :4].cpu().tolist() == [9, 9, 9, 9]
    backend.wait(backend.record("end"), "end")

    p, s = statistics.median(plugin_us), statistics.median(sync_us)
    say(f"steps {args.steps}: device table == host reference on every step: {mismatches == 0} ({mismatches} mismatches)")
    say(f"planted rewrite before the copy ran is visible on the device (caught): {caught}")
    say(f"host time per step of the row writes, GPU busy (2 ms queued): plugin {p:.1f} us (copy_h2d), "
        f"FastDeploy 2.4 synchronous setitem {s:.1f} us; ratio {p / s:.3f}")
    ok = mismatches == 0 and caught and p < 0.25 * 2000
    say(f"RESULT: {'PASS' if ok else 'FAIL'}")
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
