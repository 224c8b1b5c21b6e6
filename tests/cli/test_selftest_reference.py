"""Issue 41 item 7: selftest compares with a synchronous reference and runs for every --steps value.

On the simulator, FD 2.5's overlap schedule has races of its own: with ``--steps 2`` unpatched FD
loses the last prompt chunk's logprobs, with ``--steps 1`` and ``3`` a lost step leaves every request
waiting for a KV block. The plugin's run is right there; selftest compared it with the unpatched run
and printed MISMATCH / ERROR. Now both runs are compared with unpatched FD on the synchronous
``host`` backend: the plugin must equal it, and unpatched FD's own race is reported as such.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fd_async_copy_plugin.testing import harness

pytestmark = pytest.mark.usefixtures("plugin_off")


def fd25_scenario(steps: int) -> harness.Scenario:
    (scenario,) = [s for s in harness.selftest_scenarios(steps) if s.replica == "fd25"]
    return scenario


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_fd25s_own_race_is_reported_as_such_and_the_plugin_passes(steps):
    scenario = fd25_scenario(steps)
    judged = harness.judge_scenario(scenario, "sim")
    assert judged.reference is not None and judged.differences == []  # the plugin equals the reference
    assert judged.fastdeploy_race, "unpatched FD 2.5 on the simulator matched: the race this test is about is gone"
    # what selftest did before: the plugin against unpatched FD on the simulator
    try:
        base, plugin = harness.run_scenario(scenario, "sim")
    except RuntimeError as exc:
        assert "every running request waits for a KV block" in str(exc)
    else:
        assert scenario.differences(base.result, plugin.result)


def test_a_plugin_run_that_differs_from_the_reference_is_a_mismatch(monkeypatch):
    """Planted: one token of the plugin's run changed. Unpatched FD differs from the reference too
    (its race), which must not excuse the plugin."""
    real = harness._plugin_run

    def corrupted(scenario, backend, max_steps):
        run = real(scenario, backend, max_steps)
        next(iter(run.result.outputs.values())).token_ids[0] += 1
        return run

    monkeypatch.setattr(harness, "_plugin_run", corrupted)
    judged = harness.judge_scenario(fd25_scenario(2), "sim")
    assert judged.differences and judged.fastdeploy_race == []
    assert any("unpatched FastDeploy differs too" in d for d in judged.differences)


def test_selftest_steps_2_passes_on_the_simulator_and_names_fastdeploys_race():
    proc = subprocess.run([sys.executable, "-m", "fd_async_copy_plugin.cli", "selftest", "--steps", "2",
                           "--backend", "sim", "--json"], capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout)
    assert report["ok"] is True, [e for e in report["scenarios"] if not e["ok"]]
    (fd25,) = [e for e in report["scenarios"] if e["scenario"].startswith("fd25")]
    assert fd25["ok"] and fd25["differences"] == [] and fd25["fastdeploy_race"], fd25
    assert fd25["compared_with"].startswith("synchronous reference")
    assert "FastDeploy's own race seen" in proc.stderr


@pytest.mark.parametrize("steps", [1, 2, 3, 59, 60, 129])
def test_every_steps_value_sizes_scenarios_that_run(steps):
    """Before: 60 stalled the block-step workload, 120+ exceeded max_model_len=128."""
    for scenario in harness.selftest_scenarios(steps):
        base, plugin = harness.run_scenario(scenario, "host")
        assert not base.result.truncated and scenario.differences(base.result, plugin.result) == [], scenario.name


def test_selftest_steps_is_bounded_with_a_one_line_error(capsys):
    from fd_async_copy_plugin.cli import build_parser

    assert build_parser().parse_args(["selftest", "--steps", str(harness.MAX_SELFTEST_STEPS)]).steps == 512
    with pytest.raises(SystemExit):
        build_parser().parse_args(["selftest", "--steps", "513"])
    assert "513 is more than 512" in capsys.readouterr().err
    with pytest.raises(ValueError, match="expected 1 to 512"):
        harness.selftest_scenarios(513)
