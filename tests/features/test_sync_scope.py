"""Feature ``sync_scope`` (FastDeploy 2.5+): no device-wide synchronize for prompt logprobs, and a
``LogprobsTensors.slice_rows`` that reads only the rows asked for, never with a Paddle op on a
pinned field. FastDeploy 2.4 has neither flaw: there the feature reports ``native``.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import runtime
from fd_async_copy_plugin.testing.reference import copy_backend as replica_backend
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request
from fd_async_copy_plugin.runtime.backend import CopyBackend

FD24, FD25 = ROOTS["fd24"], ROOTS["fd25"]
VOCAB = 512
OUTPUT = "worker.output"
RUNNER = "worker.gpu_model_runner"


# ---- 2.4: native -------------------------------------------------------------------------------

def test_sync_scope_is_native_on_2_4_and_changes_nothing(plugin_off, lpkit):
    runner = lpkit.replica_module(FD24, RUNNER).GPUModelRunner
    tensors = lpkit.replica_module(FD24, OUTPUT).LogprobsTensors
    before = (runner.__dict__["_get_prompt_logprobs_list"], tensors.__dict__["slice_rows"])
    status = fd_async_copy_plugin.enable(features=["sync_scope"], backend="host", root=FD24)
    assert status["features"]["sync_scope"]["state"] == "native"
    assert (runner.__dict__["_get_prompt_logprobs_list"], tensors.__dict__["slice_rows"]) == before
    assert fd_async_copy_plugin._get_manager().applied == {}


# ---- 2.5: prompt logprobs without a device-wide synchronize ------------------------------------

def _prompt_workload(overlap: bool):
    # Chunked prefill without the overlap schedule. With it, whole prompts: in the simulator a
    # step whose requests are all mid-prefill ends with not_need_stop False, and the next insert's
    # set_stop(True) is overwritten when that copy lands (2.5 waits for it only at the deferred
    # save), so native 2.5 itself skips a step and returns uninitialised prompt-logprob rows.
    config = DriverConfig(max_num_seqs=4, vocab_size=VOCAB, enable_logprob=True, save_output_v1=True,
                          chunk_size=None if overlap else 4, overlap=overlap)
    spec = [(0, 11, 3, 5), (1, 6, -1, None), (2, 9, 0, -1)]
    requests = [
        Request(f"p{i}", [(5 * i + 3 * j) % (VOCAB - 3) + 3 for j in range(n)], max_tokens=4,
                eos_token_ids=[VOCAB + 1], logprobs=k, prompt_logprobs=pk)
        for i, n, pk, k in spec
    ]
    return config, requests


def _device_syncs(run) -> int:
    return sum(step.count("device_sync") for step in run.census.steps)


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("features", [("sync_scope",), ("logprobs", "sync_scope")], ids=["alone", "with_logprobs"])
@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_prompt_logprobs_need_no_device_wide_synchronize(overlap, features, backend, fd25_logprobs,
                                                         unpatched_run, lpkit):
    config, requests = _prompt_workload(overlap)
    native = unpatched_run(("sync_scope", overlap), FD25, config, requests)
    run = lpkit.run_replica(FD25, config, requests, features=features, backend=backend)
    assert all(run.states[name] == "applied" for name in features), run.states
    assert _device_syncs(native) > 0  # 2.5: once per prompt-logprob request per prefill chunk
    assert _device_syncs(run) == 0
    run.result.assert_same(native.result)
    assert sum(o.prompt_logprobs is not None for o in run.result.outputs.values()) == 3


def test_the_scoped_wait_is_what_lands_the_prompt_logprob_copies(fd25_logprobs, replace_build, unpatched_run, lpkit):
    """Planted: a scoped synchronize that waits for nothing. In the simulator the prompt logprobs
    copied out of 2.5's pinned buffers are then poison, and the outputs differ."""
    from fd_async_copy_plugin.patches import sync_scope as sync_scope_patch

    def build_without_wait(original, ctx):
        def _get_prompt_logprobs_list(self, hidden_states):
            saved = paddle.device.synchronize
            paddle.device.synchronize = lambda device=None: None
            try:
                return original(self, hidden_states)
            finally:
                paddle.device.synchronize = saved

        return _get_prompt_logprobs_list

    replace_build(sync_scope_patch.SyncScopeFeature, "GPUModelRunner._get_prompt_logprobs_list",
                  lambda attr: build_without_wait)
    config, requests = _prompt_workload(False)
    native = unpatched_run(("sync_scope", False), FD25, config, requests)
    run = lpkit.run_replica(FD25, config, requests, features=["sync_scope"], backend="sim")
    assert run.states["sync_scope"] == "applied"
    assert any("prompt_logprobs differ" in d for d in run.result.differences(native.result))


