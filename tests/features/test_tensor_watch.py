"""``step_syncs``' watch on FastDeploy's ``share_inputs``: scoped to one FastDeploy call and its
thread, Paddle's tensor class untouched, and a write the watch did not see never leaves a stale
shadow (real CPU Paddle; the fd24/fd25 replicas for the end-to-end runs)."""

from __future__ import annotations

import collections
import threading

import numpy as np
import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.patches import _tensor_watch, step_syncs
from fd_async_copy_plugin.patches._tensor_watch import ScopedInputs, StandIn, Watched, watching
from fd_async_copy_plugin.registry.patch import JUNCTION_MARK, Junction
from fd_async_copy_plugin.testing.reference import ROOTS
from test_step_syncs import config, run_pair, workload

pytestmark = pytest.mark.usefixtures("plugin_off")

METHODS = ("__setitem__", "__getitem__", "numpy")


class _Recorder(Watched):
    """Records what reached it; answers ``numpy()`` with -7s; lets Paddle make the writes."""

    def __init__(self, tensor) -> None:
        super().__init__(tensor)
        self.calls = []

    def setitem(self, key, value):
        self.calls.append(("setitem", threading.get_ident()))
        return NotImplemented

    def numpy(self):
        self.calls.append(("numpy", threading.get_ident()))
        return np.full(self.tensor.shape, -7, dtype="int64")

    def unseen(self):
        self.calls.append(("unseen", threading.get_ident()))


class _Runner:
    def __init__(self) -> None:
        self.share_inputs = {"a": paddle.to_tensor(np.arange(4, dtype="int64")),
                             "b": paddle.to_tensor(np.arange(4, dtype="int64"))}
        self.seq_lens_this_time_buffer = paddle.to_tensor(np.zeros(4, dtype="int32"))


def test_the_watch_is_one_calls_share_inputs_on_its_thread_only():
    runner = _Runner()
    real, a, b = runner.share_inputs, runner.share_inputs["a"], runner.share_inputs["b"]
    recorder = _Recorder(a)
    me = threading.get_ident()
    other = {}

    def second_thread():  # another thread reading runner.share_inputs while the call runs
        got = runner.share_inputs["a"]
        other["type"] = type(got)
        got[1] = 41  # Paddle's own write, on the real tensor
        other["numpy"] = runner.share_inputs["a"].numpy().tolist()

    with watching([recorder], runner=runner):
        si = runner.share_inputs
        assert isinstance(si, ScopedInputs) and "a" in si and len(si) == 2
        assert type(si["a"]) is StandIn and si["b"] is b and si.get("b") is b  # only the watched key
        si["a"][0] = 10  # FastDeploy's write: through the handler
        assert si["a"].numpy().tolist() == [-7] * 4  # the handler answers the read
        assert si["a"].shape == [4] and si["a"][0].numpy().tolist() == 10  # the rest is the tensor's
        worker = threading.Thread(target=second_thread)
        worker.start()
        worker.join(10)
        si["a"][2] = 12  # the other thread's write is found first: unseen, then this write
        si["c"] = si["a"]  # a stand-in stored into share_inputs stores the tensor
    assert not worker.is_alive()
    assert other == {"type": paddle.Tensor, "numpy": [10, 41, 2, 3]}
    assert recorder.calls == [("setitem", me), ("numpy", me), ("unseen", me), ("setitem", me)]
    assert runner.share_inputs is real and real["c"] is a  # the runner holds FastDeploy's own again
    assert a.numpy().tolist() == [10, 41, 12, 3]
    # a reference kept past the call is FastDeploy's object in all but identity
    assert si["a"] is a and si.get("a") is a and a.numpy().tolist() == [10, 41, 12, 3]


def test_an_unseen_write_through_an_earlier_reference_is_told_at_the_end():
    runner = _Runner()
    alias = runner.share_inputs["a"]  # FastDeploy holds it from before the call
    recorder = _Recorder(alias)
    with watching([recorder], runner=runner):
        alias[3] = 5  # never passes the watch
    assert recorder.calls == [("unseen", threading.get_ident())]


