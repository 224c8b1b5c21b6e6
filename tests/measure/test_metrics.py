"""The sync check's counters in Prometheus (skipped without prometheus_client, as in FD's absence)."""

from __future__ import annotations

import builtins

import pytest

from fd_async_copy_plugin import metrics, sync_check


def run_steps(checker, n, waits):
    for _ in range(n):
        checker.step_begin()
        for mechanism, where, what in waits:
            sync_check.observe(mechanism, where, what)
        checker.step_end()


def test_counters_follow_the_counted_steps():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    checker = sync_check.start(sync_check.Settings("count", 2))
    assert metrics.export(checker, registry).startswith("exported: fastdeploy:async_copy_decode_steps_total")
    run_steps(checker, 5, [("event", "patches/fd24/stop_flag.py:123 host_tokens", "event wait save_output"),
                           ("d2h", "fastdeploy/worker/gpu_model_runner.py:1617 _prepare_inputs", ".numpy()")])
    get = registry.get_sample_value
    assert get("fastdeploy:async_copy_decode_steps_total") == 3  # after the 2 warm-up steps
    assert get("fastdeploy:async_copy_host_waits_total", {"label": "save event", "mechanism": "event",
                                                          "site": "patches/fd24/stop_flag.py:123 host_tokens"}) == 3
    assert get("fastdeploy:async_copy_host_waits_total", {"label": "S2", "mechanism": "d2h",
                                                          "site": "fastdeploy/worker/gpu_model_runner.py:1617 _prepare_inputs"}) == 3
    text = prometheus_client.generate_latest(registry).decode()
    assert 'fastdeploy:async_copy_host_waits_total{label="S2"' in text


def test_without_prometheus_client_nothing_is_exported_and_steps_run(monkeypatch):
    real_import = builtins.__import__

    def no_prometheus(name, *args, **kwargs):
        if name.startswith("prometheus_client"):
            raise ImportError("No module named 'prometheus_client'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_prometheus)
    checker = sync_check.start(sync_check.Settings("count", 0))
    checker.metrics = metrics.export(checker)
    assert checker.metrics.startswith("not exported: prometheus_client is not importable")
    run_steps(checker, 2, [("d2h", "x.py:1 f", "int()")])
    assert sync_check.status()["steps_counted"] == 2 and sync_check.status()["metrics"] == checker.metrics


def test_a_failing_exporter_is_removed_and_the_step_goes_on():
    checker = sync_check.start(sync_check.Settings("count", 0))

    def broken(waits):
        raise RuntimeError("exporter down")

    checker.step_listeners.append(broken)
    run_steps(checker, 2, [("d2h", "x.py:1 f", "int()")])
    assert checker.step_listeners == [] and checker.steps_counted == 2
