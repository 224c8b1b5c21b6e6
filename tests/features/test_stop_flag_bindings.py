"""Feature ``stop_flag``: every ``from ... import`` binding FastDeploy calls through is patched.

FastDeploy 2.4 binds the update and save ops into ``pre_and_post_process`` with ``from .ops.gpu
import ...``, and every runner binds ``post_process`` with ``from ..model_executor.pre_and_post_process
import post_process`` (``gpu_model_runner``, and the Metax and GCU runners). Patching one module's
name leaves the others calling the 2.4 function, so each binding is checked: replaced by a wrapper
of the exact original while enabled, the exact original again after ``disable()`` - also for a
runner module imported only after ``enable()``.
"""

from __future__ import annotations

import importlib
import sys

import pytest

import fd_async_copy_plugin

pytestmark = pytest.mark.usefixtures("plugin_off")

POSTPROC_NAMES = ("update_inputs_v1", "update_inputs", "save_output", "save_output_topk",
                  "_build_stream_transfer_data", "post_process")
RUNNER_METHODS = ("_init_share_inputs", "reset_share_inputs", "insert_tasks_v1", "insert_prefill_inputs",
                  "not_need_stop")
OTHER_RUNNERS = ("worker.metax_model_runner", "worker.gcu_model_runner")


def _bindings(sfkit) -> dict:
    postproc, runner = sfkit.postproc, sfkit.runner_module
    found = {f"pre_and_post_process.{n}": getattr(postproc, n) for n in POSTPROC_NAMES}
    found["gpu_model_runner.post_process"] = runner.post_process
    for name in OTHER_RUNNERS:
        found[f"{name}.post_process"] = sfkit.module(name).post_process
    for name in RUNNER_METHODS:
        found[f"GPUModelRunner.{name}"] = vars(runner.GPUModelRunner)[name]
    return found


def _unwrapped(fn):
    return getattr(fn, "__wrapped__", None)


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_every_binding_is_patched_and_restored(sfkit, backend):
    for name in OTHER_RUNNERS:  # imported before enable()
        sfkit.module(name)
    originals = _bindings(sfkit)
    # the runners' bindings are FastDeploy's one function, and the ops come from ops.gpu
    assert originals["gpu_model_runner.post_process"] is originals["pre_and_post_process.post_process"]
    for name in ("update_inputs_v1", "update_inputs", "save_output", "save_output_topk"):
        assert originals[f"pre_and_post_process.{name}"] is getattr(sfkit.ops_gpu, name)

    status = fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend=backend, root=sfkit.FD24)
    assert {n: s["state"] for n, s in status["features"].items()} == {"stop_flag": "applied",
                                                                      "sampled_tokens": "applied"}
    patched = _bindings(sfkit)
    for key, original in originals.items():
        assert patched[key] is not original, f"{key} still FastDeploy's"
        assert _unwrapped(patched[key]) is original, f"{key} does not wrap FastDeploy's function"

    fd_async_copy_plugin.disable()
    restored = _bindings(sfkit)
    assert {k: v is originals[k] for k, v in restored.items()} == {k: True for k in originals}


@pytest.mark.parametrize("name", OTHER_RUNNERS)
def test_runner_imported_after_enable_binds_the_patched_post_process_and_is_restored(sfkit, monkeypatch, name):
    module_name = f"{sfkit.FD24}.{name}"
    sfkit.postproc  # the post-processing module itself is imported (the feature applies now)
    original = sfkit.postproc.post_process
    monkeypatch.delitem(sys.modules, module_name, raising=False)

    fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend="host", root=sfkit.FD24)
    late = importlib.import_module(module_name)
    assert late.post_process is sfkit.postproc.post_process is not original
    assert _unwrapped(late.post_process) is original

    fd_async_copy_plugin.disable()
    assert late.post_process is original


def test_runner_post_process_binding_refreshes_the_flag_after_post_processing(sfkit):
    """On the ZMQ path no save op reads the flag: only the wrapper around the runner's
    ``post_process`` binding applies the step's flag copy before ``execute_model`` returns."""
    config, requests, arrivals = sfkit.mixed(save_output_v1=True)

    def probe(runner, record, event):
        if event == "execute":
            record.append(sfkit.state(runner).flag_pending)

    run = sfkit.run(config, requests, arrivals=arrivals, features=sfkit.FEATURES, backend="sim", probe=probe)
    assert run.probe and not any(run.probe), "a flag copy was left pending after execute_model"
