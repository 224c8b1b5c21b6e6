"""``cudaMemcpyBatchAsync`` in ``fdac_d2h_batch`` (issue 24): where the process's runtime has it (CUDA
12.8 and later) and the accessor probe's ``batch_api`` check passed, a step's copies go to the GPU as
one batch call instead of one ``cudaMemcpyAsync`` each; the record follows. CUDA 13's signature and
CUDA 12.8-12.9's (a ``failIdx`` before the stream) are told apart by the runtime's version. Runs the
real C code and the real ``CudaRuntime`` bindings over ``custom_ops/fake_cudart.cc`` compiled with each signature
(see test_copy_batch.py); the batch call on a GPU is checked by ``benchmarks/cuda_layer_check.py``."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import paddle
import pytest

from fd_async_copy_plugin.runtime import PinnedRing
from fd_async_copy_plugin.runtime.cuda import RuntimeBackend
from fd_async_copy_plugin.runtime.cudart import CudaError
from fd_async_copy_plugin.runtime.probe import PaddleProbeOps, _check_batch_api, probe_accessors

from test_copy_batch import CUSTOM_OPS, FIELDS, LABELS, Fake, _sources, issue, libs  # noqa: F401 (fixture)
from test_cuda_layer import STREAM, GpuLikeGlue


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """The fake runtime compiled with CUDA 13's and with CUDA 12.8's cudaMemcpyBatchAsync."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not found")
    out, built = tmp_path_factory.mktemp("batchapi"), {}
    for abi in (13, 12):
        built[abi] = out / f"libfake{abi}.so"
        subprocess.run([cxx, "-O1", "-shared", "-fPIC", f"-DFAKE_BATCH_ABI={abi}", "-o", str(built[abi]),
                        str(CUSTOM_OPS / "fake_cudart.cc")], check=True)
    return built


def _runtime(fakes, libs, tmp_path, abi, version=None):
    fake = Fake(str(fakes[abi]), tmp_path)
    if version is not None:
        fake.var("fake_runtime_version").value = version
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    return fake


def _three(n=(4, 0, 3)):
    src = [np.arange(k, dtype=np.int64) + 10 * i for i, k in enumerate(n)]
    dst = [np.zeros(max(1, k), dtype=np.int64) for k in n]
    return src, dst, [(d.ctypes.data, s.ctypes.data, s.nbytes) for d, s in zip(dst, src)]


@pytest.mark.parametrize("abi, version", [(13, 13000), (12, 12080), (12, 12090)])
def test_an_offered_batch_call_is_used_only_once_turned_on(fakes, libs, tmp_path, abi, version):
    fake = _runtime(fakes, libs, tmp_path, abi, version)
    batch = fake.rt.batch
    assert batch.batch_api[1] == abi and batch.batch_api_state.startswith(f"offered (CUDA {abi})")
    src, dst, copies = _three()
    issue(batch, *zip(*copies), STREAM, 42)  # offered, not checked: a copy each
    assert [e[0] for e in fake.log()] == ["copy", "copy", "record"] and fake.var("fake_batch_calls").value == 0
    batch.use_batch_api(True, "checked")
    assert batch.batch_api_state == "on: checked"
    start = len(fake.log())
    for d in dst:
        d[:] = 0
    issue(batch, *zip(*copies), STREAM, 43)
    log = fake.log()[start:]
    # one batch call of the two non-empty copies (the zero-byte one left out), then the record
    assert log == [("batch", 2, 0, 0, STREAM), ("copy", *copies[0], STREAM), ("copy", *copies[2], STREAM),
                   ("record", 43, 0, 0, STREAM)]
    fake.rt.event_synchronize(43)  # (the fake's copies land at a wait)
    assert [d.tolist() for d in dst] == [[0, 1, 2, 3], [0], [20, 21, 22]] and fake.var("fake_batch_calls").value == 1


def test_a_runtime_before_cuda_12_8_is_not_offered_the_batch_call(fakes, libs, tmp_path):
    fake = _runtime(fakes, libs, tmp_path, 12, version=12060)  # (the symbol is there; the version says no)
    assert fake.rt.batch.batch_api is None and fake.rt.batch.batch_api_state.startswith("not offered")
    (tmp_path / "none").mkdir()
    fake = Fake(libs[0], tmp_path / "none")  # a runtime without the symbol
    fake.rt.use_batch(ctypes.CDLL(libs[1]))
    assert fake.rt.batch.batch_api is None


@pytest.mark.parametrize("stream, sizes", [(0, (4, 3)), (1, (4, 3)), (STREAM, (4, 0))],
                         ids=["legacy stream 0", "cudaStreamLegacy", "one non-empty copy"])
def test_what_the_batch_call_refuses_or_cannot_gain_goes_a_copy_each(fakes, libs, tmp_path, stream, sizes):
    fake = _runtime(fakes, libs, tmp_path, 13)
    fake.rt.batch.use_batch_api(True, "checked")
    src, dst, copies = _three(sizes)
    issue(fake.rt.batch, *zip(*copies), stream, 5)
    assert "batch" not in [e[0] for e in fake.log()] and fake.var("fake_batch_calls").value == 0
    fake.rt.event_synchronize(5)
    assert dst[0].tolist() == [0, 1, 2, 3]


