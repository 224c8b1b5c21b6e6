"""Issue 24: the host reads that want numbers - the stop flag made current, step_syncs' snapshot taken
into the shadow - go through ``CopyBackend.host_array`` (the wait, then the rows as an owned numpy
array) instead of ``to_host(...).numpy()``, which made a framework tensor for each (~7-10 us on
Paddle) and copied it again. Outputs stay FastDeploy's, on the simulator too (a read before its copy
landed raises there)."""

from __future__ import annotations

from collections import Counter

import pytest

from fd_async_copy_plugin.runtime import CopyBackend

pytestmark = pytest.mark.usefixtures("plugin_off")

SNAPSHOT_READS = (".this_time", ".enc", ".block_step", ".step_dec", ".token_num")


@pytest.fixture
def reads(monkeypatch):
    log = {"to_host": [], "host_array": []}
    to_host, host_array = CopyBackend.to_host, CopyBackend.host_array

    def logged_to_host(self, t, reader, *args):
        if self.is_pinned(t):
            log["to_host"].append(reader)
        return to_host(self, t, reader, *args)

    def logged_host_array(self, t, reader, *args):
        log["host_array"].append(reader)
        return host_array(self, t, reader, *args)

    monkeypatch.setattr(CopyBackend, "to_host", logged_to_host)
    monkeypatch.setattr(CopyBackend, "host_array", logged_host_array)
    return log


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_the_flag_and_the_snapshot_are_read_without_a_tensor(sfkit, reads, backend):
    config, requests, arrivals = sfkit.mixed()
    baseline = sfkit.run(config, requests, arrivals=arrivals)
    reads["to_host"].clear()
    reads["host_array"].clear()
    run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=[*sfkit.FEATURES, "step_syncs"])
    assert run.result.outputs == baseline.result.outputs
    tensors = Counter(reads["to_host"])
    numbers = Counter(reads["host_array"])
    steps = run.result.executed_steps
    assert tensors["save_output"] == steps  # what FD's save is handed stays a tensor: the sampled tokens
    assert numbers["save_output"] == steps  # the flag made current before the save, as numbers
    assert all(numbers[f"exist_prefill{name}"] == steps for name in SNAPSHOT_READS)  # the snapshot
    assert not [r for r in tensors if r.endswith(SNAPSHOT_READS)]
