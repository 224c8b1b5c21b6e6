"""``benchmarks/overlap_launch_wait.py`` on the replica (CI has no FastDeploy tree): the real-steps
workloads with a row-count-dependent GEMM; ``bound`` plus a wait and a trim at the forward's launch
is FastDeploy 2.4's bits, and the check fails when the trim is left out."""

from __future__ import annotations

import contextlib

import pytest

pytestmark = pytest.mark.usefixtures("plugin_off")


def test_the_launch_wait_keeps_fastdeploy_24s_bits_on_the_replica(capsys, benchmark_script):
    assert benchmark_script("overlap_launch_wait").main(["--steps", "16"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "RESULT: PASS"
    launch = [line for line in out.splitlines() if " bound + launch wait " in line]
    assert launch and all(" identical " in line for line in launch), out
    assert any("steps trimmed: 0)" not in line for line in launch), out  # the trim ran
    assert any(" bound " in line and "differs: " in line for line in out.splitlines()), out  # bound alone does not


def test_the_check_fails_without_the_trim(capsys, benchmark_script, monkeypatch):
    bench = benchmark_script("overlap_launch_wait")

    @contextlib.contextmanager
    def no_trim(runner_class):
        yield []

    monkeypatch.setattr(bench, "launch_wait", no_trim)
    assert bench.main(["--steps", "16"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT: FAIL"
