"""Issue 13 defect 6: the stop-flag registry must not keep runners (and their buffers) alive: FD's
test suite under the pytest plugin builds many runners in one process."""

from __future__ import annotations

import gc
import weakref

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, run_decode
from fd_async_copy_plugin.patches.runner import part

pytestmark = pytest.mark.usefixtures("plugin_off")


def test_thirty_runners_do_not_stay_alive_while_the_plugin_is_enabled(sfkit):
    module = sfkit.runner_module
    base = module.GPUModelRunner
    refs: list = []
    states: list = []

    class Tracked(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            refs.append(weakref.ref(self))
            states.append(weakref.ref(part(self, "stop")))

    config = DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16, hidden_size=8)
    fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend="host", root=sfkit.FD24)
    try:
        module.GPUModelRunner = Tracked
        try:
            for _ in range(30):
                run_decode(sfkit.FD24, config, [])
        finally:
            module.GPUModelRunner = base
        gc.collect()
        assert len(refs) == 30
        alive = [r for r in refs if r() is not None]
        assert not alive, f"{len(alive)} of 30 runners are still alive after their last use"
        assert not [s for s in states if s() is not None], "the runners' stop-flag states (and buffers) stay alive"
        registry = fd_async_copy_plugin._get_manager().applied["stop_flag"].ctx.state
        assert registry.parts() == []
        assert fd_async_copy_plugin.status()["features"]["stop_flag"]["state"] == "applied"
    finally:
        fd_async_copy_plugin.disable()
