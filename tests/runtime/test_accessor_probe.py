"""The accessor probe's logic on CPU Paddle: agreeing accessors pass, each planted disagreement
fails its check and stands the feature down (the backend refuses, the reason is reported)."""

from __future__ import annotations


import paddle
import pytest

from fd_async_copy_plugin.runtime.cuda import AccessorProbeError, RuntimeBackend
from fd_async_copy_plugin.runtime.cudart import HostRuntime
from fd_async_copy_plugin.runtime.glue import PaddleGlue
from fd_async_copy_plugin.runtime.probe import PaddleProbeOps, probe_accessors



class CpuAsGpuGlue(PaddleGlue):
    """CPU tensors presented as gpu:0 tensors; the host wrap stays a host tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.wraps: set[int] = set()

    def gpu_device(self, t):
        return None if id(t) in self.wraps else 0

    def wrap(self, array):
        t = super().wrap(array)
        self.wraps.add(id(t))
        return t

    def current_device(self):
        return 0

    def stream(self, device):
        return 0


class WrongAddress(CpuAsGpuGlue):
    def address(self, t):
        return super().address(t) + (8 if id(t) not in self.wraps else 0)


class CopyingWrap(CpuAsGpuGlue):
    def wrap(self, array):
        return super().wrap(array.copy())  # not zero-copy


class OtherDevice(CpuAsGpuGlue):
    def current_device(self):
        return 1


class ClaimsContiguous(CpuAsGpuGlue):
    """is_contiguous() True for a strided view too: a copy by address would read it flat."""

    def is_contiguous(self, t):
        return True


class ClaimsStrided(CpuAsGpuGlue):
    def is_contiguous(self, t):
        return False


class MaterializingOps(PaddleProbeOps):
    """A framework whose transpose makes a new dense tensor (no stride kernels): it reports
    contiguous and is dense at its address, which is all a copy by address needs."""

    def transposed(self, t):
        return t.transpose([1, 0]).contiguous()


class StaleStream(CpuAsGpuGlue):
    """Paddle's fill lands only after the copy: what a wrong stream handle looks like."""


class LateFillOps(PaddleProbeOps):
    def fill(self, t, value):
        self.pending = (t, value)  # "still queued" when the layer copies

    def synchronize(self, device):
        pending = getattr(self, "pending", None)
        if pending is not None:
            pending[0].fill_(pending[1])
            self.pending = None


@pytest.fixture(scope="module")
def host_kernels(host_stop_flag_library):
    return host_stop_flag_library


def run(glue, ops=None, kernels=None):
    return probe_accessors(0, glue=glue, rt=HostRuntime(), ops=ops or PaddleProbeOps(paddle.CPUPlace()), kernels=kernels)


def failed(result):
    return [c["check"] for c in result["checks"] if not c["ok"]]


def test_agreeing_accessors_pass_every_check(host_kernels):
    result = run(CpuAsGpuGlue(), kernels=host_kernels)
    assert result["ok"], result
    assert [c["check"] for c in result["checks"]] == [
        "current_device", "data_ptr", "contiguous", "stream_order", "pinned_wrap", "kernel_order"]
    (contiguous,) = [c for c in result["checks"] if c["check"] == "contiguous"]
    assert "its transposed view not" in contiguous["detail"]  # CPU Paddle 3.3 makes a strided view


def test_a_transpose_that_is_dense_and_reports_contiguous_passes():
    result = run(CpuAsGpuGlue(), ops=MaterializingOps(paddle.CPUPlace()))
    (contiguous,) = [c for c in result["checks"] if c["check"] == "contiguous"]
    assert contiguous["ok"] and "copying it by address gives its values: True" in contiguous["detail"], contiguous


@pytest.mark.parametrize(
    "glue, ops, check",
    [
        (WrongAddress, None, "data_ptr"),
        (CopyingWrap, None, "pinned_wrap"),
        (OtherDevice, None, "current_device"),
        (ClaimsContiguous, None, "contiguous"),
        (ClaimsStrided, None, "contiguous"),
        (StaleStream, LateFillOps, "stream_order"),
    ],
)
def test_a_planted_disagreement_fails_its_check(glue, ops, check):
    result = run(glue(), ops=ops(paddle.CPUPlace()) if ops else None)
    assert not result["ok"] and check in failed(result)
    assert result["reason"].startswith("Paddle's accessors disagree with the CUDA layer") and check in result["reason"]


def test_a_late_kernel_input_fails_kernel_order(host_kernels):
    result = run(StaleStream(), ops=LateFillOps(paddle.CPUPlace()), kernels=host_kernels)
    assert "kernel_order" in failed(result)


def test_a_failed_probe_stands_the_backend_down_for_that_device():
    cpu_ops = PaddleProbeOps(paddle.CPUPlace())
    backend = RuntimeBackend(HostRuntime(), glue=WrongAddress(), probe=True, probe_ops=cpu_ops)
    reason = backend.unusable_for(paddle.arange(4, dtype="int64"))
    assert "data_ptr" in reason
    buf = backend.new_pinned([4], "int64", "b")
    with pytest.raises(AccessorProbeError, match="data_ptr"):
        backend.copy_d2h(buf, paddle.arange(4, dtype="int64"), "w")
    assert backend.probes[0]["ok"] is False
    good = RuntimeBackend(HostRuntime(), glue=CpuAsGpuGlue(), probe=True, probe_ops=cpu_ops)
    assert good.unusable_for(paddle.arange(4, dtype="int64")) == ""
    assert good.probes[0]["ok"] is True


