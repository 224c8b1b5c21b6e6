"""Issue 41 item 1: FD 2.5 ``step_syncs`` with the current stream changing between steps.

FastDeploy 2.5 copies ``seq_lens_this_time``/``is_block_step`` into pinned ``seq_lens_this_time_cpu``
/``is_block_step_cpu`` every step and waits on ``token_num_event``; that wait also ordered its copy
before the next step's copy into the same buffer. The plugin answers the count from its shadow and
skips the wait. On one stream stream order keeps the copies in order; with the stream changing
between steps two copies into one buffer are in flight at once, the older can land last, and
FastDeploy sizes a step from a stale count. The fix: before FastDeploy's next copies, the current
stream waits (on the device) for the last step's skipped event.

The backend is ``sim`` - the production copy path over the fake CUDA runtime - with FastDeploy's
current stream moved to the next stream at every step (``harness.stream_per_step``: the fake's
``use_stream``). FastDeploy's own copies there are Paddle's ``copy_`` (no host wait orders them), so
two copies into one pinned buffer on two streams with nothing ordering them are reported by the fake
runtime when the second is issued (9002, ``BufferInUseError``), whichever would have landed last.
The plugin's order reaches the fake's ``cudaStreamWaitEvent`` (``paddle.device.current_stream()
.wait_event`` in the replica), which orders on the device: nothing lands when it is called.
"""

from __future__ import annotations

import contextlib

import pytest

from fd_async_copy_plugin.patches.fd25 import step_syncs
from fd_async_copy_plugin.runtime import BufferInUseError
from fd_async_copy_plugin.testing.harness import Variant, run_variant, stream_per_step
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request

pytestmark = pytest.mark.usefixtures("plugin_off")

FD25 = ROOTS["fd25"]
RUNNER = "worker.gpu_model_runner"


@pytest.fixture
def many_streams():
    """``many_streams(n)``: FD 2.5's runner moves to the next of ``n`` streams at every step on
    backend ``sim``; returns the fake CUDA runtime."""
    with contextlib.ExitStack() as stack:
        yield lambda streams: stack.enter_context(stream_per_step(FD25, streams)).rt


def workload():
    """FD 2.5's overlap schedule: long-lived requests and prefills on consecutive steps every few
    steps. Decode steps' token-count waits are skipped (the shadow answers) while the step's save
    comes later, so the next step's copy into the same pinned buffer is issued with the last one in
    flight; after a prefill FastDeploy reads its pinned count itself (a counted fallback)."""
    cfg = DriverConfig(max_num_seqs=6, vocab_size=256, max_model_len=96, chunk_size=8, overlap=True)
    requests = [Request(f"s{i}", [(7 * i + 3 * j) % 200 + 3 for j in range(3 + i)], max_tokens=40,
                        eos_token_ids=[2]) for i in range(2)]
    arrivals = {}
    for s in range(3, 40, 6):  # 8-token prompts three steps running: each step one token more
        for k, name in ((0, "a"), (1, "b"), (2, "c")):
            arrivals[s + k] = [Request(f"{name}{s}", [(5 * s + 3 * k + j) % 200 + 3 for j in range(8)],
                                       max_tokens=9 + k, eos_token_ids=[2])]
    return cfg, requests, arrivals


#: the reference on the simulator under 2.5's overlap schedule: unpatched 2.5 loses a chunk to its own
#: stop-flag race there (flag_race), so the plugin without step_syncs is what step_syncs must match
REFERENCE = Variant("fd25-plugin-without-step_syncs", FD25, True, ("logprobs", "sync_scope", "flag_race"))
PLUGIN = Variant("fd25-plugin", FD25, True, ("logprobs", "sync_scope", "flag_race", "step_syncs"))


def prepare_reads_fall_back(monkeypatch):
    """The shadow does not answer _prepare_inputs' read (a counted fallback: FD's own wait, then its
    read of the pinned count) but answers _postprocess' (that step's wait skipped)."""
    real = step_syncs.TokenShadow.answer

    def answer(self, name, site, like):
        return None if site == "_prepare_inputs" else real(self, name, site, like)

    monkeypatch.setattr(step_syncs.TokenShadow, "answer", answer)


@pytest.mark.parametrize("fallback", [False, True], ids=["answered", "prepare-falls-back"])
@pytest.mark.parametrize("streams", [1, 2, 3])
def test_the_token_count_stays_exact_when_the_stream_changes_between_steps(monkeypatch, many_streams, streams,
                                                                           fallback):
    rt = many_streams(streams)
    if fallback:
        prepare_reads_fall_back(monkeypatch)
    cfg, requests, arrivals = workload()
    errors = rt.errors()
    reference = run_variant(REFERENCE, cfg, requests, backend="sim", arrivals=arrivals, max_steps=120)
    assert rt.errors() == errors, rt.last_error()  # FastDeploy's own waits keep its copies in order
    waits = rt.stream_waits
    run = run_variant(PLUGIN, cfg, requests, backend="sim", arrivals=arrivals, max_steps=120)
    assert run.status["features"]["step_syncs"]["state"] == "applied"
    served = run.final_status["features"]["step_syncs"]["runners"][0]["served"]
    assert served.get("token_num _postprocess", 0) > 0, served  # the shadow answered: waits skipped
    ordered = served.get("token_num: ordered after the last step's skipped wait (on the device)", 0)
    assert ordered > 0 and rt.stream_waits - waits >= ordered, (served, rt.stream_waits - waits)
    assert rt.errors() == errors, rt.last_error()  # no unordered pair of copies, no early read
    reference.result.assert_same(run.result)


@pytest.mark.parametrize("streams", [1, 2])
def test_without_the_order_two_copies_into_the_pinned_count_race_on_two_streams_only(monkeypatch, many_streams,
                                                                                      streams):
    """Planted: the skipped wait's order is dropped. Two streams: FastDeploy's next copy into the
    pinned count is issued on the other stream while the last step's is still pending, with nothing
    ordering the two (the older could land last and FastDeploy would size a step from a stale count):
    the fake runtime reports it. One stream: stream order is enough (what FD relies on today)."""
    monkeypatch.setattr(step_syncs, "order_after_skipped_waits", lambda state, shadow: setattr(state, "unwaited", []))
    rt = many_streams(streams)
    cfg, requests, arrivals = workload()
    errors = rt.errors()
    if streams == 1:
        run_variant(PLUGIN, cfg, requests, backend="sim", arrivals=arrivals, max_steps=120)
        assert rt.errors() == errors, rt.last_error()
    else:
        with pytest.raises(BufferInUseError, match=r"_prepare_inputs\.seq_lens_this_time_cpu.*another stream"):
            run_variant(PLUGIN, cfg, requests, backend="sim", arrivals=arrivals, max_steps=120)
