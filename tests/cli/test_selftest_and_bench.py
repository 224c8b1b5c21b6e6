"""The README's commands: selftest passes bit-identical, bench prints the side-by-side census."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fd_async_copy_plugin.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_selftest_reports_bit_identical_runs_on_host_and_sim():
    proc = cli("selftest", "--steps", "24", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["backends"] == ["host", "sim"] and "CUDA unavailable" in report["note"]
    replicas = {entry["scenario"].split()[0] for entry in report["scenarios"]}
    assert replicas == {"fd24", "fd25"}
    for entry in report["scenarios"]:
        assert entry["ok"] and entry["differences"] == []
        assert "applied" in entry["features"].values()
        assert entry["census_plugin"]["device_sync"] == 0


def test_selftest_fails_loudly_when_outputs_differ(monkeypatch):
    """A selftest that cannot fail is worthless: plant a one-token difference."""
    from fd_async_copy_plugin.cli import selftest
    from fd_async_copy_plugin.testing import harness

    real = harness.run_scenario

    def corrupted(scenario, backend, max_steps=400):
        base, plugin = real(scenario, backend, max_steps)
        first = next(iter(plugin.result.outputs.values()))
        first.token_ids[0] += 1
        return base, plugin

    monkeypatch.setattr(harness, "run_scenario", corrupted)

    class Args:
        steps, backend, json = 8, "host", True

    assert selftest.run(Args()) == 1


def test_bench_smoke_json_has_ratio_and_census_side_by_side():
    proc = cli("bench", "--smoke", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    # no silent stretch between the timed rounds and the census: a line per census run
    from fd_async_copy_plugin.testing.harness import CENSUS_ORDER

    for name in CENSUS_ORDER:
        if name not in report["host_time_per_step"]:
            assert f"census runs: {name} done" in proc.stderr, (name, proc.stderr)
        assert f"whole-step census: {name} done" in proc.stderr, (name, proc.stderr)
    assert set(report["host_time_per_step"]) == {"fd24-unpatched", "fd24-backport", "fd24-plugin"}
    assert report["ratio_plugin_over_unpatched"] > 0 and report["ratio_backport_over_unpatched"] > 0
    # the plugin's host overhead per step: the median of the per-round differences (rounds side by side)
    rounds = report["round_medians_ms"]
    assert len(rounds["fd24-plugin"]) == len(rounds["fd24-unpatched"]) == report["workload"]["repeats"] == 2
    diffs = sorted(1e3 * (p - b) for p, b in zip(rounds["fd24-plugin"], rounds["fd24-unpatched"]))
    assert report["plugin_overhead_us_per_step"] == pytest.approx(sum(diffs) / 2)
    from fd_async_copy_plugin.cli.bench import format_report
    from fd_async_copy_plugin.testing.harness import format_census

    text = format_report(report, format_census)
    assert (f"plugin host overhead per decode step: {report['plugin_overhead_us_per_step']:+.1f} us (per round: "
            f"plugin - unpatched\n  medians; the median of 2 rounds, range {diffs[0]:+.1f} .. {diffs[1]:+.1f} us)") in text
    census = report["census_per_step"]
    # overlap's decode steps prepared while the last step was in flight: exact waited for its count
    # before every one, bound before none; the bench prints that fraction per overlap run
    assert census["fd24-overlap"]["overlap_count_waits"]["waited_fraction"] == 1.0, census["fd24-overlap"]
    assert census["fd24-overlap-bound"]["overlap_count_waits"]["waited_fraction"] == 0.0
    assert [name for name, row in census.items() if "overlap_count_waits" in row] == ["fd24-overlap",
                                                                                      "fd24-overlap-bound"]
    assert re.search(r"fd24-overlap +exact +waited +1\.000 \(landed before 1, waited for the count \d+\)\n"
                     r" +fd24-overlap-bound +bound +waited +0\.000 \(landed before 1, not waited \d+\)", text), text
    assert set(census) == {"fd24-unpatched", "fd24-backport", "fd24-plugin", "fd24-overlap", "fd24-overlap-bound",
                           "fd25-native", "fd25-native-overlap", "fd25-plugin", "fd25-plugin-overlap",
                           "fddev-native", "fddev-native-overlap", "fddev-plugin", "fddev-plugin-overlap"}
    # The whole-step census (device tracking): fd24-step-syncs.md's counts per plain decode step.
    waits = {name: (row["host_waits"]["total"], row["host_waits_with_logprobs"]["total"]) for name, row in census.items()}
    assert waits == {
        "fd24-unpatched": (7, 10),
        "fd24-backport": (6, 6),
        "fd24-plugin": (1, 1),  # step_syncs: the save event only
        "fd24-overlap": (1, 1),  # exact count: the previous step's event, before this step is prepared
        "fd24-overlap-bound": (1, 1),  # the previous step's save event, after this step's forward
        "fd25-native": (4, 4),
        "fd25-native-overlap": (3, 3),
        # step_syncs: T gone (the seed on the device) and both token_num waits (the host shadow's count)
        "fd25-plugin": (1, 1),  # the save event only
        "fd25-plugin-overlap": (1, 1),  # FD 2.5's overlap + the plugin: the last step's save event only
        # develop: the token count (:328) and the save event (:2113); overlap (its default): the last
        # step's save event (:2129) and this step's token count (:2138). The plugin keeps them.
        "fddev-native": (2, 2),
        "fddev-native-overlap": (2, 2),
        "fddev-plugin": (2, 2),
        "fddev-plugin-overlap": (2, 2),
    }
    for name in ("fddev-native", "fddev-plugin"):
        assert census[name]["host_waits"]["long"] == 1  # the save event covers the step's work
        assert [s["label"] for s in census[name]["host_waits"]["sites"]] == ["token_num", "save event"]
    for name in ("fddev-native-overlap", "fddev-plugin-overlap"):
        assert census[name]["host_waits"]["long"] == 0  # nothing waits for the forward in flight
        assert [s["label"] for s in census[name]["host_waits"]["sites"]] == ["save event", "token_num"]
    for name in ("fddev-native", "fddev-native-overlap", "fddev-plugin", "fddev-plugin-overlap"):
        assert census[name]["fallbacks"] == {}, census[name]  # step_syncs is native on develop
    # the plugin's logprobs on develop: no per-step pinned allocations (develop's gather_logprobs has 3)
    assert census["fddev-native"]["pinned_alloc"] >= 3 and census["fddev-plugin"]["pinned_alloc"] == 0
    # FD 2.5: T was the one long wait; with the plugin only the save event waits for the step's work,
    # and under 2.5's overlap schedule nothing waits for the forward being prepared
    assert census["fd25-native"]["host_waits"]["long"] == 2 and census["fd25-native-overlap"]["host_waits"]["long"] == 1
    assert census["fd25-plugin"]["host_waits"]["long"] == 1
    assert census["fd25-plugin-overlap"]["host_waits"]["long"] == 0
    for name in ("fd25-plugin", "fd25-plugin-overlap"):
        assert [s["label"] for s in census[name]["host_waits"]["sites"]] == ["save event"], census[name]
        assert [s["label"] for s in census[name]["host_waits_with_logprobs"]["sites"]] == ["save event"], census[name]
        # every fallback counted by cause; the census runs have none but the construction load
        assert census[name]["fallbacks"] == {"step_syncs": {"shadow loaded (construction)": 1}}, census[name]
    for name in ("fd25-native", "fd25-native-overlap"):
        assert census[name]["fallbacks"] == {}, census[name]
    # every host read on a patched path comes after a wait that covers it, in every variant
    assert all(row["first_read_after_wait"] for row in census.values()), \
        {name: row["first_read_after_wait"] for name, row in census.items()}
    assert census["fd24-unpatched"]["host_waits"]["long"] == 2  # T and S5
    assert [s["label"] for s in census["fd24-plugin"]["host_waits"]["sites"]] == ["save event"]
    assert census["fd24-overlap-bound"]["host_waits"]["long"] == 0  # nothing waits for this step's forward
    assert census["fd24-overlap"]["host_waits"]["long"] == 1  # the GPU drains before the next step
    assert census["fd24-plugin"]["host_waits"]["long"] == 1
    for site in census["fd24-backport"]["host_waits"]["sites"]:
        assert re.fullmatch(r"\S+\.py:\d+ \w+", site["site"]), site
    assert census["fd24-unpatched"]["blocking_d2h"] >= 5
    plugin = census["fd24-plugin"]
    assert (plugin["blocking_d2h"], plugin["device_sync"], plugin["pinned_alloc"], plugin["op_on_pinned"]) == (0, 0, 0, 0)
    assert plugin["event_wait"] == 1 and plugin["first_read_after_wait"] is True
    assert census["fd25-native"]["pinned_alloc"] >= 3 and census["fd25-plugin"]["pinned_alloc"] == 0


def test_bench_tables_fit_100_columns():
    from fd_async_copy_plugin.testing.harness import census_module, format_census, format_host_waits

    long_site = "reference/fd24/model_executor/layers/sample/ops/top_k_top_p_sampling.py:48 top_k_top_p_sampling"
    row = {key: 123.45 for key in census_module.KINDS}
    row.update(blocking_d2h_elsewhere=4.0, first_read_after_wait=True)
    row["host_waits"] = {"total": 10, "long": 2, "short": 8, "mean": 10.0, "steps": 4, "sites": [
        {"site": long_site, "mechanism": "event", "long": False, "what": "x", "label": "save event", "per_step": 1.0},
    ]}
    text = format_census({"fd25-native-overlap": row}) + "\n" + format_host_waits({"fd25-native-overlap": row})
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert "top_k_top_p_sampling" in text  # a long site keeps its end (file:line function)
