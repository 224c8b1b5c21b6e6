#!/usr/bin/env python3
"""A wait at the forward's launch: ``FD_ASYNC_COPY_OVERLAP_COUNT=exact`` (the default) keeps FD 2.4's
bits with the overlap's bound-sized prepare.

docs/overlap-token-count.md ("A wait at the forward's launch") describes it: step N+1 is prepared
sized by the upper bound (as ``bound``), then, in ``padding_cudagraph_inputs`` (FastDeploy 2.4's last
call before the model), the host waits for step N's snapshot, takes the exact count and trims
``forward_meta``'s token-indexed tensors to it (``patches/fd24/overlap.py``: ``OverlapState.launch_wait``).

For each real-steps workload (``testing/real_steps/check.py``) with the model's row-count-dependent
GEMM (``rows_dependent_gemm``: as cuBLAS on the H200, a padded row count can change the real rows'
bits), against unpatched FastDeploy 2.4 with its engine one step behind:

- ``exact`` (the default): ``bound``'s prepare with the wait and the trim at the launch (identical
  expected), with the number of steps it trimmed (the runner's ``status()``);
- ``prepare``: the wait before the prepare (identical expected);
- ``bound``: the patches' upper bound (may differ: that is what the trim is for).

``--counts`` picks among them (``launch``, the old name of ``exact``, runs as ``exact``). RESULT:
PASS when every count but ``bound`` is identical on every workload whose reference ran, and, where
``exact`` ran, the trim ran on some step.

    python benchmarks/overlap_launch_wait.py --fd-root /path/to/FastDeploy-2.4   # FD 2.4's own runner
    python benchmarks/overlap_launch_wait.py                                    # the replica (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def steps_trimmed(run) -> int:
    """Steps the ``exact`` mode trimmed, from the run's final ``status()`` (0 for the other modes)."""
    runners = (((run.final_status or {}).get("features") or {}).get("overlap") or {}).get("runners") or []
    return sum(int((r.get("launch") or {}).get("steps trimmed", 0)) for r in runners)


def check(target, steps: int = 24, counts=("exact", "prepare", "bound")) -> tuple[list[dict], bool]:
    """One row per workload and variant; whether the run passes."""
    from fd_async_copy_plugin.testing.harness import Variant, run_variant
    from fd_async_copy_plugin.testing.real_steps import check as real

    configs = {c.name: c for c in real.configurations("fd24")}
    rows, ok, trimmed_any = [], True, False
    for scenario in real.scenarios("fd24", steps):
        if scenario.not_with:  # overlap keeps FastDeploy's schedule there
            continue
        cfg = dataclasses.replace(scenario.config, rows_dependent_gemm=True)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                reference = run_variant(Variant("reference", target.root, False), dataclasses.replace(cfg, engine_lag=1),
                                        scenario.requests, backend="host", max_steps=300, arrivals=scenario.arrivals,
                                        modules=target.modules())
        except RuntimeError as exc:  # the driver's own limits (e.g. every request waiting for a block)
            rows.append({"workload": scenario.name, "variant": "reference", "result": f"not run: {exc}"[:120]})
            continue
        for label in counts:
            c = configs[f"all,overlap {label}"]
            with contextlib.redirect_stdout(sys.stderr):
                run = run_variant(real._variant(c, target.root), cfg, scenario.requests, backend="sim",
                                  max_steps=300, arrivals=scenario.arrivals, modules=target.modules())
            diffs = [d for d in reference.result.differences(run.result) if not d.startswith("executed_steps")]
            trimmed = steps_trimmed(run)
            trimmed_any |= label in ("exact", "launch") and trimmed > 0
            if label != "bound":
                ok &= not diffs
            rows.append({"workload": scenario.name, "variant": label, "steps_trimmed": trimmed,
                         "result": "identical" if not diffs else f"differs: {diffs[0]}"[:120]})
    return rows, ok and (trimmed_any or not {"exact", "launch"} & set(counts))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd-root", help="folder holding FastDeploy 2.4's fastdeploy/ (default: the replica)")
    parser.add_argument("--steps", type=int, default=24, help="longest request's max_tokens (default 24)")
    parser.add_argument("--counts", default="exact,prepare,bound",
                        help="FD_ASYNC_COPY_OVERLAP_COUNT values, comma-separated (default exact,prepare,bound)")
    args = parser.parse_args(argv)
    counts = tuple(c.strip() for c in args.counts.split(",") if c.strip())
    if not counts or set(counts) - {"exact", "prepare", "bound", "launch"}:
        parser.error(f"--counts {args.counts!r}: allowed exact, prepare, bound, launch")
    from fd_async_copy_plugin.testing.real_steps import check as real

    if args.fd_root:
        from fd_async_copy_plugin.testing.real_steps.environment import prepare

        with contextlib.redirect_stdout(sys.stderr):
            prepared = prepare(args.fd_root)
        if prepared.line != "fd24":
            parser.error(f"--fd-root {args.fd_root}: FastDeploy {prepared.line}; the launch wait is FD 2.4's")
        target, where = real.real_target(), f"FastDeploy 2.4 at {prepared.fastdeploy_file}"
    else:
        from fd_async_copy_plugin.testing.reference import ROOTS

        target, where = real.Target(ROOTS["fd24"], "fd24", real=False), "the replica fd24"
    rows, passed = check(target, args.steps, counts)
    print(f"overlap launch wait on {where}; rows_dependent_gemm=True; reference: unpatched, engine one step behind")
    for row in rows:
        trimmed = f" (steps trimmed: {row['steps_trimmed']})" if "steps_trimmed" in row else ""
        print(f"  {row['workload'][:48]:48s} {row['variant']:20s} {row['result']}{trimmed}")
    print(f"RESULT: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