def test_an_unseen_write_is_told_once_however_many_reads_follow_it():
    """The read that finds the missed write takes the tensor's version as seen: later reads and the
    end of the call do not report the same write again (each report is a counted fallback)."""
    runner = _Runner()
    alias = runner.share_inputs["a"]
    recorder = _Recorder(alias)
    me = threading.get_ident()
    with watching([recorder], runner=runner):
        alias[3] = 5  # never passes the watch
        runner.share_inputs["a"].numpy()
        runner.share_inputs["a"].numpy()
    assert recorder.calls == [("unseen", me), ("numpy", me), ("numpy", me)]


def test_a_runner_attribute_aliasing_a_watched_tensor_is_a_stand_in_during_the_call():
    runner = _Runner()
    buffer = runner.seq_lens_this_time_buffer
    recorder = _Recorder(buffer)
    with watching([recorder], runner=runner):
        runner.seq_lens_this_time_buffer[1:2] = 3
        runner.share_inputs["seq_lens_this_time"] = runner.seq_lens_this_time_buffer[:2]  # a real slice
        runner.share_inputs["view"] = runner.seq_lens_this_time_buffer  # the tensor, not the stand-in
    assert runner.seq_lens_this_time_buffer is buffer and runner.share_inputs["view"] is buffer
    assert type(runner.share_inputs["seq_lens_this_time"]) is paddle.Tensor
    assert [c[0] for c in recorder.calls] == ["setitem"] and buffer.numpy().tolist() == [0, 3, 0, 0]


class _Once(_Recorder):
    once = True


def test_a_scope_of_reads_once_gives_the_runner_its_share_inputs_back_after_the_reads():
    runner = _Runner()
    real = runner.share_inputs
    first, second = _Once(real["a"]), _Once(real["b"])
    with watching([first, second], runner=runner):
        assert runner.share_inputs["a"].numpy().tolist() == [-7] * 4
        assert isinstance(runner.share_inputs, ScopedInputs)  # one read still to come
        assert runner.share_inputs["b"].numpy().tolist() == [-7] * 4
        assert runner.share_inputs is real  # FastDeploy's other reads: its own dict, no view
        assert real["a"].numpy().tolist() == [0, 1, 2, 3]
    with watching([_Recorder(real["a"]), _Once(real["b"])], runner=runner):
        runner.share_inputs["b"].numpy()
        assert isinstance(runner.share_inputs, ScopedInputs)  # a handler that is not once: the view stays
    assert runner.share_inputs is real


def test_what_fastdeploy_builds_in_the_call_keeps_its_real_share_inputs():
    """FD's ``_prepare_inputs`` builds ``SamplingMetadata(share_inputs=self.share_inputs)``: after the
    call it holds FD's own object, not the view (the sampler reads it all step long)."""
    runner = _Runner()
    real = runner.share_inputs

    class SamplingMetadata:
        def __init__(self, share_inputs):
            self.share_inputs = share_inputs

    with watching([_Recorder(real["a"])], runner=runner):
        runner.sampling_metadata = SamplingMetadata(share_inputs=runner.share_inputs)
        assert isinstance(runner.sampling_metadata.share_inputs, ScopedInputs)
    assert runner.sampling_metadata.share_inputs is real


def test_fastdeploy_replacing_share_inputs_during_the_call_keeps_its_new_object():
    runner = _Runner()
    fresh = {"a": paddle.to_tensor(np.arange(2, dtype="int64"))}
    with watching([_Recorder(runner.share_inputs["a"])], runner=runner):
        runner.share_inputs = fresh
    assert runner.share_inputs is fresh


