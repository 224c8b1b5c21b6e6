"""Issue 24: on FD 2.4 a decode step's copies - the stop flag, the sampled tokens, step_syncs'
snapshot and overlap's step flag - go to the backend as one ``copy_d2h_many`` batch with the step's
event (one lock, one C call with the custom ops built), in the order the parts issued them one by
one before; outputs stay FastDeploy's."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.runtime import CopyBackend
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend

pytestmark = pytest.mark.usefixtures("plugin_off")

STOP = ["not_need_stop", "sampled_token_ids"]
SNAPSHOT = [f"step_syncs.{n}" for n in ("this_time", "enc", "block_step", "step_dec")]


@pytest.fixture
def batches(monkeypatch):
    """Every copy_d2h_many call (its copies' labels, its event's label) and every lone copy_d2h."""
    log = {"batches": [], "singles": []}
    many = RuntimeBackend.copy_d2h_many

    def logged(self, copies, label):
        log["batches"].append(([name for _, _, name in copies], label))
        return many(self, copies, label)

    monkeypatch.setattr(RuntimeBackend, "copy_d2h_many", logged)
    monkeypatch.setattr(CopyBackend, "copy_d2h", lambda self, dst, src, label: log["singles"].append(label) or
                        self.copy_d2h_many(((dst, src, label),), None))
    return log


def _step_batches(log) -> list:
    steps = [names for names, label in log["batches"] if label == "post_process"]
    lone = STOP + SNAPSHOT + ["overlap.not_need_stop", "step_syncs.token_num"]
    assert not [s for s in log["singles"] if s in lone]  # none of the step's copies went alone
    return steps


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_a_steps_copies_are_one_batch_with_its_event(sfkit, batches, backend):
    config, requests, arrivals = sfkit.mixed()
    baseline = sfkit.run(config, requests, arrivals=arrivals)
    batches["batches"].clear()
    run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=[*sfkit.FEATURES, "step_syncs"])
    assert run.result.outputs == baseline.result.outputs
    steps = _step_batches(batches)
    assert len(steps) == run.result.executed_steps
    assert all(names[:6] == STOP + SNAPSHOT for names in steps)  # the flag, the tokens, the snapshot
    assert any(names[6:] == ["step_syncs.token_num"] for names in steps)  # the count, where the shadow has one


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_under_overlap_the_step_flag_joins_the_batch(batches, backend):
    from test_overlap import EXACT, run_exact

    cfg, requests, arrivals = EXACT["arrivals every step"]()
    run_exact(cfg, requests, arrivals, backend)  # FD 2.4's outputs, the engine one step behind
    steps = _step_batches(batches)
    assert steps and all(names[:6] == STOP + SNAPSHOT for names in steps)
    assert sum(names[-1] == "overlap.not_need_stop" for names in steps) >= len(steps) - 2
