"""``FD_ASYNC_COPY_OVERLAP_COUNT=exact`` (the default, FastDeploy 2.4): step N+1 is prepared sized by
the upper bound (as ``bound``), then in ``padding_cudagraph_inputs`` (FD 2.4's last call before the
model) the host waits for step N's snapshot and trims the packed inputs to the exact count
(docs/overlap-token-count.md, "A wait at the forward's launch"). Against the replica model whose
per-token GEMM rounds by the row count (``rows_dependent_gemm``), that is FD 2.4 bit for bit where
``bound`` alone is not: the host count sets only the packed inputs' length, the real rows'
positions and values come from the device's lengths. ``launch``, its old name, is the same mode;
where the restore's Paddle calls fail their self-check, ``exact`` waits at the prepare (``prepare``'s
wait) and stays FD 2.4 bit for bit."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from fd_async_copy_plugin.patches.fd24 import overlap as overlap_patch
from fd_async_copy_plugin.testing.harness import Variant, host_waits, run_variant

from test_overlap import EXACT, FD24, OVERLAP, _req, config, run_exact

pytestmark = pytest.mark.usefixtures("plugin_off")

SCENARIOS = list(EXACT)  # every scenario of the exact suite (test_overlap.py)


@pytest.fixture(params=["exact"])
def launch(request, monkeypatch):
    """The wait at the forward's launch: ``exact`` (the default) or its old name ``launch``."""
    monkeypatch.setenv("FD_ASYNC_COPY_OVERLAP_COUNT", request.param)


def run_launch(name, backend):
    cfg, requests, arrivals = EXACT[name]()
    return run_exact(dataclasses.replace(cfg, rows_dependent_gemm=True), requests, arrivals, backend, max_steps=400)


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_launch_is_fastdeploy_24_bit_for_bit_with_a_rows_dependent_gemm(name, backend, launch):
    _, served = run_launch(name, backend)
    assert served["count mode: exact"] and served["syncs: S1 upper bound (tail filled)"] > 0, served
    if name != "all ending together":  # a step after a finish ran on fewer rows than the bound
        assert served["launch: padding restored"] == served["launch: steps trimmed"] > 0, served
    assert not served["launch: count read on the device"], served


def test_a_trim_left_at_the_bound_is_caught(launch, monkeypatch):
    """The check above can fail: the wait at the launch without the trim (the step's rows left at
    the bound, the buffers too) moves logprob bits."""
    monkeypatch.setattr(overlap_patch, "TOKEN_FIELDS", ())
    monkeypatch.setattr(overlap_patch.OverlapState, "keep_padding", lambda self, *args: None)
    with pytest.raises(AssertionError, match="logprobs differ"):
        run_launch("logprobs 0/5/20, arrivals", "sim")


def one_wait_at_the_launch(cfg, requests, window: slice):
    """Runs ``exact`` with the census and checks the steps in ``window``: one wait per step, on the
    last step's event at the launch (1 long). Returns the run and its overlap runner's report."""
    run = run_variant(Variant("p", FD24, True, OVERLAP), cfg, requests, backend="sim", max_steps=60, track=True)
    waits = host_waits(run.census.steps[window], skip=0)
    assert (waits["total"], waits["long"], waits["mean"]) == (1, 1, 1.0), waits
    (only,) = waits["sites"]
    assert only["label"] == "save event" and "launch wait" in only["what"], only
    (runner,) = run.final_status["features"]["overlap"]["runners"]
    return run, runner


@pytest.mark.parametrize("launch", ["exact", "launch"], indirect=True)
def test_census_one_wait_per_step_at_the_forwards_launch(launch):
    """One wait per step, on the last step's event: at the launch, before this step's forward
    (1 long: the GPU drains step N before N+1's forward, as with ``prepare``), none at the prepare.
    ``launch`` is reported as ``exact``."""
    requests = [_req(i, 4 + i, 24, logprobs=5, top_p=0.9, seed=i) for i in range(6)]
    cfg = config(max_num_seqs=8, chunk_size=None, enable_logprob=True, block_size=64)  # no insert
    _, runner = one_wait_at_the_launch(cfg, requests, slice(3, 18))
    assert runner["token_count"] == "exact" and runner["waited_fraction"] == 1.0, runner
    assert runner["launch"]["fallback"] == "" and runner["launch"]["steps trimmed"] > 0, runner


