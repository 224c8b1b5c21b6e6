"""``fd-async-copy bench``: host time per decode step and the sync census, plugin off vs on.

Both variants run in the same process, alternating rounds (off, on, off, on, ...) so that machine
noise hits both alike; the ratio is plugin / unpatched of the median per-step host time over the
steady-state decode steps. On the CPU build of Paddle every copy is synchronous, so this measures
the plugin's host overhead (target: ratio <= 1.05), not the GPU overlap it buys; the census shows
what a GPU host would stop waiting for. On a Paddle GPU build it also compares copy strategies
(``fd_async_copy_plugin/testing/gpu_copy_strategies.py``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace

TARGET_RATIO = 1.05
WARMUP_STEPS = 3  # prefill and first decode steps of each run are excluded from the timing

#: what the census columns and the wait labels mean (printed under the tables)
CENSUS_LEGEND = """\
columns (per decode step, on the paths the plugin patches): blk D2H blocking device->host copies;
dev syn / str syn device / stream synchronizations; ev wait event waits; pin alc / pin fre pinned
allocations / frees; op pin Paddle ops on pinned tensors; async non-blocking copies; rd>wait yes
when the first host read of copied data comes after its wait; other FD's own blocking-read sites
outside the patched paths (the whole-step census below counts every host wait)."""
WAITS_LEGEND = """\
wait labels (FD 2.4's host syncs, docs/fd24-step-syncs.md): S1 token count of get_padding_offset;
S2 bad_tokens_len.numpy(); S3/S7 exist_prefill(); T the CPU infer_seed passed to top_p_sampling
(waits for the forward); S5 update_inputs' stop-flag copies; S6 save_output's copy of the token
ids; L1-3 gather_logprobs' three .cpu(); I1 the block-step read of an insert; token_num FD 2.5's
and develop's token-count event; save event the one event the save waits on. long: waits for the
forward or sampler launched since the previous wait; short: finds the GPU idle."""


#: the sizes of a run: by default, and with ``--smoke`` (a size given explicitly wins over both)
DEFAULT_SIZES = {"batch": 128, "top_k": 20, "vocab": 1024, "steps": 60, "repeats": 5}
SMOKE_SIZES = {"batch": 16, "top_k": 20, "vocab": 512, "steps": 12, "repeats": 2}
#: the replica's prompts use token ids 3..vocab-1
MIN_VOCAB = 4


def resolve_sizes(args) -> str:
    """Fill ``args``' sizes left unset from the mode's defaults and check them together; return
    the problem as one actionable line, or "" when the run can time something."""
    defaults = SMOKE_SIZES if args.smoke else DEFAULT_SIZES
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.steps <= WARMUP_STEPS:
        return (f"--steps {args.steps} times nothing: the first {WARMUP_STEPS} decode steps of each run are "
                f"warm-up, not timed; use --steps {WARMUP_STEPS + 1} or more")
    if args.vocab < MIN_VOCAB:
        return f"--vocab {args.vocab} is too small for the replica's prompts; use --vocab {MIN_VOCAB} or more"
    if args.top_k > args.vocab:
        return (f"--top-k {args.top_k} is larger than the vocabulary ({args.vocab}): a token has at most "
                f"vocab logprobs; use --top-k {args.vocab} or less, or a larger --vocab")
    return ""


def overhead_per_round(rounds: dict) -> dict:
    """The plugin's host overhead per decode step from rounds run side by side: per round, its
    median minus unpatched FD's median (us), then the median and range of those. Pairing within a
    round keeps a machine that slows down between rounds out of the figure."""
    diffs = [1e3 * (plugin - base) for plugin, base in zip(rounds["fd24-plugin"], rounds["fd24-unpatched"])]
    if not diffs:
        return {"median_us": float("nan"), "min_us": float("nan"), "max_us": float("nan"), "rounds": 0}
    return {"median_us": statistics.median(diffs), "min_us": min(diffs), "max_us": max(diffs), "rounds": len(diffs)}


def _progress(started: float, text: str) -> None:
    print(f"bench {time.perf_counter() - started:5.1f} s  {text}", file=sys.stderr, flush=True)


def verdict(ratio: float, smoke: bool) -> tuple[str, bool]:
    """(the verdict line, whether the target was met); ``--smoke`` sizes are too small to judge."""
    if smoke:
        return f"verdict: not judged (--smoke: sizes too small; target <= {TARGET_RATIO})", True
    if ratio <= TARGET_RATIO:
        return f"verdict: target met ({ratio:.3f} <= {TARGET_RATIO})", True
    return (f"verdict: target NOT met ({ratio:.3f} > {TARGET_RATIO}; on a shared or busy machine rerun "
            "with more --repeats before reading it as overhead)"), False


def run(args) -> int:
    from ..testing.harness import (
        CENSUS_ORDER,
        CENSUS_VARIANTS,
        VARIANTS,
        census_row,
        format_census,
        host_waits,
        logprob_workload,
        run_variant,
        summarize_times,
    )
    from ..runtime.cuda import cuda_available

    if getattr(args, "trace", None) is not None:  # before any work: not a traceback after the benchmark
        from ..trace import path_problem

        problem = path_problem(args.trace)
        if problem:
            error = f"--trace {args.trace!r}: {problem}"
            if args.json:
                json.dump({"ok": False, "command": "bench", "error": error}, sys.stdout, indent=2)
                sys.stdout.write("\n")
            print(f"fd-async-copy bench FAILED: {error}", file=sys.stderr)
            return 2
    if getattr(args, "steps", None) is None or getattr(args, "batch", None) is None:  # called without main()
        problem = resolve_sizes(args)
        if problem:
            raise ValueError(problem)
    batch, top_k, vocab, steps, repeats = args.batch, args.top_k, args.vocab, args.steps, args.repeats
    config, requests = logprob_workload(batch, top_k, vocab, steps)
    from .version import versions

    backend = "host"
    warmup = WARMUP_STEPS
    times = {"fd24-unpatched": [], "fd24-backport": [], "fd24-plugin": []}
    round_medians = {name: [] for name in times}  # ms, one per round
    runs = {}
    started = time.perf_counter()
    for round_index in range(repeats):
        for name in times:
            run = run_variant(VARIANTS[name], config, requests, backend=backend, max_steps=steps + 8)
            timed = run.step_seconds[warmup:]
            times[name].extend(timed)
            if timed:
                round_medians[name].append(statistics.median(timed) * 1e3)
            runs[name] = run
        _progress(started, f"timing: round {round_index + 1}/{repeats} done")
    # The census needs one run of every other variant (overlap, FastDeploy 2.5 and develop, native and
    # with the plugin).
    others = [n for n in CENSUS_ORDER if n not in times]
    for index, name in enumerate(others, 1):
        runs[name] = run_variant(CENSUS_VARIANTS[name], config, requests, backend=backend, max_steps=steps + 8)
        _progress(started, f"census runs: {name} done ({index}/{len(others)})")
    _progress(started, "whole-step census (device tracking), one variant at a time ...")
    summary = {name: summarize_times(values) for name, values in times.items()}
    ratio = summary["fd24-plugin"]["median_ms"] / summary["fd24-unpatched"]["median_ms"]
    ratio_backport = summary["fd24-backport"]["median_ms"] / summary["fd24-unpatched"]["median_ms"]
    census = {name: census_row(run) for name, run in runs.items()}
    # The whole-step census: device-value tracking on a plain decode workload (no logprobs) and on
    # the logprob workload above, one tracked run per variant (tracking is slow: never timed).
    # KV blocks of 64 tokens: no request needs a new block (a DECODE task, I1) during the run.
    plain_config, plain_requests = plain_workload(min(batch, 32), vocab, min(steps, 16))
    lp_config, lp_requests = logprob_workload(min(batch, 32), top_k, vocab, min(steps, 16))
    plain_config, lp_config = replace(plain_config, block_size=64), replace(lp_config, block_size=64)
    for name in CENSUS_ORDER:
        variant = CENSUS_VARIANTS[name]
        plain = run_variant(variant, plain_config, plain_requests, backend=backend, max_steps=40, track=True)
        with_lp = run_variant(variant, lp_config, lp_requests, backend=backend, max_steps=40, track=True)
        row = census[name]
        row["host_waits"] = host_waits(plain.census.steps)
        row["host_waits_with_logprobs"] = host_waits(with_lp.census.steps)
        _progress(started, f"whole-step census: {name} done")
    census = {name: census[name] for name in (*CENSUS_ORDER, *[n for n in census if n not in CENSUS_ORDER])}
    # Tensor parallel (issue 39): the census of each rank of a TP=2 run (the sim backend per rank)
    from ..testing.reference.tp import census_per_rank

    census_tp = census_per_rank(config, requests, tp=2, max_steps=steps + 8)
    _progress(started, "TP=2 census per rank done")
    verdict_line, met = verdict(ratio, args.smoke)
    report = {
        "versions": versions(),
        "workload": {"batch": batch, "top_k": top_k, "vocab": vocab, "steps": steps, "repeats": repeats,
                     "warmup_steps_excluded": warmup},
        "backend": backend,
        "host_time_per_step": summary,
        "ratio_plugin_over_unpatched": ratio,
        "ratio_backport_over_unpatched": ratio_backport,
        # the plugin's host overhead per step, net of the FastDeploy work it replaces: the median of
        # the per-round differences (a difference of the overall medians moves with a busy machine)
        "plugin_overhead_us_per_step": overhead_per_round(round_medians)["median_us"],
        "plugin_overhead_us_per_round": overhead_per_round(round_medians),
        "round_medians_ms": round_medians,
        "target_ratio": TARGET_RATIO,
        "target_met": met,
        "verdict": verdict_line,
        "census_per_step": census,
        "census_tp2_per_rank": census_tp,
        "paddle_gpu": cuda_available()[1],
    }
    gpu_ok, _ = cuda_available()
    if gpu_ok:  # pragma: no cover - needs a Paddle GPU build
        from ..testing.gpu_copy_strategies import compare_copy_strategies

        report["copy_strategies"] = compare_copy_strategies(batch, top_k, vocab)
    if getattr(args, "trace", None):
        try:
            report["trace"] = write_trace(args.trace, steps=args.trace_steps)
        except OSError as exc:  # the path changed while the benchmark ran, or the disk is full
            report["trace"] = {"error": f"cannot write the step trace: {exc}"}
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(format_report(report, format_census))
        if "error" in report.get("trace", {}):
            print(f"step trace NOT written: {report['trace']['error']}")
        elif "trace" in report:
            print(f"step trace: {report['trace']['file']} ({report['trace']['events']} events, "
                  f"{', '.join(report['trace']['tracks'])}): open it in https://ui.perfetto.dev")
    return 0 if met and "error" not in report.get("trace", {}) else 1


TRACE_VARIANTS = ("fd24-unpatched", "fd24-backport", "fd24-plugin", "fd24-overlap", "fd25-native")


def write_trace(path: str, steps: int = 8, variants=TRACE_VARIANTS, batch: int = 8, vocab: int = 256) -> dict:
    """``--trace``: ``steps`` decode steps of each variant on the replica (plain decode plus one
    request with logprobs), device tracking as the wait source, one track per variant."""
    from .. import sync_check, trace
    from ..testing.harness import CENSUS_VARIANTS, run_variant

    problem = trace.path_problem(path)
    if problem:
        raise OSError(f"{path}: {problem}")
    config, requests = plain_workload(batch, vocab, steps + 2)
    config = replace(config, block_size=64)
    recorder = trace.Trace("fd-async-copy bench (reference FastDeploy, CPU)")
    tracer = trace.StepTracer(recorder, track=variants[0])
    previous_tracer = trace.activate(tracer)
    saved_record = trace.wrap_event_record()
    try:
        for name in variants:
            variant = CENSUS_VARIANTS[name]
            tracer.use_track(name)
            sync_check.start(sync_check.Settings("count", 0))
            sync_check.install_step_hook(variant.root)  # before enable(): overlap wraps the hook
            try:
                run_variant(variant, config, requests, backend="host", max_steps=steps, track=True,
                            census=trace.census_class()())
            finally:
                sync_check.uninstall_step_hooks()
                sync_check.stop()
    finally:
        trace.unwrap(saved_record)
        trace.activate(previous_tracer)
    recorder.write(path)
    problems = trace.validate(recorder.to_json())
    if problems:  # pragma: no cover - a bug in the tracer
        raise RuntimeError(f"the step trace does not validate: {problems[:3]}")
    return {"file": path, "events": len(recorder.events), "tracks": list(variants), "steps_per_variant": steps}


def plain_workload(batch: int, vocab: int, steps: int):
    """``batch`` requests without logprobs, all admitted at step 0, decoding ``steps`` tokens."""
    from ..testing.harness import logprob_workload

    config, requests = logprob_workload(batch, 0, vocab, steps)
    config = replace(config, enable_logprob=False)
    return config, [replace(r, logprobs=None) for r in requests]


def format_overhead(report: dict) -> str:
    """The overhead line: the per-round figure with its spread, and a warning when the spread is
    wider than the figure (a busy machine), not a bare difference to read as the plugin's cost."""
    per_round = report.get("plugin_overhead_us_per_round")
    if not per_round or not per_round["rounds"]:
        return f"plugin host overhead per decode step: {report['plugin_overhead_us_per_step']:+.1f} us"
    line = (f"plugin host overhead per decode step: {per_round['median_us']:+.1f} us (per round: plugin - unpatched\n"
            f"  medians; the median of {per_round['rounds']} rounds, range {per_round['min_us']:+.1f} .. "
            f"{per_round['max_us']:+.1f} us)")
    spread = per_round["max_us"] - per_round["min_us"]
    if per_round["rounds"] < 3 or spread > max(abs(per_round["median_us"]), 1.0):
        line += "\n  (the rounds disagree by more than the figure: machine noise; rerun with more --repeats)"
    return line


def format_count_waits(census: dict) -> str:
    """Per overlap run: of the decode steps with a step in flight, the share whose forward came after
    the host waited for that step (its exact token count; ``exact``, ``prepare``: all, ``bound``:
    none), with the step counts."""
    rows = [(name, row["overlap_count_waits"]) for name, row in census.items() if row.get("overlap_count_waits")]
    if not rows:
        return "overlap: no overlap run in the census"
    lines = ["overlap: decode steps that waited for the last step's token count (census runs):"]
    for name, waits in rows:
        fraction = waits["waited_fraction"]
        counts = ", ".join(f"{cause} {n}" for cause, n in sorted(waits["count_waits"].items()))
        lines.append(f"  {name:20s} {waits['token_count']:6s} waited "
                     f"{'n/a' if fraction is None else f'{fraction:.3f}':>6s} ({counts})")
    return "\n".join(lines)


def format_report(report: dict, format_census) -> str:
    w = report["workload"]
    lines = [
        f"fd-async-copy bench: reference FastDeploy 2.4, B={w['batch']}, K={w['top_k']}, vocab={w['vocab']},",
        f"{w['steps']} steps x {w['repeats']} alternating rounds, backend {report['backend']}",
        f"timed: the decode steps of every round after the first {w.get('warmup_steps_excluded', WARMUP_STEPS)} "
        "of each run",
        f"{'host time per decode step':34s}{'median ms':>12s}{'p90 ms':>12s}{'timed':>8s}",
    ]
    for name, s in report["host_time_per_step"].items():
        lines.append(f"{name:34s}{s['median_ms']:12.3f}{s['p90_ms']:12.3f}{s['n']:8d}")
    lines.append(
        f"ratio plugin/unpatched (median): {report['ratio_plugin_over_unpatched']:.3f} "
        f"(target <= {report['target_ratio']}); backport only/unpatched: "
        f"{report['ratio_backport_over_unpatched']:.3f}"
    )
    lines.append(format_overhead(report))
    lines.append(report["verdict"])
    lines.append("")
    census_rows = {k: v for k, v in report["census_per_step"].items() if "blocking_d2h" in v}
    lines.append(format_census(census_rows))
    lines.append(CENSUS_LEGEND)
    if report.get("census_tp2_per_rank"):
        lines.append("")
        lines.append("tensor parallel, TP=2 (one row per rank; only rank 0 sends output):")
        lines.append(format_census(report["census_tp2_per_rank"]).split("\nrd>wait:")[0])
    lines.append("")
    from ..testing.harness import format_host_waits

    lines.append("plain decode (no logprobs):")
    lines.append(format_host_waits(report["census_per_step"]))
    lines.append("with logprobs (every request asks for top-k):")
    lines.append(format_host_waits(
        {k: {"host_waits": v["host_waits_with_logprobs"]} for k, v in report["census_per_step"].items()}
    ))
    lines.append(WAITS_LEGEND)
    lines.append("")
    lines.append(format_count_waits(report["census_per_step"]))
    fallbacks = [(name, feature, cause, n) for name, row in report["census_per_step"].items()
                 for feature, causes in (row.get("fallbacks") or {}).items() for cause, n in causes.items()]
    lines.append("")
    lines.append("fallbacks (FastDeploy's own path, by cause; census runs):" if fallbacks else
                 "fallbacks (FastDeploy's own path): none in the census runs")
    for name, feature, cause, n in fallbacks:
        lines.append(f"  {name:20s} {feature}: {cause[:60]} x{n}")
    if "copy_strategies" in report:  # pragma: no cover - GPU only
        lines.append("")
        lines.append("copy strategies on this GPU (per step, host us):")
        for name, value in report["copy_strategies"].items():
            lines.append(f"  {name:40s}{value:10.1f}")
    else:
        lines.append(f"copy-strategy comparison skipped: {report['paddle_gpu']}")
    return "\n".join(lines)
