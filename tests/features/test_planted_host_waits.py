"""Device-value tracking catches host waits in the plugin's own code, wherever they hide.

The plugin's contract on its patched paths: **no** tracked host read of a device value and no
implicit H2D (``harness.plugin_host_reads``); its only waits are event waits. Each planted bug
below reintroduces one defect the CUDA path had (issue 9) into a patched path, and the census
names it by file:line; the real code passes the same check. Real CPU Paddle, the fd24/fd25
replica, host and sim backends.
"""

from __future__ import annotations


import paddle
import pytest

from fd_async_copy_plugin.testing.harness import Variant, plugin_host_reads, run_variant, selftest_scenarios
from fd_async_copy_plugin.ops import stop_flag_ops
from fd_async_copy_plugin.patches.fd24 import stop_flag as stop_flag_patch
from fd_async_copy_plugin.testing.reference import ROOTS, device_tracking
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request
from fd_async_copy_plugin.testing.reference.placement import as_device
from fd_async_copy_plugin.runtime import collecting
from fd_async_copy_plugin.runtime.backend import host_view
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend
from fd_async_copy_plugin.runtime.host import HostBackend

pytestmark = pytest.mark.usefixtures("plugin_off")

CONFIG = DriverConfig(max_num_seqs=4, vocab_size=256, max_model_len=64, enable_logprob=True)
#: logprobs widen mid-run (a later request asks for more): the pinned ring grows mid-decode.
REQUESTS = [Request(f"r{i}", [3 + i, 4, 5], max_tokens=10, eos_token_ids=[300], logprobs=1) for i in range(2)]
ARRIVALS = {4: [Request("wide", [9, 8, 7], max_tokens=4, eos_token_ids=[300], logprobs=10)]}


def tracked_plugin_run(backend="host", config=CONFIG, requests=REQUESTS, arrivals=ARRIVALS, replica="fd24"):
    variant = Variant(f"{replica}-plugin", ROOTS[replica], True)
    run = run_variant(variant, config, requests, backend=backend, arrivals=arrivals, max_steps=40, track=True)
    # the patched paths ran: the plugin's asynchronous copies of the flag, the tokens, the logprobs
    copies = {site for s in run.census.steps for k, site in s.events if k == "async_d2h"}
    assert {"not_need_stop", "sampled_token_ids", "gather_logprobs.logprobs"} <= copies, copies
    return run


# -- the real code ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_the_plugin_adds_no_tracked_host_read_on_its_patched_paths(backend):
    run = tracked_plugin_run(backend)
    assert plugin_host_reads(run.census) == []
    # ... while the census did see the plugin at work: its event wait, every step that saved
    events = [s for s in run.census.steps if any(k == "host_wait" and "|event|patches/" in site for k, site in s.events)]
    assert len(events) >= run.result.executed_steps - 1


@pytest.mark.parametrize("scenario", range(4), ids=["fd24-save-ops", "fd24-zmq", "fd24-legacy", "fd25-overlap"])
def test_no_tracked_host_read_in_any_selftest_scenario(scenario):
    sc = selftest_scenarios(steps=10)[scenario]
    run = run_variant(Variant("p", ROOTS[sc.replica], True), sc.config, sc.requests, backend="sim",
                      arrivals=sc.arrivals, max_steps=200, track=True)
    assert plugin_host_reads(run.census) == []


def test_stop_flag_launcher_argument_checks_read_shapes_not_device_values():
    """The CUDA launcher's helpers (``_address``, ``_elements``; ``check_device_tensors`` and
    ``block_tables_numel`` use ``_elements``) on device tensors: no host read. ``int(t.numel())``
    was a blocking D2H per tensor per call."""
    t = as_device(paddle.zeros([3, 5], dtype="int32"))
    empty = as_device(paddle.zeros([0], dtype="int32"))
    with collecting(), device_tracking.tracking() as tracker:
        assert stop_flag_ops._elements(t) == 15
        assert stop_flag_ops._address(t) == t.data_ptr()
        assert stop_flag_ops._address(empty) is None
    assert tracker.waits == []


# -- planted bugs: each must be caught, by file:line ----------------------------------------------