# ---- 2.5: slice_rows -----------------------------------------------------------------------------

ROWS, COLS = 6, 4


class ReadSpy:
    """Records every host read of a pinned buffer: (reader, start, end, elements read)."""

    def __init__(self, monkeypatch) -> None:
        self.reads: list = []
        original = CopyBackend.read
        spy = self

        def read(backend, buf, reader, start=None, end=None):
            out = original(backend, buf, reader, start, end)
            spy.reads.append((reader, start, end, int(out.size)))
            return out

        monkeypatch.setattr(CopyBackend, "read", read)

    def elements(self) -> int:
        return sum(r[3] for r in self.reads)


class PinnedOpSpy:
    """Records Paddle ops (indexing, ``.cpu()``, ``.clone()``) run on a pinned buffer."""

    def __init__(self, monkeypatch, backend) -> None:
        self.ops: list = []
        for name in ("__getitem__", "cpu", "clone", "tolist"):
            original = getattr(paddle.Tensor, name)

            def op(t, *args, _original=original, _name=name, **kwargs):
                if backend.is_pinned(t):
                    self.ops.append(_name)
                return _original(t, *args, **kwargs)

            monkeypatch.setattr(paddle.Tensor, name, op)


def _pinned_logprobs(backend, tensors_cls):
    """2.5's gather_logprobs output: pinned buffers filled by non-blocking copies, one copy set with
    its event."""
    rng = np.random.default_rng(5)
    sources = [
        paddle.to_tensor(rng.integers(0, VOCAB, size=(ROWS, COLS)), dtype="int64"),
        paddle.to_tensor(rng.standard_normal((ROWS, COLS)).astype("float32")),
        paddle.to_tensor(rng.integers(0, 50, size=(ROWS,)), dtype="int64"),
    ]
    fields = [backend.new_pinned(src.shape, str(src.dtype).replace("paddle.", ""), f"test.field{i}")
              for i, src in enumerate(sources)]
    backend.copy_d2h_many([(buf, src, f"test.copy{i}") for i, (buf, src) in enumerate(zip(fields, sources))],
                          "post_process_event")
    return tensors_cls(*fields), [s.numpy() for s in sources]


@pytest.fixture
def fd25_sync_scope(plugin_off, lpkit):
    lpkit.require_fd25_runner()
    output = lpkit.replica_module(FD25, OUTPUT)
    original = output.LogprobsTensors.slice_rows
    fd_async_copy_plugin.enable(features=["sync_scope"], backend="sim", root=FD25)
    assert fd_async_copy_plugin.status()["features"]["sync_scope"]["state"] == "applied"
    assert output.LogprobsTensors.slice_rows is not original
    yield output.LogprobsTensors, original, replica_backend.current()
    fd_async_copy_plugin.disable()
    assert output.LogprobsTensors.slice_rows is original


@pytest.mark.parametrize("start,end", [(0, 1), (2, 3), (5, 6), (1, 4), (0, ROWS)])
def test_slice_rows_reads_only_the_rows_asked_for(fd25_sync_scope, monkeypatch, start, end):
    tensors_cls, original, backend = fd25_sync_scope
    tensors, sources = _pinned_logprobs(backend, tensors_cls)
    reads = ReadSpy(monkeypatch)
    ops = PinnedOpSpy(monkeypatch, backend)
    with runtime.collecting() as census:
        census.begin_step()
        part = tensors.slice_rows(start, end)
    assert [(r[1], r[2]) for r in reads.reads] == [(start, end)] * 3
    assert reads.elements() == (end - start) * (2 * COLS + 1)
    assert ops.ops == []
    assert census.steps[0].count("op_on_pinned") == 0
    assert census.steps[0].count("event_wait") == 1  # waited on the copies' event first (sim)
    for got, want in zip(part, sources):
        assert not backend.is_pinned(got)
        assert np.array_equal(got.numpy(), want[start:end])


def test_native_2_5_slice_rows_copies_every_field_whole(fd25_sync_scope, monkeypatch):
    """The flaw the feature removes (and proof that the spy sees it): the original reads all rows."""
    tensors_cls, original, backend = fd25_sync_scope
    tensors, sources = _pinned_logprobs(backend, tensors_cls)
    backend.wait(backend.record("post_process_event"), "test")  # 2.5 waits before saving
    reads = ReadSpy(monkeypatch)
    part = original(tensors, 2, 3)
    assert reads.elements() == ROWS * (2 * COLS + 1)
    assert np.array_equal(part[0].numpy(), sources[0][2:3])


