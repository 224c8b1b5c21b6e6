"""``benchmarks/overlap_exact_phases.py`` on the replica (CI has no FastDeploy tree): the overlap's
``prepare`` path runs under the phase clock, its one wait is seen on every step, the op ports are timed
apart from the phase calling them, and every name the clock wrapped is put back after the run."""

from __future__ import annotations

import importlib
import json

import pytest

pytestmark = pytest.mark.usefixtures("plugin_off")


def _names():
    """What the clock wraps for a run, as installed now."""
    from fd_async_copy_plugin.runtime import census
    from fd_async_copy_plugin.testing.reference import ROOTS

    root = ROOTS["fd24"]
    runner = importlib.import_module(root + ".worker.gpu_model_runner")
    post = importlib.import_module(root + ".model_executor.pre_and_post_process")
    from fd_async_copy_plugin.registry.patch import JUNCTION_MARK

    names = {"runner": dict(vars(runner.GPUModelRunner)), "module": dict(vars(runner)), "post": dict(vars(post)),
             "begin_step": census.begin_step}
    names["bottoms"] = {k: getattr(v, JUNCTION_MARK).bottom for space in ("runner", "module", "post")
                        for k, v in names[space].items() if getattr(v, JUNCTION_MARK, None) is not None}
    return names


@pytest.mark.parametrize("count", ["prepare", "exact", "bound"])
def test_smoke_on_the_replica(count, tmp_path, capsys, benchmark_script):
    bench = benchmark_script("overlap_exact_phases")
    before = _names()
    out_json = tmp_path / "split.json"
    assert bench.main(["--batches", "2", "--steps", "4", "--count", count, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "RESULT: MEASURED"
    recorded = json.loads(out_json.read_text())
    assert recorded["date"] and recorded["commit"] and "CPU" in recorded["machine"]  # results name them
    split = recorded["batches"]["2"]
    assert split["exact_path_ran"] and split["overlap_flushes"] > 0 and split["steps"] >= 3
    phases = split["phases"]
    if count == "prepare":  # prepare's wait at _prepare_inputs, once per executed step
        assert split["steps_waited"] == split["steps"]
        assert split["exposed_host_us"] > 0 and split["exposed_wall_us"] > 0
    else:  # exact waits at the launch, bound after the forward: the same clock sees fewer waits at the prepare
        assert split["steps_waited"] < split["steps"]
    # the plugin's wrapper and FastDeploy's own lines apart; get_padding_offset's port timed as an op
    assert all(split["plugin_parts_wrapped"].values())
    assert phases["prepare: plugin's wrapper"]["host_us"] > 0 and phases["prepare: FD's own lines"]["host_us"] > 0
    assert phases["prepare: pre_process (get_padding_offset)"]["op_calls"] >= 1
    assert phases["prepare: pre_process (get_padding_offset)"]["op_us"] > 0
    lo, hi = split["movable_before_wait_host_us"]
    assert 0 <= lo <= hi
    assert _names() == before


def test_the_clock_puts_back_everything_it_wrapped(benchmark_script):
    """The names and the plugin's junction bottoms, with the plugin on (a benchmark that left a
    timer in FastDeploy's runner would time, and slow, every later run in the process)."""
    from fd_async_copy_plugin.testing.harness import OVERLAP_FEATURES, device_for, plugin_state
    from fd_async_copy_plugin.testing.real_steps import check
    from fd_async_copy_plugin.testing.reference import ROOTS

    bench = benchmark_script("overlap_exact_phases")
    root = ROOTS["fd24"]
    c = check.Configuration("x", True, OVERLAP_FEATURES, (("FD_ASYNC_COPY_OVERLAP_COUNT", "prepare"),))
    runner = importlib.import_module(root + ".worker.gpu_model_runner")
    post = importlib.import_module(root + ".model_executor.pre_and_post_process")
    with device_for("host"), plugin_state(check._variant(c, root), "host"):
        before = _names()
        with bench.installed(bench.PhaseClock(), runner, (runner, post)) as found:
            during = _names()
        after = _names()
    assert all(found.values()) and before["bottoms"]  # the plugin's junctions: timers went beneath them
    assert during["bottoms"] != before["bottoms"] and during["runner"] != before["runner"]
    assert after == before


def test_nested_calls_are_subtracted_and_ops_go_to_their_caller(monkeypatch, benchmark_script):
    bench = benchmark_script("overlap_exact_phases")
    now = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])
    clock = bench.PhaseClock()

    def op():
        now[0] += 3.0

    timed_op = clock.wrap(None, op)

    def inner():
        now[0] += 5.0
        timed_op()

    timed_inner = clock.wrap("inner", inner)

    def outer():
        now[0] += 2.0
        timed_inner()
        now[0] += 1.0
        timed_op()

    clock.wrap("outer", outer)()
    assert clock.now["outer"] == 3.0 and clock.now["inner"] == 5.0
    assert clock.now["ops|inner"] == 3.0 and clock.now["ops|outer"] == 3.0
    assert clock.now["opcalls|inner"] == 1 and clock.now["opcalls|outer"] == 1