@pytest.mark.parametrize("root", ["fd24", "fd25"])
def test_paddles_tensor_class_is_untouched_while_step_syncs_runs(root, monkeypatch):
    """Inside FastDeploy's watched calls (the stand-in path ran) and outside, Paddle's
    ``Tensor.__setitem__``, ``__getitem__`` and ``numpy`` are Paddle's own objects."""
    paddle_own = {name: vars(paddle.Tensor)[name] for name in METHODS}
    seen = collections.Counter()
    stand_in_setitem = StandIn.__setitem__

    def spy(self, key, value):
        seen["calls"] += 1
        now = {n: vars(paddle.Tensor)[n] for n in METHODS}
        seen["plugin's"] += any(Junction.at(paddle.Tensor, n) is not None or hasattr(f, JUNCTION_MARK)
                                for n, f in now.items())
        seen["not Paddle's"] += now != paddle_own  # (the fd25 run's device tracking wraps them: a test's)
        return stand_in_setitem(self, key, value)

    monkeypatch.setattr(StandIn, "__setitem__", spy)
    requests, arrivals = workload(5, steps=6)
    if root == "fd24":
        _, served, _ = run_pair(config(5), requests, arrivals, "host")
        assert served["S1 token count"] > 0 and served["S2 bad_tokens_len"] > 0, served
    else:
        from test_step_syncs_fd25 import run_pair as run_pair_25, workload as workload_25

        requests, arrivals = workload_25(5, steps=6)
        run_pair_25(config(5), requests, arrivals, "host")
    assert seen["calls"] > 0 and seen["plugin's"] == 0, seen  # the watch ran; no plugin code in the class
    if root == "fd24":  # no device tracking in this run: Paddle's own objects
        assert seen["not Paddle's"] == 0, seen
    fd_async_copy_plugin.enable(features=("stop_flag", "step_syncs"), backend="host", root=ROOTS[root])
    __import__(f"{ROOTS[root]}.worker.gpu_model_runner")
    try:
        assert fd_async_copy_plugin.status()["features"]["step_syncs"]["state"] == "applied"
        assert {name: vars(paddle.Tensor)[name] for name in METHODS} == paddle_own
    finally:
        fd_async_copy_plugin.disable()


def _plant_write_through_an_earlier_reference(monkeypatch):
    """FastDeploy (planted) writes a wrong count through ``self.seq_lens_this_time_buffer`` during
    the insert, then FastDeploy's own value through a reference it took at ``_init_share_inputs``:
    the device ends up as FastDeploy's, a shadow that missed the second write would count one token short."""
    module = __import__(f"{ROOTS['fd24']}.worker.gpu_model_runner", fromlist=["GPUModelRunner"])
    cls, prefill = module.GPUModelRunner, module.RequestType.PREFILL.value
    fd_init, fd_insert = vars(cls)["_init_share_inputs"], vars(cls)["insert_tasks_v1"]

    def _init_share_inputs(self, max_num_seqs):
        fd_init(self, max_num_seqs)
        self.planted_alias = self.seq_lens_this_time_buffer

    def insert_tasks_v1(self, req_dicts, num_running_requests=None):
        fd_insert(self, req_dicts, num_running_requests)
        for request in req_dicts:
            if request.task_type.value == prefill:
                length = request.prefill_end_index - request.prefill_start_index
                self.seq_lens_this_time_buffer[request.idx : request.idx + 1] = length - 1
                self.planted_alias[request.idx : request.idx + 1] = length

    monkeypatch.setattr(cls, "_init_share_inputs", _init_share_inputs)
    monkeypatch.setattr(cls, "insert_tasks_v1", insert_tasks_v1)


def test_a_write_through_an_earlier_reference_makes_the_shadow_fall_back(monkeypatch):
    _plant_write_through_an_earlier_reference(monkeypatch)
    requests, arrivals = workload(7, steps=8)
    result, served, fallbacks = run_pair(config(7), requests, arrivals, "sim")  # outputs identical
    unseen = [cause for cause in fallbacks if "this_time past the watch" in cause]
    assert unseen and fallbacks["S1: the shadow cannot tell the count"] > 0, fallbacks
    assert served["S1 token count"] > 0, served  # and the shadow serves again after its snapshot


def test_planted_blind_watch_goes_stale_and_is_caught(monkeypatch):
    """The same write with the version check gone: the shadow is one off and the count refused."""
    _plant_write_through_an_earlier_reference(monkeypatch)
    monkeypatch.setattr(step_syncs._Mirror, "unseen", lambda self: None)
    requests, arrivals = workload(7, steps=8)
    with pytest.raises(RuntimeError, match="token_num"):
        run_pair(config(7), requests, arrivals, "sim")


