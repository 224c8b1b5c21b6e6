"""``benchmarks/overlap_launch_wait.py`` on the replica (CI has no FastDeploy tree): the real-steps
workloads with a row-count-dependent GEMM; ``FD_ASYNC_COPY_OVERLAP_COUNT=exact`` (the default:
``bound``'s prepare, a wait and a trim at the forward's launch) and ``prepare`` are FastDeploy 2.4's
bits, and the check fails when the trim is left out."""

from __future__ import annotations

import pytest

from fd_async_copy_plugin.patches.fd24 import overlap as overlap_patch

pytestmark = pytest.mark.usefixtures("plugin_off")


def test_the_exact_mode_keeps_fastdeploy_24s_bits_on_the_replica(capsys, benchmark_script):
    assert benchmark_script("overlap_launch_wait").main(["--steps", "16"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "RESULT: PASS"
    exact = [line for line in out.splitlines() if " exact " in line and "steps trimmed" in line]
    assert exact and all(" identical " in line for line in exact), out
    assert any("steps trimmed: 0)" not in line for line in exact), out  # the trim ran
    prepare = [line for line in out.splitlines() if " prepare " in line and "steps trimmed" in line]
    assert prepare and all(" identical " in line and "steps trimmed: 0)" in line for line in prepare), out
    assert any(" bound " in line and "differs: " in line for line in out.splitlines()), out  # bound alone does not


def test_the_check_fails_without_the_trim(capsys, benchmark_script, monkeypatch):
    monkeypatch.setattr(overlap_patch, "TOKEN_FIELDS", ())  # waited at the launch, rows left at the bound
    monkeypatch.setattr(overlap_patch.OverlapState, "keep_padding", lambda self, *args: None)  # the buffers too
    assert benchmark_script("overlap_launch_wait").main(["--steps", "16"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT: FAIL"


def test_the_counts_are_chosen_by_name(capsys, benchmark_script):
    """``--counts``: ``launch`` runs as ``exact`` (its old name); an unknown value is refused."""
    assert benchmark_script("overlap_launch_wait").main(["--steps", "16", "--counts", "launch"]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if " launch " in line and "steps trimmed" in line], out
    with pytest.raises(SystemExit):
        benchmark_script("overlap_launch_wait").main(["--counts", "fast"])
