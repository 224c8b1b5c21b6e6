"""``fd-async-copy bench``: host time per decode step and the sync census, plugin off vs on.

Both variants run in the same process, alternating rounds (off, on, off, on, ...) so that machine
noise hits both alike; the ratio is plugin / unpatched of the median per-step host time over the
steady-state decode steps. On the CPU build of Paddle every copy is synchronous, so this measures
the plugin's host overhead (target: ratio <= 1.05), not the GPU overlap it buys; the census shows
what a GPU host would stop waiting for. On a Paddle GPU build it also compares copy strategies
(``fd_async_copy_plugin/gpu_copy_strategies.py``).
"""

from __future__ import annotations

import json
import sys


def run(args) -> int:
    from ..harness import VARIANTS, census_row, format_census, logprob_workload, run_variant, summarize_times
    from ..runtime.cuda import cuda_available

    batch, top_k, vocab, steps, repeats = args.batch, args.top_k, args.vocab, args.steps, args.repeats
    if args.smoke:
        batch, vocab, steps, repeats = 16, 512, 12, 2
    config, requests = logprob_workload(batch, top_k, vocab, steps)
    backend = "host"
    warmup = 3  # prefill and first decode steps are excluded from the timing
    times = {"fd24-unpatched": [], "fd24-plugin": []}
    runs = {}
    for _ in range(repeats):
        for name in times:
            run = run_variant(VARIANTS[name], config, requests, backend=backend, max_steps=steps + 8)
            times[name].extend(run.step_seconds[warmup:])
            runs[name] = run
    # The census needs one run each: FastDeploy 2.5 native (PR #6176/#6362) and with the plugin.
    for name in ("fd25-native", "fd25-plugin"):
        runs[name] = run_variant(VARIANTS[name], config, requests, backend=backend, max_steps=steps + 8)
    summary = {name: summarize_times(values) for name, values in times.items()}
    ratio = summary["fd24-plugin"]["median_ms"] / summary["fd24-unpatched"]["median_ms"]
    census = {name: census_row(run) for name, run in runs.items()}
    report = {
        "workload": {"batch": batch, "top_k": top_k, "vocab": vocab, "steps": steps, "repeats": repeats},
        "backend": backend,
        "host_time_per_step": summary,
        "ratio_plugin_over_unpatched": ratio,
        "target_ratio": 1.05,
        "census_per_step": census,
        "paddle_gpu": cuda_available()[1],
    }
    gpu_ok, _ = cuda_available()
    if gpu_ok:  # pragma: no cover - needs a Paddle GPU build
        from ..gpu_copy_strategies import compare_copy_strategies

        report["copy_strategies"] = compare_copy_strategies(batch, top_k, vocab)
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(format_report(report, format_census))
    return 0


def format_report(report: dict, format_census) -> str:
    w = report["workload"]
    lines = [
        f"fd-async-copy bench: reference FastDeploy 2.4, B={w['batch']}, K={w['top_k']}, vocab={w['vocab']},",
        f"{w['steps']} steps x {w['repeats']} alternating rounds, backend {report['backend']}",
        f"{'host time per decode step':34s}{'median ms':>12s}{'p90 ms':>12s}{'steps':>8s}",
    ]
    for name, s in report["host_time_per_step"].items():
        lines.append(f"{name:34s}{s['median_ms']:12.3f}{s['p90_ms']:12.3f}{s['n']:8d}")
    lines.append(
        f"ratio plugin/unpatched (median): {report['ratio_plugin_over_unpatched']:.3f} "
        f"(target <= {report['target_ratio']})"
    )
    lines.append("")
    lines.append(format_census(report["census_per_step"]))
    if "copy_strategies" in report:  # pragma: no cover - GPU only
        lines.append("")
        lines.append("copy strategies on this GPU (per step, host us):")
        for name, value in report["copy_strategies"].items():
            lines.append(f"  {name:40s}{value:10.1f}")
    else:
        lines.append(f"copy-strategy comparison skipped: {report['paddle_gpu']}")
    return "\n".join(lines)