def test_a_failing_batch_call_raises_naming_it(fakes, libs, tmp_path):
    fake = _runtime(fakes, libs, tmp_path, 12, 12090)
    fake.rt.batch.use_batch_api(True, "checked")
    fake.var("fake_fail_batch").value = 1
    src, dst, copies = _three((4, 3, 2))
    with pytest.raises(CudaError, match="cudaMemcpyBatchAsync failed") as failure:
        issue(fake.rt.batch, *zip(*copies), STREAM, 5)
    assert failure.value.code == 700 and fake.log() == []  # no record after it


def test_a_ring_fill_issues_its_copies_in_one_batch_call(fakes, libs, tmp_path):
    fake = _runtime(fakes, libs, tmp_path, 13)
    fake.rt.batch.use_batch_api(True, "checked")
    backend = RuntimeBackend(fake.rt, glue=GpuLikeGlue(), probe=False)
    ring = PinnedRing(backend, "r", FIELDS, {"ids": 6, "lp": 6, "ranks": 2}, slots=1)
    for step in range(1, 4):
        src = _sources(step=step)
        start = len(fake.log())
        slot, event = ring.fill("w", src, LABELS, "s")
        assert [e[0] for e in fake.log()[start:]] == ["batch"] + ["copy"] * 3 + ["record"]
        backend.wait(event, "reader")
        assert [backend.read(slot.buffers[f], "reader").tolist() for f in FIELDS] == [t.numpy().tolist() for t in src.values()]
        del slot
    assert fake.var("fake_batch_calls").value == 3


@pytest.mark.parametrize("fault, state", [(None, "on: three copies in one call"),
                                          ("fake_batch_mode", "off: three copies in one call gave"),
                                          ("fake_fail_batch", "off: the call failed (CudaError")])
def test_the_probe_check_turns_the_batch_call_on_only_when_its_copies_land_right(fakes, libs, tmp_path, fault, state):
    fake = _runtime(fakes, libs, tmp_path, 13)
    if fault is not None:
        fake.var(fault).value = 1
    created, destroyed = [], []
    create, destroy = fake.rt.event_create, fake.rt.event_destroy
    fake.rt.event_create = lambda *a: created.append(create(*a)) or created[-1]
    fake.rt.event_destroy = lambda event: destroyed.append(event) or destroy(event)
    ok, detail = _check_batch_api(0, GpuLikeGlue(), fake.rt, PaddleProbeOps(paddle.CPUPlace()), None)
    batch = fake.rt.batch
    assert ok and batch.batch_api_state.startswith(state) and detail == f"cudaMemcpyBatchAsync {batch.batch_api_state}"
    assert len(created) == 1 and destroyed == created  # the check's event destroyed, also when the call failed
    assert fake.var("fake_batch_calls").value == 1
    src, dst, copies = _three((4, 3, 2))
    start = len(fake.log())
    issue(batch, *zip(*copies), STREAM, 5)  # used from then on only if it passed; off for good otherwise
    assert ("batch" in [e[0] for e in fake.log()[start:]]) is (fault is None)
    assert (batch.batch_api is not None) is (fault is None)


def test_the_accessor_probe_runs_the_check_only_where_the_call_is_offered(fakes, libs, tmp_path):
    fake = _runtime(fakes, libs, tmp_path, 13)
    result = probe_accessors(0, glue=GpuLikeGlue(), rt=fake.rt, ops=PaddleProbeOps(paddle.CPUPlace()))
    check = [c for c in result["checks"] if c["check"] == "batch_api"]
    assert check == [{"check": "batch_api", "ok": True, "detail": f"cudaMemcpyBatchAsync {fake.rt.batch.batch_api_state}"}]
    assert fake.rt.batch.batch_api_state.startswith("on: ")
    fake.rt.batch.use_batch_api(False, "turned off")  # decided off: not offered any more, not checked again
    result = probe_accessors(0, glue=GpuLikeGlue(), rt=fake.rt, ops=PaddleProbeOps(paddle.CPUPlace()))
    assert "batch_api" not in [c["check"] for c in result["checks"]]


def test_a_check_that_cannot_run_leaves_the_call_off_and_passes_the_probe(fakes, libs, tmp_path):
    class NoStream(GpuLikeGlue):
        def stream(self, device):
            raise RuntimeError("no stream here")

    fake = _runtime(fakes, libs, tmp_path, 13)
    ok, detail = _check_batch_api(0, NoStream(), fake.rt, PaddleProbeOps(paddle.CPUPlace()), None)
    assert ok and detail.startswith("cudaMemcpyBatchAsync off: the call failed (RuntimeError: no stream here)")
    assert fake.rt.batch.batch_api is None and fake.var("fake_batch_calls").value == 0
