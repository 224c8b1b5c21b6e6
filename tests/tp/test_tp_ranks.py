"""Tensor parallelism (issue 39): TP=2 and TP=4 ranks of the replica, each rank a thread with its own
runner and its own simulated device (``reference/tp.py``), FD 2.4's and 2.5's worker loop per rank.

Asserted for every run: rank 0's outputs are those of unpatched FastDeploy at the same TP (and the
unpatched TP run is the single-rank run); on every loop iteration all ranks inserted the same tasks
and gave the same ``not_need_stop()`` answer, executed alike and reported the same
``exist_prefill()`` (``TPResult.asymmetries``); every all-reduce met the same rows on every rank (a
mismatch fails the run at once: ``CollectiveMismatch``); no rank waits at a collective the others
never reach (``RankHang`` with every rank's stack after the run's timeout). The plugin's patched path
ran on every rank (its per-runner counters). Real CPU Paddle, the ``sim`` backend per rank.
"""

from __future__ import annotations

import dataclasses

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.cli import doctor
from fd_async_copy_plugin.patches.runner import part
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference import tp as tpm
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from fd_async_copy_plugin import runtime

pytestmark = pytest.mark.usefixtures("plugin_off")

FD24, FD25 = ROOTS["fd24"], ROOTS["fd25"]
EOS = [2]
TIMEOUT = 15.0


def _req(i, n_prompt, max_tokens, **kw):
    return Request(f"t{i}", [(17 * i + 5 * j) % 200 + 3 for j in range(n_prompt)], max_tokens=max_tokens,
                   eos_token_ids=EOS, **kw)


def msgq_workload():
    """The save-op path: logprobs k=5 (and none), staggered finishes, a request inserted every step,
    seeded top-p, a stop sequence, chunked prefill and preemption (KV blocks short)."""
    def make(i):
        kw = dict(logprobs=5 if i % 2 == 0 else None)
        if i % 3 == 0:
            kw.update(top_p=0.7, seed=40 + i)
        if i % 5 == 2:
            kw.update(stop_seqs=[[(17 * i) % 200 + 3, 9]])
        return _req(i, 3 + (i * 5) % 13, 1 if i % 6 == 4 else 9 + (i * 7) % 13, **kw)

    cfg = DriverConfig(max_num_seqs=8, vocab_size=256, max_model_len=64, chunk_size=8, enable_logprob=True,
                       num_gpu_blocks=9, preemption=True)
    return cfg, [make(i) for i in range(4)], {s: [make(3 + s)] for s in range(1, 10)}


def zmq_workload():
    """The ZMQ output path (``FD_USE_GET_SAVE_OUTPUT_V1``, where prompt logprobs travel): logprobs k=5,
    prompt logprobs, staggered finishes, a request inserted every step."""
    def make(i):
        return _req(i, 3 + (i * 5) % 11, 2 + (i * 7) % 9, logprobs=5,
                    prompt_logprobs=5 if i % 2 == 0 else None)

    cfg = DriverConfig(max_num_seqs=8, vocab_size=256, max_model_len=64, enable_logprob=True, save_output_v1=True)
    return cfg, [make(i) for i in range(3)], {s: [make(2 + s)] for s in range(1, 8)}


WORKLOADS = {"msgq": msgq_workload, "zmq": zmq_workload}

# (name, replica, features (None: the default, every feature), overlap count, FD 2.5's overlap schedule)
VARIANTS = [
    ("fd24-default", FD24, None, None, False),
    ("fd24-all,overlap-exact", FD24, ("all", "overlap"), "exact", False),
    ("fd24-all,overlap-bound", FD24, ("all", "overlap"), "bound", False),
    ("fd25-default", FD25, None, None, False),
    ("fd25-overlap", FD25, None, None, True),
]

_BASE: dict = {}


def unpatched_tp(root, cfg, requests, arrivals, tp):
    key = (root, repr(cfg), tp)
    if key not in _BASE:
        with tpm.tp_backends(tp):
            _BASE[key] = tpm.run_decode_tp(root, cfg, tp, requests, arrivals, timeout=TIMEOUT)
        previous = replica_backend.use(runtime.make_backend("sim"))
        try:
            single = run_decode(root, cfg, requests, arrivals)
        finally:
            replica_backend.use(previous)
        _BASE[key].result.assert_same(single)  # the TP replica is the single-rank replica
        assert not _BASE[key].asymmetries()
    return _BASE[key]


def plugin_tp(root, cfg, requests, arrivals, tp, features, count=None, **kw):
    with tpm.enable_tp(tp, list(features) if features else None, root, overlap_count=count):
        run = tpm.run_decode_tp(root, cfg, tp, requests, arrivals, timeout=TIMEOUT, **kw)
        states = {n: s["state"] for n, s in fd_async_copy_plugin.status()["features"].items()}
        # each rank's parts, before disable() takes them off
        parts = [{slot: part(runner, slot) for slot in ("stop", "syncs", "overlap")} for runner in run.runners]
    return run, states, parts


