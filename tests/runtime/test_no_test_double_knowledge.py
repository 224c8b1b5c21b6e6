"""Issue 21: the shipped runtime knows nothing of its test double, and says each thing once.

- the ring asks its backend what to do with a reused, still referenced slot (a capability), never
  whether the backend's name is ``sim``;
- the runtime has no process-global backend for the replica: the replica gets its backend on the
  testing side (``testing/reference/copy_backend.py``), the manager sets nothing;
- one thread-local "inside ``_get_prompt_logprobs_list``" flag for ``logprobs`` and ``sync_scope``,
  one blocking fallback in ``logprobs``, one list of backend names.
"""

from __future__ import annotations

import inspect

import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import config, runtime
from fd_async_copy_plugin.runtime import BufferInUseError, HostBackend, PinnedRing, SimulatedBackend


class RenamedSimulator(SimulatedBackend):
    name = "race-detector"


class HostWithAStrictPolicy(HostBackend):
    name = "sim"  # the name alone must change nothing

    def reused_while_referenced(self, message, buffers):
        raise AssertionError(f"strict: {message}")


def _reuse_a_referenced_slot(backend):
    ring = PinnedRing(backend, "r", {"x": "int64"}, {"x": 4}, slots=1)
    held = ring.acquire("w0", {"x": [4]}).buffers["x"]
    ring.is_free = lambda slot: True  # a planted reuse-policy bug: every slot looks free
    return held, ring.acquire("w1", {"x": [4]})


def test_the_ring_asks_the_backend_not_its_name():
    with pytest.raises(BufferInUseError, match="still referenced"):
        _reuse_a_referenced_slot(RenamedSimulator())
    with pytest.raises(AssertionError, match="strict: 'w1' is about to overwrite slot 0"):
        _reuse_a_referenced_slot(HostWithAStrictPolicy())
    held, slot = _reuse_a_referenced_slot(HostBackend())  # host: logged, the ring grows instead
    assert slot.buffers["x"] is not held


def test_the_runtime_has_no_process_global_backend_and_the_manager_sets_none():
    from fd_async_copy_plugin.testing.reference import copy_backend

    assert not hasattr(runtime, "current") and not hasattr(runtime, "use")
    fd_async_copy_plugin.disable()
    handed = SimulatedBackend()
    previous = copy_backend.use(handed)
    try:
        assert copy_backend.current() is handed
        fd_async_copy_plugin.enable(features=["logprobs"], backend="sim",
                                    root="fd_async_copy_plugin.testing.reference.fd24")
        plugin_backend = fd_async_copy_plugin._get_manager().backend
        assert plugin_backend is not handed and copy_backend.current() is plugin_backend  # enabled later
        fd_async_copy_plugin.disable()
        assert copy_backend.current() is handed
    finally:
        fd_async_copy_plugin.disable()
        copy_backend.use(previous)


def test_one_prompt_logprobs_flag_one_blocking_fallback_one_list_of_backends():
    from fd_async_copy_plugin.patches import logprobs, sync_scope

    target = "GPUModelRunner._get_prompt_logprobs_list"
    builders = [p.build for f in (*logprobs.FEATURES, *sync_scope.FEATURES) for p in f.patches
                if p.target.attr == target]
    assert [b.line for b in builders] == ["_get_prompt_logprobs_list"] * 2  # the line's one function
    assert inspect.getsource(logprobs).count(".blocking_d2h(") == 1
    assert "sim" not in config.BACKENDS  # the shipped list; the fake runtime comes from the testing package


def test_the_fake_runtime_is_found_through_the_entry_point_group_not_the_config():
    from importlib.metadata import entry_points

    from fd_async_copy_plugin.registry.manager import BACKEND_GROUP, backend_names, make_backend

    (sim,) = entry_points(group=BACKEND_GROUP, name="sim")
    assert sim.value.startswith("fd_async_copy_plugin.testing.")
    assert backend_names()[: len(config.BACKENDS)] == config.BACKENDS and "sim" in backend_names()
    assert isinstance(make_backend("sim"), SimulatedBackend)
    with pytest.raises(config.ConfigError, match="backend='nope' is not valid; allowed values: auto, cuda, host, sim"):
        fd_async_copy_plugin.enable(backend="nope")
