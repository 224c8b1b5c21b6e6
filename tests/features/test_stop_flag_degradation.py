"""Feature ``stop_flag``: degradation when the custom ops cannot be used, and the batch limit.

Without loadable ops (not built, stale, an ABI mismatch) ``stop_flag`` is skipped with the
reason, its option ``sampled_tokens`` with it, and FastDeploy runs exactly
as unpatched - same outputs, same host interactions step by step. ``strict=True`` turns the skip
into an exception. ``max_num_seqs`` above the kernels' one-block limit (1024) is a clear error,
never a silently wrong stop flag.
"""

from __future__ import annotations

import functools

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request
from fd_async_copy_plugin.ops import OpsUnavailable
from fd_async_copy_plugin.patches.fd24 import stop_flag as stop_flag_patch
from fd_async_copy_plugin.registry.manager import StrictModeError
from fd_async_copy_plugin.patches.runner import part

pytestmark = pytest.mark.usefixtures("plugin_off")


def _no_ops_by_monkeypatch(monkeypatch, tmp_path) -> str:
    def load_stop_flag_ops():
        raise OpsUnavailable("planted: the ops are not built")

    monkeypatch.setattr(stop_flag_patch, "load_stop_flag_ops", load_stop_flag_ops)
    return "planted: the ops are not built"


def _no_ops_by_empty_ops_dir(monkeypatch, tmp_path) -> str:
    monkeypatch.setenv("FD_ASYNC_COPY_OPS_DIR", str(tmp_path))
    return "fd-async-copy build-ops"  # what the reason tells the user to run


NO_OPS = {"load_ops_fails": _no_ops_by_monkeypatch, "empty_ops_dir": _no_ops_by_empty_ops_dir}


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("how", NO_OPS)
def test_without_ops_both_features_are_skipped_and_fd_runs_unpatched(sfkit, monkeypatch, tmp_path, how, backend):
    config, requests, arrivals = sfkit.mixed()
    base = sfkit.baseline("mixed", config, requests, arrivals)
    reason = NO_OPS[how](monkeypatch, tmp_path)
    originals = {n: getattr(sfkit.postproc, n) for n in ("update_inputs_v1", "save_output", "post_process")}

    def probe(runner, record, event):
        record.append(sorted(k for k in runner.share_inputs if k.startswith(("not_need_stop", "sampled"))))

    run = sfkit.run(config, requests, arrivals=arrivals, backend=backend, features=sfkit.FEATURES, probe=probe)
    assert run.states == {"stop_flag": "skipped", "sampled_tokens": "skipped"}
    assert "custom ops unavailable" in run.reasons["stop_flag"] and reason in run.reasons["stop_flag"]
    assert "stop_flag" in run.reasons["sampled_tokens"]
    run.result.assert_same(base.result)
    assert [s.events for s in run.census.steps] == [s.events for s in base.census.steps]
    assert set(map(tuple, run.probe)) == {("not_need_stop",)}
    assert sfkit.state(run.runner) is None
    assert {n: getattr(sfkit.postproc, n) for n in originals} == originals


def test_status_names_the_reasons_without_ops(sfkit, monkeypatch, tmp_path):
    _no_ops_by_monkeypatch(monkeypatch, tmp_path)
    features = fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend="host", root=sfkit.FD24)["features"]
    assert features["stop_flag"] == {"state": "skipped",
                                      "reason": "custom ops unavailable: planted: the ops are not built"}
    assert features["sampled_tokens"]["state"] == "skipped"
    assert features["sampled_tokens"]["reason"] == (
        "needs stop_flag, which is skipped: custom ops unavailable: planted: the ops are not built")


@pytest.mark.parametrize("how", NO_OPS)
def test_strict_turns_the_skip_into_an_exception_and_leaves_fd_unpatched(sfkit, monkeypatch, tmp_path, how):
    reason = NO_OPS[how](monkeypatch, tmp_path)
    originals = {n: getattr(sfkit.postproc, n) for n in ("update_inputs_v1", "save_output", "post_process")}
    with pytest.raises(StrictModeError, match=r"stop_flag: skipped \(custom ops unavailable") as error:
        fd_async_copy_plugin.enable(features=list(sfkit.FEATURES), backend="host", root=sfkit.FD24, strict=True)
    assert reason in str(error.value)
    assert fd_async_copy_plugin.status()["enabled"] is False
    assert {n: getattr(sfkit.postproc, n) for n in originals} == originals


