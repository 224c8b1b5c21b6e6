"""Host time per decode step on the replica: sync check off (not imported) vs armed (count).

    python benchmarks/sync_check_overhead.py [--steps 40] [--rounds 5] [--batch 16]

Off is what every FD worker gets by default: ``register()`` does not import the module, no Paddle
method is wrapped (``tests/measure/test_sync_check.py`` checks both). Armed (``count``), the GPU
source wraps Paddle's host reads, ``synchronize``, the copy backend's waits and FD 2.4's compiled
ops, and the step hook wraps ``execute_model``: this measures what that costs the host per step, on
CPU Paddle (the replica: every tensor on the host, so each wrapper runs its test and passes
through). Rounds alternate off/on in one process; the figure is the median over steady steps.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--variant", default="fd24-plugin")
    args = parser.parse_args(argv)

    from fd_async_copy_plugin import sync_check
    from fd_async_copy_plugin.cli.bench import plain_workload
    from fd_async_copy_plugin.testing.harness import CENSUS_VARIANTS, run_variant, summarize_times

    variant = CENSUS_VARIANTS[args.variant]
    config, requests = plain_workload(args.batch, 512, args.steps)
    times = {"off": [], "count": []}
    counted = None
    for _ in range(args.rounds):
        for mode in times:
            if mode == "count":
                sync_check.start(sync_check.Settings("count", 3))
                sync_check.install_gpu_source()
                sync_check.install_step_hook(variant.root)
            try:
                run = run_variant(variant, config, requests, backend="host", max_steps=args.steps + 4)
            finally:
                if mode == "count":
                    counted = sync_check.status()
                    sync_check.uninstall_step_hooks()
                    sync_check.stop()
            times[mode].extend(run.step_seconds[3:])
    summary = {mode: summarize_times(values) for mode, values in times.items()}
    ratio = summary["count"]["median_ms"] / summary["off"]["median_ms"]
    print(f"sync check overhead, replica {args.variant}, batch {args.batch}, {args.steps} steps x {args.rounds} rounds (CPU Paddle)")
    for mode, s in summary.items():
        print(f"  {mode:6s} median {s['median_ms']:.3f} ms/step  p90 {s['p90_ms']:.3f}  n={s['n']}")
    print(f"  count/off: {ratio:.3f}; steps counted in the last armed round: {counted['steps_counted']} "
          f"(waits/step seen on CPU: {counted['waits_per_step']} - on CPU no tensor is on a GPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
