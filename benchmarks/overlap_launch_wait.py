#!/usr/bin/env python3
"""A wait at the forward's launch: FD 2.4's bits with the overlap's bound-sized prepare (a check of
a design, not of the patches).

docs/overlap-token-count.md ("A wait at the forward's launch") describes it: step N+1 is prepared
sized by the upper bound (``FD_ASYNC_COPY_OVERLAP_COUNT=bound``), then, in ``padding_cudagraph_inputs``
(FastDeploy 2.4's last call before the model), the host waits for step N's snapshot, takes the exact
count and trims ``forward_meta``'s token-indexed tensors to it. The patches do not do this;
``launch_wait`` installs it on a runner class for the run.

For each real-steps workload (``testing/real_steps/check.py``) with the model's row-count-dependent
GEMM (``rows_dependent_gemm``: as cuBLAS on the H200, a padded row count can change the real rows'
bits), against unpatched FastDeploy 2.4 with its engine one step behind:

- ``exact``: the patches' default (identical expected);
- ``bound``: the patches' upper bound (may differ: that is what the trim is for);
- ``bound + launch wait``: ``bound`` with the wait and the trim at the launch (identical expected),
  with the number of steps it trimmed.

RESULT: PASS when ``exact`` and ``bound + launch wait`` are identical on every workload whose
reference ran, and the trim ran on some step.

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

#: the ``ForwardMeta`` fields indexed by packed token (``position_ids``: the replica's only)
TOKEN_FIELDS = ("ids_remove_padding", "batch_id_per_token", "position_ids")


@contextlib.contextmanager
def launch_wait(runner_class):
    """``runner_class.padding_cudagraph_inputs`` waits for the last step's snapshot when step_syncs
    sized this step by the bound, and trims the step's token-indexed inputs to the exact count.
    Yields the list of rows trimmed per such step (bound - exact)."""
    from fd_async_copy_plugin.patches.runner import part

    original = runner_class.__dict__["padding_cudagraph_inputs"]
    trimmed: list[int] = []

    def padding_cudagraph_inputs(self):
        syncs = part(self, "syncs")
        shadow = syncs.shadow if syncs is not None else None
        if shadow is not None and shadow.count_is_bound:
            shadow.refresh("launch wait")  # the wait exact makes at _prepare_inputs, made here
            count = shadow.recover_and_count(int(self.share_inputs["seq_lens_this_time"].shape[0]))
            meta = self.forward_meta
            trimmed.append(int(meta.ids_remove_padding.shape[0]) - count)
            for name in TOKEN_FIELDS:
                if getattr(meta, name, None) is not None:
                    setattr(meta, name, getattr(meta, name)[:count])
            meta.step_use_cudagraph = meta.step_use_cudagraph and count > 0
        return original(self)

    runner_class.padding_cudagraph_inputs = padding_cudagraph_inputs
    try:
        yield trimmed
    finally:
        runner_class.padding_cudagraph_inputs = original


def check(target, steps: int = 24) -> tuple[list[dict], bool]:
    """One row per workload and variant; whether the run passes."""
    import importlib

    from fd_async_copy_plugin.testing.harness import Variant, run_variant
    from fd_async_copy_plugin.testing.real_steps import check as real

    runner_class = importlib.import_module(f"{target.root}.worker.gpu_model_runner").GPUModelRunner
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
        for label, name, wrap in (("exact", "all,overlap exact", False), ("bound", "all,overlap bound", False),
                                  ("bound + launch wait", "all,overlap bound", True)):
            c = configs[name]
            with (launch_wait(runner_class) if wrap else contextlib.nullcontext([])) as trimmed, \
                    contextlib.redirect_stdout(sys.stderr):
                run = run_variant(real._variant(c, target.root), cfg, scenario.requests, backend="sim",
                                  max_steps=300, arrivals=scenario.arrivals, modules=target.modules())
            diffs = [d for d in reference.result.differences(run.result) if not d.startswith("executed_steps")]
            steps_trimmed = sum(1 for t in trimmed if t)
            trimmed_any |= steps_trimmed > 0
            if label != "bound":
                ok &= not diffs
            rows.append({"workload": scenario.name, "variant": label, "steps_trimmed": steps_trimmed,
                         "result": "identical" if not diffs else f"differs: {diffs[0]}"[:120]})
    return rows, ok and trimmed_any


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd-root", help="folder holding FastDeploy 2.4's fastdeploy/ (default: the replica)")
    parser.add_argument("--steps", type=int, default=24, help="longest request's max_tokens (default 24)")
    args = parser.parse_args(argv)
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
    rows, passed = check(target, args.steps)
    print(f"overlap launch wait on {where}; rows_dependent_gemm=True; reference: unpatched, engine one step behind")
    for row in rows:
        trimmed = f" (steps trimmed: {row['steps_trimmed']})" if "steps_trimmed" in row else ""
        print(f"  {row['workload'][:48]:48s} {row['variant']:20s} {row['result']}{trimmed}")
    print(f"RESULT: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