def test_fd_async_copy_strict_env_turns_the_skip_into_an_exception_at_the_entry_point(sfkit, monkeypatch, tmp_path):
    """``register()`` (FastDeploy's plugin hook) reads FD_ASYNC_COPY_STRICT; it is pointed at the
    replica instead of ``fastdeploy`` by binding ``root`` on the ``enable`` it calls."""
    _no_ops_by_monkeypatch(monkeypatch, tmp_path)
    monkeypatch.setattr(fd_async_copy_plugin, "enable",
                        functools.partial(fd_async_copy_plugin.enable, root=sfkit.FD24))
    for name, value in (("FD_ASYNC_COPY", "1"), ("FD_ASYNC_COPY_FEATURES", "stop_flag,sampled_tokens"),
                        ("FD_ASYNC_COPY_BACKEND", "host")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FD_ASYNC_COPY_STRICT", "0")
    fd_async_copy_plugin.register()
    assert {n: s["state"] for n, s in fd_async_copy_plugin.status()["features"].items()} == {
        "stop_flag": "skipped", "sampled_tokens": "skipped"}
    fd_async_copy_plugin.disable()

    monkeypatch.setenv("FD_ASYNC_COPY_STRICT", "1")
    with pytest.raises(StrictModeError, match="planted: the ops are not built"):
        fd_async_copy_plugin.register()
    assert fd_async_copy_plugin.status()["enabled"] is False


# ---- max_num_seqs above the kernels' one-block limit ---------------------------------------------


def _over_limit():
    config = DriverConfig(max_num_seqs=1025, vocab_size=64, max_model_len=16, hidden_size=8, save_output_v1=True)
    return config, [Request("a", [3, 4], max_tokens=2, eos_token_ids=[2])]


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_max_num_seqs_over_1024_stands_down_with_a_clear_reason_never_a_silent_decode(sfkit, backend):
    """Above the kernels' limit the runner keeps FastDeploy's own path (the replica's 2.4 op, like
    FastDeploy's, has the same limit): status() says why, and none of our kernels decodes."""
    config, requests = _over_limit()
    with sfkit.enabled_runner(config, backend=backend) as runner:
        entry = fd_async_copy_plugin.status()["features"]
        assert entry["stop_flag"]["state"] == "passthrough"  # applied, the wrappers pass through
        assert "max_num_seqs=1025 exceeds 1024" in entry["stop_flag"]["reason"]
        assert "lower max_num_seqs" in entry["stop_flag"]["reason"]
        assert entry["sampled_tokens"]["state"] == "passthrough"
        assert "not_need_stop_device" not in runner.share_inputs  # no state: every wrapper passes through
    with pytest.raises(Exception) as unpatched:
        sfkit.run(config, requests, backend=backend)
    with pytest.raises(Exception) as patched:
        sfkit.run(config, requests, backend=backend, features=sfkit.FEATURES)
    assert type(patched.value) is type(unpatched.value) and str(patched.value) == str(unpatched.value)


def test_max_num_seqs_over_1024_fails_at_runner_construction_in_strict_mode(sfkit):
    config, _ = _over_limit()
    with pytest.raises(ValueError, match=r"max_num_seqs=1025 exceeds 1024"):
        with sfkit.enabled_runner(config, strict=True):
            pass


def test_backend_that_cannot_reach_fastdeploys_buffers_stands_down(sfkit, monkeypatch):
    """``cuda`` on CPU buffers (or ``host`` on GPU buffers) would crash in the update op mid-decode:
    the runner keeps FastDeploy's own path instead, and status() says which backend to use."""
    from fd_async_copy_plugin import runtime

    class CudaNamedHost(runtime.HostBackend):
        name = "cuda"  # what the feature sees; the buffers of the replica are CPU tensors

    real = runtime.make_backend
    monkeypatch.setattr(runtime, "make_backend", lambda name: CudaNamedHost() if name == "cuda" else real(name))
    from fd_async_copy_plugin.ops import load_ops

    ops = load_ops()
    if not ops.has_cuda_kernels:
        pytest.skip(f"the CUDA kernel library is not built here: {ops.cuda_why}")
    config = DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16, hidden_size=8)
    with sfkit.enabled_runner(config, backend="cuda") as runner:
        entry = fd_async_copy_plugin.status()["features"]["stop_flag"]
        assert entry["state"] == "passthrough"
        assert "FD_ASYNC_COPY_BACKEND=host" in entry["reason"]
        assert "not_need_stop_device" not in runner.share_inputs
    with pytest.raises(ValueError, match="cannot update FastDeploy's CPU buffers"):
        with sfkit.enabled_runner(config, backend="cuda", strict=True):
            pass


def test_disable_hands_live_runners_back_to_fastdeploys_own_path(sfkit):
    """After disable() a runner that was patched runs FastDeploy 2.4's path with a current flag and
    without the plugin's keys (FD's reset would otherwise fill_() the pinned buffers)."""
    config = DriverConfig(max_num_seqs=4, vocab_size=64, max_model_len=16, hidden_size=8)
    with sfkit.enabled_runner(config) as runner:
        assert "not_need_stop_pinned" in runner.share_inputs
    for key in ("not_need_stop_device", "not_need_stop_gpu", "not_need_stop_pinned", "sampled_token_ids"):
        assert key not in runner.share_inputs, key
    assert part(runner, "stop") is None
    runner.reset_share_inputs()  # FastDeploy's own reset, on a clean dict
    assert bool(runner.not_need_stop()) is False


def test_cuda_probe_reports_a_kernel_that_cannot_run_instead_of_failing_mid_decode():
    """Runner construction launches the kernel once; a failure becomes a stand-down reason."""
    import paddle

    from fd_async_copy_plugin.patches.fd24.stop_flag import probe_cuda_kernels

    class Broken:
        def update_inputs_v1_cuda(self, *args):
            raise RuntimeError("no kernel image is available for execution on the device")

    class Works:
        def __init__(self):
            self.calls = []

        def update_inputs_v1_cuda(self, *args):
            self.calls.append(args)

    reason = probe_cuda_kernels(Broken(), paddle.CPUPlace())
    assert "cannot run here" in reason and "no kernel image" in reason and "FD_ASYNC_COPY_CUDA_ARCHS" in reason
    works = Works()
    assert probe_cuda_kernels(works, paddle.CPUPlace()) == ""
    (args,) = works.calls
    assert len(args) == 15 and args[-2:] == (1, False)  # FD 2.4's 13 tensors + block_size + one-step-stop
