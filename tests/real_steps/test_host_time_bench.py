"""``benchmarks/real_steps_host_time.py`` on the replica (CI has no FastDeploy tree): it runs, prints
one row per batch, logprobs setting and configuration, and attributes the plugin's frames."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("plugin_off")


def test_smoke_on_the_replica(capsys, benchmark_script):
    bench = benchmark_script("real_steps_host_time")
    assert bench.main(["--replica", "fd24", "--batches", "2", "--steps", "3", "--rounds", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.strip().startswith("B=2")]
    assert len(rows) == 6 and out[-1] == "RESULT: MEASURED"
    unpatched = [r for r in rows if " unpatched " in r]
    default = [r for r in rows if " default " in r]
    # nothing of the plugin runs unpatched; with it, its frames are charged to it
    assert all("plugin/fastdeploy" in r for r in rows)
    calls = {r: float(r.split("plugin Python calls")[1]) for r in rows}  # (the window's own hook: a few)
    assert max(calls[r] for r in unpatched) * 20 < min(calls[r] for r in default)
    assert float(default[0].split("plugin")[1].split("us")[0]) > float(unpatched[0].split("plugin")[1].split("us")[0])


def test_unowned_time_goes_to_callers_by_their_time_in_it(benchmark_script):
    bench = benchmark_script("real_steps_host_time")

    class Fake:
        stats = {
            ("/p/plugin/a.py", 1, "a"): (1, 1, 1.0, 4.0, {}),
            ("/p/fd/b.py", 1, "b"): (1, 1, 2.0, 4.0, {}),
            ("/lib/x.py", 1, "x"): (2, 2, 3.0, 3.0, {("/p/plugin/a.py", 1, "a"): (1, 1, 1.0, 1.0),
                                                     ("/p/fd/b.py", 1, "b"): (1, 1, 2.0, 2.0)}),
        }

    totals = bench.attribute(Fake(), "/p/fd/", "/p/plugin/", "/p/plugin/testing/")
    assert totals["plugin"] == pytest.approx(1.0 + 3.0 / 3) and totals["fastdeploy"] == pytest.approx(2.0 + 2 * 3.0 / 3)
    assert totals["_plugin_calls"] == 1  # the plugin's own Python function only (x is not the plugin's)


def test_plugin_code_a_stand_in_calls_is_the_stand_ins(benchmark_script):
    """The replica's ops and FD 2.5's routed copies call the plugin's copy backend: that is the
    stand-ins' cost; a junction FastDeploy calls is the plugin's."""
    bench = benchmark_script("real_steps_host_time")

    class Fake:
        stats = {
            ("/p/plugin/testing/op.py", 1, "op"): (1, 1, 1.0, 3.0, {}),
            ("/p/fd/run.py", 1, "run"): (1, 1, 1.0, 5.0, {}),
            ("/p/plugin/runtime/backend.py", 1, "copy"): (2, 2, 2.0, 2.0, {
                ("/p/plugin/testing/op.py", 1, "op"): (1, 1, 1.0, 1.0),
                ("/p/plugin/patches/junction.py", 1, "link"): (1, 1, 1.0, 1.0)}),
            ("/p/plugin/patches/junction.py", 1, "link"): (1, 1, 1.0, 2.0, {("/p/fd/run.py", 1, "run"): (1, 1, 1.0, 2.0)}),
        }

    totals = bench.attribute(Fake(), "/p/fd/", "/p/plugin/", "/p/plugin/testing/")
    assert totals["plugin"] == pytest.approx(1.0 + 1.0) and totals["stand-ins"] == pytest.approx(1.0 + 1.0)
    assert totals["fastdeploy"] == pytest.approx(1.0)


def test_the_overlap_row_takes_the_count(benchmark_script):
    """``--overlap-count``: the ``all,overlap`` row's ``FD_ASYNC_COPY_OVERLAP_COUNT`` (default ``exact``)."""
    bench = benchmark_script("real_steps_host_time")
    assert bench.configurations("fd24")[-1].env == (("FD_ASYNC_COPY_OVERLAP_COUNT", "exact"),)
    assert bench.configurations("fd24", "prepare")[-1].env == (("FD_ASYNC_COPY_OVERLAP_COUNT", "prepare"),)
    with pytest.raises(SystemExit):
        bench.main(["--replica", "fd24", "--overlap-count", "fast"])
