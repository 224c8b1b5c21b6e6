"""Issue 13 defect 8: status() reports what runs, per runner: one runner standing down does not mark
the process's other (patched) runners as not patched, and a live runner left on FastDeploy's path
by disable() is not reported applied after enable()."""

from __future__ import annotations

import gc

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.testing.reference.driver import DriverConfig
from fd_async_copy_plugin.patches.runner import part

pytestmark = pytest.mark.usefixtures("plugin_off")

SMALL = DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16, hidden_size=8)
LARGE = DriverConfig(max_num_seqs=1025, vocab_size=64, max_model_len=16, hidden_size=8, save_output_v1=True)


def test_one_runner_standing_down_does_not_unpatch_the_others_in_status(sfkit):
    fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend="host", root=sfkit.FD24)
    try:
        small, large = sfkit.build_runners([SMALL, LARGE])
        assert part(small, "stop") is not None and part(large, "stop") is None
        entry = fd_async_copy_plugin.status()["features"]["stop_flag"]
        assert entry["state"] == "partial", entry
        assert "1 of 2 runners patched" in entry["reason"] and "max_num_seqs=1025" in entry["reason"]
        by_state = sorted(r["state"] for r in entry["runners"])
        assert by_state == ["applied", "passthrough"], entry["runners"]
        del small, large
    finally:
        fd_async_copy_plugin.disable()


def test_a_live_runner_left_on_fastdeploys_path_by_disable_is_not_reported_applied(sfkit):
    fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend="host", root=sfkit.FD24)
    try:
        (runner,) = sfkit.build_runners([SMALL])
        assert fd_async_copy_plugin.status()["features"]["stop_flag"]["state"] == "applied"
        fd_async_copy_plugin.disable()
        fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend="host", root=sfkit.FD24)
        assert part(runner, "stop") is None  # the live runner runs FastDeploy's own path
        entry = fd_async_copy_plugin.status()["features"]["stop_flag"]
        assert entry["state"] != "applied", entry
        assert entry["runners"][0]["state"] == "passthrough" and "disable()" in entry["runners"][0]["reason"]
        (fresh,) = sfkit.build_runners([SMALL])  # a runner built now is patched: partial
        assert fd_async_copy_plugin.status()["features"]["stop_flag"]["state"] == "partial"
        del runner
        gc.collect()
        assert fd_async_copy_plugin.status()["features"]["stop_flag"]["state"] == "applied"
        del fresh
    finally:
        fd_async_copy_plugin.disable()