def _plant(monkeypatch, owner, name, before):
    original = getattr(owner, name)

    def planted(*args, **kwargs):
        before(*args, **kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, planted)
    return before


def _caught(run, before, mechanism: str) -> list[dict]:
    reads = plugin_host_reads(run.census)
    here = "tests/features/test_planted_host_waits.py:"
    hits = [w for w in reads if w["where"].startswith(here) and w["mechanism"] == mechanism]
    assert hits, f"planted {before.__name__} not caught; plugin reads: {reads}"
    lines = {int(w["where"].split(":")[1].split()[0]) for w in hits}
    first, last = before.__code__.co_firstlineno, before.__code__.co_firstlineno + 10
    assert all(first <= n <= last for n in lines), (lines, first)
    assert any(w["step"] >= 0 for w in hits), "caught only at set-up, not in a decode step"
    return hits


def test_planted_int_numel_on_a_device_tensor_in_the_update_path_is_caught(monkeypatch):
    def numel_before_update(self, stop_flags, *args, **kwargs):
        if int(stop_flags.numel()) == 0:  # the launcher's old argument check
            raise ValueError

    _plant(monkeypatch, stop_flag_ops.StopFlagOps, "update_inputs_v1_host", numel_before_update)
    run = tracked_plugin_run()
    _caught(run, numel_before_update, "d2h")


def test_planted_ring_growth_through_cpu_is_caught(monkeypatch):
    original = HostBackend._alloc

    def alloc_through_the_device(self, shape, dtype, private=False):
        t = original(self, shape, dtype, private)  # the layer's host allocation, then initialised from ...
        host_view(t, self.glue)[...] = paddle.zeros(shape, dtype=dtype).cpu().numpy()  # ... a GPU one: a blocking D2H
        return t

    monkeypatch.setattr(HostBackend, "_alloc", alloc_through_the_device)
    run = tracked_plugin_run()
    reads = plugin_host_reads(run.census)
    grown = [w for w in reads if w["step"] >= 0 and "alloc_through_the_device" in w["where"]]
    assert grown, f"the ring grew mid-decode without a caught read: {reads}"
    # (the ring really grew in a decode step: a pinned allocation after set-up)
    assert any(k == "pinned_alloc" for s in run.census.steps for k, _ in s.events)
    assert all(w["mechanism"] == "d2h" and w["what"] == ".cpu()" for w in grown)


def test_planted_host_tensor_into_a_device_op_in_a_patched_path_is_caught(monkeypatch):
    def host_tensor_into_device_op(self, topk_ids):
        if topk_ids is not None:
            floor = paddle.to_tensor([[0]], dtype="int64", place=paddle.CPUPlace())
            paddle.maximum(topk_ids, floor)  # Paddle's place transform: stream sync + copy

    _plant(monkeypatch, stop_flag_patch.StopFlagState, "after_update", host_tensor_into_device_op)
    run = tracked_plugin_run()
    hits = _caught(run, host_tensor_into_device_op, "h2d")
    assert hits[0]["what"] == "maximum: pageable host input"


def test_planted_numpy_of_the_device_stop_flag_is_caught(monkeypatch):
    def read_device_flag(self, topk_ids):
        self.device.numpy()

    _plant(monkeypatch, stop_flag_patch.StopFlagState, "after_update", read_device_flag)
    run = tracked_plugin_run()
    hits = _caught(run, read_device_flag, "d2h")
    assert hits[0]["what"] == ".numpy()"


def test_planted_host_read_inside_the_cuda_paths_copy_is_caught(monkeypatch):
    """The copy by address (``RuntimeBackend.copy_d2h_many``, where it reads the sources' facts,
    then ``_issue``: the ``cuda`` backend's code, run by ``host`` on ``HostRuntime``) is tracked: only
    the simulator's modelled DMA (``glue.snapshot``) is not."""

    def numel_in_the_copy(self, copies, label):
        if any(int(src.numel()) == 0 for _, src, _ in copies):  # a device value read where only metadata may be
            raise ValueError

    _plant(monkeypatch, RuntimeBackend, "copy_d2h_many", numel_in_the_copy)
    run = tracked_plugin_run()
    _caught(run, numel_in_the_copy, "d2h")