def test_pinned_op_spy_sees_paddle_ops_on_pinned_buffers(fd25_sync_scope, monkeypatch):
    tensors_cls, original, backend = fd25_sync_scope
    tensors, _ = _pinned_logprobs(backend, tensors_cls)
    backend.wait(backend.record("e"), "test")
    ops = PinnedOpSpy(monkeypatch, backend)
    tensors.logprobs[0:1]
    assert ops.ops == ["__getitem__"]


def test_slice_rows_of_host_tensors_matches_the_original(fd25_sync_scope):
    tensors_cls, original, backend = fd25_sync_scope
    rng = np.random.default_rng(9)
    tensors = tensors_cls(
        paddle.to_tensor(rng.integers(0, VOCAB, size=(ROWS, COLS)), dtype="int64"),
        paddle.to_tensor(rng.standard_normal((ROWS, COLS)).astype("float32")),
        paddle.to_tensor(rng.integers(0, 50, size=(ROWS,)), dtype="int64"),
    )
    for start, end in [(0, 1), (3, 5)]:
        got, want = tensors.slice_rows(start, end), original(tensors, start, end)
        assert type(got) is type(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("features", [("sync_scope",), ("logprobs", "sync_scope")], ids=["alone", "with_logprobs"])
def test_zmq_output_path_reads_each_row_once(features, fd25_logprobs, monkeypatch, lpkit):
    """``_build_stream_transfer_data`` slices once per batch row: O(B) rows read per step, not
    O(B^2) as with 2.5's whole-field copies."""
    batch, top_k, steps = 6, 3, 4
    config = DriverConfig(max_num_seqs=batch, vocab_size=VOCAB, enable_logprob=True, save_output_v1=True)
    requests = lpkit.logprob_requests(batch, top_k, steps, VOCAB)
    per_row = 2 * (top_k + 1) + 1
    reads = ReadSpy(monkeypatch)
    native = lpkit.run_replica(FD25, config, requests, backend="sim")
    native_elements = sum(r[3] for r in reads.reads if r[0].endswith("slice_rows"))
    reads.reads.clear()
    run = lpkit.run_replica(FD25, config, requests, features=features, backend="sim")
    assert all(run.states[name] == "applied" for name in features)
    run.result.assert_same(native.result)
    patched_elements = sum(r[3] for r in reads.reads if r[0].endswith("slice_rows"))
    tokens = steps * batch
    assert patched_elements == tokens * per_row
    assert native_elements == tokens * batch * per_row
    assert sum(step.count("op_on_pinned") for step in run.census.steps) == 0


def _strided_fields():
    """Host fields that are views with strides (issue 41): column-sliced, transposed, step-sliced."""
    base_ids = paddle.to_tensor(np.arange(12 * 8, dtype="int64").reshape(12, 8))
    base_lp = paddle.to_tensor((np.arange(8 * 12, dtype="float32") / 7).reshape(8, 12))
    base_rank = paddle.to_tensor(np.arange(24, dtype="int64") * 3)
    return {
        "column-sliced": base_ids[:ROWS, 2:2 + COLS],
        "transposed": base_lp.transpose([1, 0])[:ROWS, :COLS],
        "step-sliced": base_rank[::4],
    }


@pytest.mark.parametrize("start,end", [(0, 1), (2, 3), (1, 4), (0, ROWS)])
def test_slice_rows_of_strided_host_fields_gives_their_own_rows(fd25_sync_scope, start, end):
    tensors_cls, original, backend = fd25_sync_scope
    fields = _strided_fields()
    assert not any(f.is_contiguous() for f in fields.values())  # views with strides, as built
    tensors = tensors_cls(fields["column-sliced"], fields["transposed"], fields["step-sliced"])
    got, want = tensors.slice_rows(start, end), original(tensors, start, end)
    for name, a, b, field in zip(fields, got, want, fields.values()):
        assert np.array_equal(b.numpy(), field.numpy()[start:end])  # FD's own rows: the reference
        assert a.dtype == b.dtype and np.array_equal(a.numpy(), b.numpy()), name


def test_slice_rows_reads_strided_fields_through_the_pointer(fd25_sync_scope, monkeypatch):
    """The patched path ran: no Paddle op on the field (a Paddle op would move a pinned one)."""
    tensors_cls, original, backend = fd25_sync_scope
    fields = _strided_fields()
    tensors = tensors_cls(fields["column-sliced"], fields["transposed"], fields["step-sliced"])
    calls = []
    for name in ("__getitem__", "cpu", "numpy"):
        method = getattr(paddle.Tensor, name)

        def op(t, *args, _m=method, _n=name, **kwargs):
            if any(t is f for f in fields.values()):
                calls.append(_n)
            return _m(t, *args, **kwargs)

        monkeypatch.setattr(paddle.Tensor, name, op)
    tensors.slice_rows(1, 3)
    assert calls == []
