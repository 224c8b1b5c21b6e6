"""The pooling path (``post_process_pooling``) keeps every stop flag consistent.

FastDeploy 2.4's pooling branch calls ``update_inputs_v1`` with the host ``not_need_stop`` and saves
nothing: with the plugin the device-flag op runs instead, and the flag must still be current (and
agree across the legacy, device and pinned copies) as soon as ``post_process`` returns.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

ROOT = ROOTS["fd24"]
FEATURES = ["stop_flag", "sampled_tokens"]


def pooling_snapshots(backend: str, plugin: bool, pool_at_step: int) -> list:
    """Run a short decode; at ``pool_at_step`` run one pooling post-process on the live runner."""
    post = importlib.import_module(f"{ROOT}.model_executor.pre_and_post_process")
    pooler = importlib.import_module(f"{ROOT}.output.pooler")
    snapshots = []

    def on_step(step, runner):
        if step != pool_at_step:
            return
        si = runner.share_inputs
        post.post_process(
            pooler.PoolerOutput(outputs=[None] * runner.scheduler_config.max_num_seqs),
            runner._build_model_output_data(None),
            si,
            block_size=runner.cache_config.block_size,
            skip_save_output=True,
        )
        snap = {k: np.array(si[k].numpy(), copy=True) for k in ("not_need_stop", "stop_flags", "seq_lens_this_time",
                                                                 "seq_lens_decoder", "seq_lens_encoder")}
        snap["not_need_stop()"] = bool(runner.not_need_stop())
        if plugin:
            backend_ = replica_backend.current()
            snap["device"] = bool(si["not_need_stop_device"].numpy()[0])
            snap["pinned"] = bool(backend_.read(si["not_need_stop_pinned"], "test")[0])
        snapshots.append(snap)

    fd_async_copy_plugin.disable()
    previous = None
    try:
        if plugin:
            fd_async_copy_plugin.enable(features=FEATURES, backend=backend, root=ROOT)
        else:
            previous = replica_backend.use(runtime.make_backend(backend))
        config = DriverConfig(max_num_seqs=4, vocab_size=256, max_model_len=64, hidden_size=16)
        requests = [Request(f"r{i}", [5 + i, 7, 9], max_tokens=6, eos_token_ids=[2]) for i in range(3)]
        run_decode(ROOT, config, requests, max_steps=12, on_step=on_step)
    finally:
        fd_async_copy_plugin.disable()
        if previous is not None:
            replica_backend.use(previous)
    assert snapshots, "the pooling post-process did not run"
    return snapshots


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_pooling_post_process_leaves_flags_consistent_and_equal_to_unpatched(backend):
    unpatched = pooling_snapshots(backend, plugin=False, pool_at_step=2)[0]
    patched = pooling_snapshots(backend, plugin=True, pool_at_step=2)[0]
    for key in ("not_need_stop", "stop_flags", "seq_lens_this_time", "seq_lens_decoder", "seq_lens_encoder"):
        np.testing.assert_array_equal(patched[key], unpatched[key], err_msg=key)
    assert patched["not_need_stop()"] == unpatched["not_need_stop()"] == bool(unpatched["not_need_stop"][0])
    assert patched["device"] == patched["pinned"] == bool(patched["not_need_stop"][0])
