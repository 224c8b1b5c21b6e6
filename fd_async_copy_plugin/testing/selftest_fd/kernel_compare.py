"""Framework-neutral core of the stop-flag kernel comparison: numpy arrays in, mismatches out.

Two implementations of FastDeploy's ``update_inputs_v1`` / ``update_inputs`` are run on the same
random slot states (``ops/slot_states.py``: every branch, ``bsz < max_bsz``, int32 wrap, batches up
to ``max_num_seqs``) and every array plus the returned ``not_need_stop`` are compared bit for bit.
An implementation is a callable ``run(batch) -> bool`` that updates the numpy arrays of ``batch``
in place (moving them to a device and back is its own business) and returns the new flag.

Used by ``fd-async-copy selftest`` (FastDeploy's compiled ops against the plugin's kernels, through
Paddle tensors on the user's GPU) and by ``benchmarks/selftest_kernel_compare.py`` (the plugin's
CUDA kernels through CuPy/PyTorch against the numpy statement of FastDeploy's semantics, on a GPU
machine without Paddle). Imports numpy and the standard library only.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from fd_async_copy_plugin.testing import slot_states as states
from ..reference import update_inputs_semantics as semantics

VARIANTS = {"v1": states.V1_ARRAYS, "v0": states.V0_ARRAYS}
MIN_SLOTS = 10_000
MIN_BATCHES = 100  # many batch sizes, not only a few full ones

Runner = Callable[[dict], bool]


def arrays(variant: str) -> tuple[str, ...]:
    return VARIANTS[variant]


def reference_runner(variant: str) -> Runner:
    """The numpy statement of FastDeploy's semantics (``reference/update_inputs_semantics.py``)."""
    names = arrays(variant)
    if variant == "v1":
        def run(batch: dict) -> bool:
            return bool(semantics.update_inputs_v1_np(
                *(batch[n] for n in names), batch["block_size"],
                prefill_one_step_stop=batch["prefill_one_step_stop"]))
    else:
        def run(batch: dict) -> bool:
            return bool(semantics.update_inputs_np(*(batch[n] for n in names)))
    return run


def batches(variant: str, seed: int, min_slots: int, max_num_seqs: int = semantics.MAX_BATCH,
            stop_nums_required: bool = False, min_batches: int = MIN_BATCHES):
    """Random batches until ``min_slots`` running slot states were generated; edge batches first
    (empty, one slot, exactly ``max_num_seqs``). ``stop_nums_required``: FastDeploy 2.4's ops
    dereference ``stop_nums``, so ``None`` is replaced by ``[max_bsz]`` (what 2.4 passes)."""
    generate = states.random_v1_batch if variant == "v1" else states.random_v0_batch
    rng = np.random.default_rng(seed)
    cap = max(1, min(int(max_num_seqs), semantics.MAX_BATCH))
    fixed = [(1, 0), (1, 1), (cap, cap), (cap, 0), (cap, (cap + 1) // 2)]
    slots = count = 0
    while slots < min_slots or count < min_batches or fixed:
        if fixed:
            batch = generate(rng, *fixed.pop(0))
        else:
            max_bsz = int(rng.integers(1, cap + 1)) if rng.random() < 0.5 else cap
            bsz = int(rng.choice([max_bsz, max_bsz, int(rng.integers(0, max_bsz + 1))]))
            batch = generate(rng, max_bsz, bsz)
        if stop_nums_required and batch["stop_nums"] is None:
            batch["stop_nums"] = np.array([len(batch["stop_flags"])], dtype=np.int64)
        slots += len(batch["seq_lens_this_time"])
        count += 1
        yield batch


def compare(variant: str, expected: Runner, actual: Runner, *, min_slots: int = MIN_SLOTS, seed: int = 6176,
            max_num_seqs: int = semantics.MAX_BATCH, stop_nums_required: bool = False,
            max_reported: int = 10, min_batches: int = MIN_BATCHES) -> dict:
    """Run both implementations on the same random batches; every array and the flag must agree.

    Returns ``{"variant", "slots", "batches", "max_bsz", "partial_batches", "branches",
    "mismatching_batches", "mismatches": [...first max_reported...], "seconds"}``; an
    implementation that raises is a mismatch naming the exception.
    """
    names = arrays(variant)
    started = time.perf_counter()
    report = {"variant": variant, "slots": 0, "batches": 0, "max_bsz": 0, "partial_batches": 0,
              "branches": dict.fromkeys(states.V1_BRANCHES, 0) if variant == "v1" else {},
              "mismatching_batches": 0, "mismatches": []}
    for index, batch in enumerate(batches(variant, seed, min_slots, max_num_seqs, stop_nums_required, min_batches)):
        bsz, max_bsz = len(batch["seq_lens_this_time"]), len(batch["stop_flags"])
        if variant == "v1":
            for i in range(bsz):
                report["branches"][states.v1_branch(batch, i)] += 1
        differs = compare_batch(names, batch, expected, actual)
        if differs:
            report["mismatching_batches"] += 1
            if len(report["mismatches"]) < max_reported:
                report["mismatches"].append(f"batch {index} (bsz={bsz}, max_bsz={max_bsz}): " + "; ".join(differs))
        report["slots"] += bsz
        report["batches"] += 1
        report["max_bsz"] = max(report["max_bsz"], max_bsz)
        report["partial_batches"] += bsz < max_bsz
    report["seconds"] = round(time.perf_counter() - started, 2)
    return report


def compare_batch(names, batch: dict, expected: Runner, actual: Runner) -> list[str]:
    """One batch through both implementations; the names of what differs (empty: identical)."""
    results = []
    for label, run in (("expected", expected), ("actual", actual)):
        mine = states.copy_batch(batch)
        try:
            flag = run(mine)
        except Exception as exc:  # noqa: BLE001 - a failing implementation is the finding
            return [f"{label} raised {type(exc).__name__}: {exc}".splitlines()[0][:300]]
        results.append((mine, flag))
    (want, want_flag), (got, got_flag) = results
    differs = []
    for name in names:
        if batch[name] is None or name == "not_need_stop":
            continue
        if got[name].shape != want[name].shape or not np.array_equal(got[name], want[name]):
            rows = np.nonzero(np.any((got[name] != want[name]).reshape(len(got[name]), -1), axis=1))[0] \
                if got[name].shape == want[name].shape and got[name].ndim else []
            differs.append(f"{name} differs (rows {list(rows[:5])})")
    if bool(got_flag) != bool(want_flag):
        differs.append(f"not_need_stop {got_flag} != {want_flag}")
    return differs


def passed(reports) -> bool:
    return all(r["mismatching_batches"] == 0 and r["slots"] >= 1 for r in reports)


def summary(report: dict) -> str:
    verdict = "identical" if report["mismatching_batches"] == 0 else f"{report['mismatching_batches']} MISMATCHING batches"
    return (f"{report['variant']}: {report['slots']} slot states in {report['batches']} batches "
            f"(max_bsz up to {report['max_bsz']}, {report['partial_batches']} with bsz < max_bsz): {verdict}")
