"""Ground truth for a design in docs/overlap-token-count.md ("A wait at the forward's launch"), not a
shipped behaviour: prepare step N+1 sized by the upper bound (``bound``), then wait for step N's
snapshot right before the forward and trim the packed inputs to the exact count. Against the replica
model whose per-token GEMM rounds by the row count (``rows_dependent_gemm``), that is FD 2.4 bit for
bit where ``bound`` alone is not: the host count sets only the packed inputs' length, the real rows'
positions and values come from the device's lengths.

The prototype is ``launch_wait`` in ``benchmarks/overlap_launch_wait.py`` (a wrapper of the replica's
``padding_cudagraph_inputs``, FD 2.4's last call before the model); the patches do not have it."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from test_overlap import EXACT, FD24, run_exact

pytestmark = pytest.mark.usefixtures("plugin_off")

SCENARIOS = list(EXACT)  # every scenario of the exact suite (test_overlap.py)


@pytest.fixture
def launch_wait(monkeypatch, benchmark_script):
    """The replica runner's ``padding_cudagraph_inputs`` waits for the last step's snapshot when this
    step was sized by the bound, and trims the step's token-indexed inputs to the exact count
    (``benchmarks/overlap_launch_wait.py``'s ``launch_wait``). Yields the rows trimmed per step."""
    monkeypatch.setenv("FD_ASYNC_COPY_OVERLAP_COUNT", "bound")
    runner_class = importlib.import_module(f"{FD24}.worker.gpu_model_runner").GPUModelRunner
    with benchmark_script("overlap_launch_wait").launch_wait(runner_class) as trimmed:
        yield trimmed


@pytest.mark.parametrize("backend", ["host", "sim"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_bound_prepare_with_a_wait_at_launch_is_fastdeploy_24_bit_for_bit(name, backend, launch_wait):
    cfg, requests, arrivals = EXACT[name]()
    _, served = run_exact(dataclasses.replace(cfg, rows_dependent_gemm=True), requests, arrivals, backend,
                          max_steps=400)
    assert served["count mode: bound"] and served["syncs: S1 upper bound (tail filled)"] > 0, served
    assert any(launch_wait), launch_wait  # steps after a finish ran on fewer rows than the bound


def test_without_the_trim_the_same_runs_differ(monkeypatch):
    """The check above can fail: the same scenario sized by the bound alone moves logprob bits."""
    monkeypatch.setenv("FD_ASYNC_COPY_OVERLAP_COUNT", "bound")
    cfg, requests, arrivals = EXACT["logprobs 0/5/20, arrivals"]()
    with pytest.raises(AssertionError, match="logprobs differ"):
        run_exact(dataclasses.replace(cfg, rows_dependent_gemm=True), requests, arrivals, "sim", max_steps=400)