class _FlashAttention:
    def init_attention_metadata(self, forward_meta) -> None:
        pass


@pytest.mark.parametrize("set_up, cause", [
    (lambda r: setattr(r, "attn_backends", [_FlashAttention()]), "attention backend _FlashAttention"),
    (lambda r: setattr(r.parallel_config, "enable_chunked_moe", True), "chunked MoE"),
])
def test_falls_back_to_the_wait_at_the_prepare_and_reports_why(set_up, cause, launch, monkeypatch):
    """Where a count may be read between the prepare and the launch, ``exact`` waits where
    ``prepare`` does (still FD 2.4's bits), and ``status()`` says why."""
    runner_class = importlib.import_module(f"{FD24}.worker.gpu_model_runner").GPUModelRunner
    init = runner_class._init_share_inputs

    def _init_share_inputs(self, *args, **kwargs):
        set_up(self)
        return init(self, *args, **kwargs)

    monkeypatch.setattr(runner_class, "_init_share_inputs", _init_share_inputs)
    _, served = run_launch("logprobs 0/5/20, arrivals", "sim")
    assert not served["syncs: S1 upper bound (tail filled)"] and not served["launch: steps trimmed"], served
    requests = [_req(i, 4 + i, 6 + 2 * i) for i in range(5)]
    run = run_variant(Variant("p", FD24, True, OVERLAP), config(chunk_size=None, block_size=64), requests,
                      backend="sim", max_steps=60)
    (runner,) = run.final_status["features"]["overlap"]["runners"]
    assert runner["launch"]["fallback"].startswith(cause) and runner["waited_fraction"] == 1.0, runner


def test_where_the_shadow_cannot_tell_the_count_at_the_launch_the_device_count_is_read(launch, monkeypatch):
    """The shadow cannot replay the step at the launch: FastDeploy's own device count (a stream
    sync, counted) sizes the trim, still FD 2.4's bits."""
    import inspect

    from fd_async_copy_plugin.patches.fd24.step_syncs import StepShadow

    replay = StepShadow.recover_and_count

    def recover_and_count(self, num_running):
        return None if inspect.stack()[1].function == "launch_wait" else replay(self, num_running)

    monkeypatch.setattr(StepShadow, "recover_and_count", recover_and_count)
    _, served = run_launch("logprobs 0/5/20, arrivals", "sim")
    assert served["launch: count read on the device"] > 0 and served["launch: steps trimmed"] > 0, served


def test_without_the_plugins_function_at_the_launch_it_falls_back():
    """A runner class whose ``padding_cudagraph_inputs`` is not the plugin's (overridden, or the
    plugin off) has no hook at the launch: ``exact`` waits at ``_prepare_inputs``."""
    from fd_async_copy_plugin.testing.harness import device_for, plugin_state

    module = importlib.import_module(f"{FD24}.worker.gpu_model_runner")

    class Overriding(module.GPUModelRunner):
        def padding_cudagraph_inputs(self) -> None:
            pass

    no_hook = "padding_cudagraph_inputs is not the plugin's"
    with device_for("sim"), plugin_state(Variant("p", FD24, True, OVERLAP), "sim"):
        assert overlap_patch.launch_off_reason(object.__new__(module.GPUModelRunner), module) == ""
        assert overlap_patch.launch_off_reason(object.__new__(Overriding), module).startswith(no_hook)
    assert overlap_patch.launch_off_reason(object.__new__(module.GPUModelRunner), module).startswith(no_hook)