def test_another_thread_reads_fastdeploys_own_tensors_during_an_insert(monkeypatch):
    """While FD's insert runs inside the watch, a second thread (an output or ZMQ thread) that reads
    ``runner.share_inputs`` gets FD's real tensors; the inserting thread gets stand-ins."""
    module = __import__(f"{ROOTS['fd24']}.worker.gpu_model_runner", fromlist=["GPUModelRunner"])
    fd_insert = vars(module.GPUModelRunner)["insert_tasks_v1"]
    seen = collections.Counter()

    def insert_tasks_v1(self, req_dicts, num_running_requests=None):
        def other_thread():
            seen[type(self.share_inputs["seq_lens_encoder"]).__name__, "other"] += 1

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join(10)
        seen[type(self.share_inputs["seq_lens_encoder"]).__name__, "inserting"] += 1
        return fd_insert(self, req_dicts, num_running_requests)

    monkeypatch.setattr(module.GPUModelRunner, "insert_tasks_v1", insert_tasks_v1)
    requests, arrivals = workload(5, steps=6)
    run_pair(config(5), requests, arrivals, "host")
    assert seen[("Tensor", "other")] > 0 and seen[("StandIn", "inserting")] > 0, seen
    # every insert of the plugin's run got stand-ins, of the unpatched reference run tensors
    assert seen[("StandIn", "other")] == 0 and seen[("Tensor", "inserting")] == seen[("StandIn", "inserting")], seen


def test_the_module_declares_no_patch_of_paddles_tensor():
    feature = step_syncs.StepSyncsFeature()
    targets = [p.target for p in feature.patches]
    assert not [t for t in targets if t.attr.startswith("Tensor.")], targets
    assert not hasattr(_tensor_watch, "PATCHES")


def test_the_view_decides_a_key_again_when_it_holds_another_object():
    """The view remembers per key what it found; a key re-pointed (through the view, or on
    FastDeploy's own dict) is decided again, and a value written through the view is not kept."""
    runner = _Runner()
    real, a, b = runner.share_inputs, runner.share_inputs["a"], runner.share_inputs["b"]
    with watching([_Recorder(a)], runner=runner):
        si = runner.share_inputs
        assert si["b"] is b and si["b"] is b and type(si["a"]) is StandIn  # read twice: remembered
        real["b"] = a  # FastDeploy's dict now holds the watched tensor under another key
        assert type(si["b"]) is StandIn and si["b"].tensor is a
        real["a"] = other = paddle.to_tensor(np.zeros(2, dtype="int64"))  # the watched key re-pointed
        assert si["a"] is other
        si["b"] = b  # written through the view: forgotten at once (the view holds no replaced value)
        assert "b" not in si._seen_ and si["b"] is b
    assert si["a"] is other and si["b"] is b  # closed: FastDeploy's own objects, whatever it remembers



class _HandsOutArray(_Recorder):
    """Hands the watched call a numpy array in place of the tensor (as FD 2.4's block tables get
    their pinned mirror), or the tensor itself when ``give`` is off."""

    def __init__(self, tensor, give=True) -> None:
        super().__init__(tensor)
        self.array, self.give = np.zeros(4, dtype="int64"), give

    def hand_out(self, scope):
        self.calls.append(("hand_out", threading.get_ident()))
        return self.array if self.give else None


def test_a_handler_may_hand_out_another_object_than_a_stand_in():
    """What the watched call gets is the handler's choice, asked once per key in a scope: here an
    array it writes into directly (no Python call per write), on the call's thread only; None gives
    the call the tensor itself, and a write made that way is told as past the watch."""
    runner = _Runner()
    a = runner.share_inputs["a"]
    handler = _HandsOutArray(a)
    other = {}

    def second_thread():
        other["type"] = type(runner.share_inputs["a"])

    with watching([handler], runner=runner):
        got = runner.share_inputs["a"]
        assert got is handler.array and runner.share_inputs["a"] is handler.array  # asked once
        got[1:3] = 9
        worker = threading.Thread(target=second_thread)
        worker.start()
        worker.join(10)
    assert other == {"type": paddle.Tensor}
    assert handler.array.tolist() == [0, 9, 9, 0] and a.numpy().tolist() == [0, 1, 2, 3]
    assert [c[0] for c in handler.calls] == ["hand_out"]  # no write reached the handler: none past it
    refused = _HandsOutArray(a, give=False)
    with watching([refused], runner=runner):
        assert runner.share_inputs["a"] is a
        runner.share_inputs["a"][0] = 5  # FastDeploy's own write, on the tensor
    assert [c[0] for c in refused.calls] == ["hand_out", "unseen"] and a.numpy().tolist() == [5, 1, 2, 3]