def test_a_failed_probe_stands_the_logprobs_feature_down_to_blocking_copies():
    from fd_async_copy_plugin.patches.logprobs import LogprobsCopier
    from fd_async_copy_plugin.testing.reference.fd24.worker.output import LogprobsTensors

    reasons = []
    backend = RuntimeBackend(HostRuntime(), glue=WrongAddress(), probe=True, probe_ops=PaddleProbeOps(paddle.CPUPlace()))
    copier = LogprobsCopier(backend, LogprobsTensors, stand_down=reasons.append)
    ids = paddle.arange(6, dtype="int64").reshape([2, 3])
    lps = paddle.arange(6, dtype="float32").reshape([2, 3])
    ranks = paddle.arange(2, dtype="int64")
    result = copier.copy(object(), ids, lps, ranks)
    assert len(reasons) == 1 and "data_ptr" in reasons[0]
    assert type(result) is LogprobsTensors and not copier.rings  # FastDeploy's blocking way, no pinned ring
    assert result.logprob_token_ids.numpy().tolist() == ids.numpy().tolist()
    copier.copy(object(), ids, lps, ranks)
    assert len(reasons) == 1  # reported once
    good = LogprobsCopier(RuntimeBackend(HostRuntime(), glue=CpuAsGpuGlue(), probe=True,
                                         probe_ops=PaddleProbeOps(paddle.CPUPlace())), LogprobsTensors,
                          stand_down=reasons.append)
    assert type(good.copy(object(), ids, lps, ranks)) is good.AsyncLogprobsTensors and len(reasons) == 1


def test_a_failed_probe_stands_the_stop_flag_runner_down_with_the_reason():
    """``stop_flag`` probes the accessors at runner construction (with the kernels): a failure is the
    reason the runner keeps FastDeploy's path; agreeing accessors (or a backend without a probe) pass."""
    from fd_async_copy_plugin.patches.fd24.stop_flag import probe_accessors as stop_flag_probe

    class Place:
        def gpu_device_id(self):
            return 0

    class Ops:
        cuda_library = None  # no kernels on CPU: the accessor checks only

    cpu_ops = PaddleProbeOps(paddle.CPUPlace())
    bad = RuntimeBackend(HostRuntime(), glue=WrongAddress(), probe=True, probe_ops=cpu_ops)
    assert "data_ptr" in stop_flag_probe(bad, Ops(), Place())
    good = RuntimeBackend(HostRuntime(), glue=CpuAsGpuGlue(), probe=True, probe_ops=cpu_ops)
    assert stop_flag_probe(good, Ops(), Place()) == ""
    assert stop_flag_probe(object(), Ops(), Place()) == ""  # host/sim: nothing to probe


def test_a_failed_probe_in_strict_mode_refuses_the_async_logprobs():
    from fd_async_copy_plugin.patches.logprobs import LogprobsCopier
    from fd_async_copy_plugin.testing.reference.fd24.worker.output import LogprobsTensors

    backend = RuntimeBackend(HostRuntime(), glue=WrongAddress(), probe=True, probe_ops=PaddleProbeOps(paddle.CPUPlace()))
    copier = LogprobsCopier(backend, LogprobsTensors, strict=True)
    ids = paddle.arange(6, dtype="int64").reshape([2, 3])
    with pytest.raises(RuntimeError, match="data_ptr"):
        copier.copy(object(), ids, ids.astype("float32"), paddle.arange(2, dtype="int64"))


@pytest.mark.usefixtures("plugin_off")
def test_through_enable_a_failed_probe_reports_logprobs_passthrough_and_fastdeploy_outputs_stay_exact(monkeypatch):
    """The whole path on the fd24 replica: the backend's probe fails on the first logprobs copy,
    the feature stands down (``status()``: passthrough with the reason, ``accessor_probe`` holds the
    failed check) and FastDeploy's outputs equal the unpatched run's."""
    import fd_async_copy_plugin as plugin
    from fd_async_copy_plugin import runtime
    from fd_async_copy_plugin.testing.reference import ROOTS
    from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request, run_decode

    config = DriverConfig(max_num_seqs=2, vocab_size=64, max_model_len=32, enable_logprob=True)
    requests = [Request(f"r{i}", [3 + i, 4], max_tokens=4, eos_token_ids=[300], logprobs=2) for i in range(2)]
    reference = run_decode(ROOTS["fd24"], config, requests)

    class FailingProbeBackend(RuntimeBackend):
        name = "host"

    made = []

    def make_backend(name):
        made.append(FailingProbeBackend(HostRuntime(), glue=WrongAddress(), probe=True,
                                        probe_ops=PaddleProbeOps(paddle.CPUPlace())))
        return made[-1]

    monkeypatch.setattr(runtime, "make_backend", make_backend)
    plugin.enable(features=("logprobs",), backend="host", root=ROOTS["fd24"])
    try:
        assert plugin.status()["features"]["logprobs"]["state"] == "applied"
        result = run_decode(ROOTS["fd24"], config, requests)
        status = plugin.status()
    finally:
        plugin.disable()
    assert made, "the failing backend was not used"
    assert status["features"]["logprobs"]["state"] == "passthrough"
    assert "data_ptr" in status["features"]["logprobs"]["reason"]
    assert status["accessor_probe"]["0"]["ok"] is False
    assert result.differences(reference) == []