def check_variant(variant, workload, tp, **kw):
    name, root, features, count, overlap_25 = variant
    cfg, requests, arrivals = WORKLOADS[workload]()
    cfg = dataclasses.replace(cfg, overlap=overlap_25)
    overlap_24 = bool(features and "overlap" in features)
    # on the ZMQ path the plugin's overlap is off per step on every rank alike: FD 2.4's own schedule
    overlap_off = overlap_24 and cfg.save_output_v1
    overlap_24 = overlap_24 and not overlap_off
    base = unpatched_tp(root, dataclasses.replace(cfg, engine_lag=cfg.engine_lag + overlap_24), requests, arrivals, tp)
    run, states, parts = plugin_tp(root, cfg, requests, arrivals, tp, features, count, **kw)
    # rank 0's outputs: identical (overlap on 2.4: FD 2.4 with the engine one step further behind;
    # only the flush steps that send nothing are added)
    diffs = [d for d in base.result.differences(run.result) if not (overlap_24 and d.startswith("executed_steps"))]
    assert not diffs, diffs[:10]
    assert not run.result.truncated
    # every rank decided alike on every iteration, and met the others at every collective
    assert not run.asymmetries(), run.asymmetries()[:5]
    assert len(run.ranks) == tp and run.collectives >= 2 * len(run.ranks[0])
    # the patched path ran on every rank
    fd24 = root == FD24
    expected = ("logprobs", "stop_flag", "step_syncs") if fd24 else ("logprobs", "step_syncs")
    for feature in expected + (("overlap",) if overlap_24 else ()):
        assert states[feature] == "applied", states
    # what doctor says of TP: the features that stand down on some rank (none)
    assert sorted(f for f, st in states.items() if st in ("partial", "passthrough")) == \
        doctor.TENSOR_PARALLEL["stands_down"], states
    for rank, own in enumerate(parts):
        assert own["syncs"] is not None and (own["stop"] is not None) == fd24, (rank, own)
        served = own["syncs"].shadow.served if own["syncs"].shadow is not None else {}
        assert sum(served.values()) > 0, (rank, served)
        if overlap_24:
            assert own["overlap"].served["overlap steps"] > 0, (rank, own["overlap"].served)
        if overlap_off:
            assert set(own["overlap"].fallbacks) <= {"ZMQ output path", "prompt logprobs"}, own["overlap"].fallbacks
            assert own["overlap"].fallbacks["ZMQ output path"] > 0 and not own["overlap"].served, rank
    if overlap_off:  # the same steps fell back on every rank
        counts = {tuple(own["overlap"].fallbacks.items()) for own in parts}
        assert len(counts) == 1, counts
    if workload == "msgq":
        assert run.result.preemptions > 0
    return run


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_ranks_decide_alike(variant, workload, tp):
    check_variant(variant, workload, tp)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("setting", ["speeds-1x-3x", "rank1-late"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_ranks_at_different_speeds(variant, setting, workload, tp):
    """Rank 0's device at 1x (an event's copies are complete when the host asks), rank 1's at 3x (at
    TP=4: 1x, 3x, 1x, 3x), or rank 1's copies landing only when waited for, late. Under FD 2.5's overlap schedule ``step_syncs``
    asks the device whether the last step's snapshot landed (``TokenShadow.settle``): the ranks then
    take different host paths (one answers from its shadow, the other waits as FD does) - and the
    same decisions. Elsewhere no plugin decision asks the device (asserted: no query was made)."""
    kw = dict(speeds=[1, 3] * (tp // 2)) if setting == "speeds-1x-3x" else dict(late_rank=1)
    run = check_variant(variant, workload, tp, **kw)
    fast, slow = (b.queries for b in run.backends[:2])
    if variant[4]:  # FD 2.5's overlap schedule: step_syncs asks whether the last step's snapshot landed
        if setting == "speeds-1x-3x":
            assert fast["complete"] > 0 and fast["in flight"] == 0, fast
        assert slow["in flight"] > 0 and slow["complete"] == 0, slow
    else:  # nothing asks the device: every decision follows the host's own waits (FD's or the plugin's)
        assert fast == slow == {"complete": 0, "in flight": 0}, (fast, slow)


def test_doctor_says_what_holds_under_tp():
    report = doctor.diagnose(root=FD24)
    assert report["tensor_parallel"]["stands_down"] == []
    text = doctor.format_report(report)
    assert "tensor parallel   every rank decides alike: no feature stands down under TP" in text
    assert all(len(line) <= doctor.WIDTH for line in text.splitlines())
