"""``benchmarks/real_steps_host_time.py`` on the replica (CI has no FastDeploy tree): it runs, prints
one row per batch, logprobs setting and configuration, and attributes the plugin's frames."""

from __future__ import annotations

import json
import math

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


# --- the sampler (``--sampler``): py-spy's samples of a child, attributed by owner -------------------

def speedscope(*stacks, threads=None):
    """A speedscope file as py-spy writes it: shared frames, one profile per thread, each sample a
    list of frame indices outermost first."""
    frames, index = [], {}

    def at(frame):
        if frame not in index:
            index[frame] = len(frames)
            frames.append({"name": frame[1], "file": frame[0], "line": 1, "col": None})
        return index[frame]

    profiles = []
    for samples in (threads or [stacks]):
        profiles.append({"type": "sampled", "name": "Thread", "unit": "seconds", "startValue": 0,
                         "endValue": 1, "samples": [[at(f) for f in s] for s in samples],
                         "weights": [0.001] * len(samples)})
    return {"shared": {"frames": frames}, "profiles": profiles}


BENCH = ("/r/benchmarks/real_steps_host_time.py", "main")
DRIVER = ("/p/fd_async_copy_plugin/testing/reference/driver.py", "run_decode")
FD = ("/fd/fastdeploy/worker/gpu_model_runner.py", "execute_model")
PLUGIN = ("/p/fd_async_copy_plugin/runtime/backend.py", "read")
CENSUS = ("/p/fd_async_copy_plugin/runtime/census.py", "begin_step")
PADDLE = ("/lib/paddle/tensor/creation.py", "arange")
BEGIN = [BENCH, DRIVER, ("/r/benchmarks/real_steps_host_time.py", "_sampled_window_begins")]
END = [BENCH, ("/r/benchmarks/real_steps_host_time.py", "_sampled_window_ends")]


def owners(bench, fd_dir="/fd/fastdeploy/", cwd="/r"):
    return bench.Owners(fd_dir, "/p/fd_async_copy_plugin/", "/p/fd_async_copy_plugin/testing/",
                              "/r/benchmarks/real_steps_host_time.py", cwd=cwd)


def test_sampled_counts_only_the_marked_windows(benchmark_script):
    """Samples count between a begin marker and the next end marker (markers excluded); a window
    whose end the sampler missed is dropped; only the marked thread counts."""
    bench = benchmark_script("real_steps_host_time")
    window = [[BENCH, DRIVER, FD], [BENCH, DRIVER, FD, PLUGIN], [BENCH, DRIVER, FD, PLUGIN, PADDLE]]
    main = [[BENCH, DRIVER, FD, PLUGIN]] * 5 + [BEGIN] * 3 + window + [END] * 2 + [[BENCH, DRIVER, FD]] * 4 \
        + [BEGIN, [BENCH, DRIVER, FD], BEGIN, [BENCH, DRIVER, PADDLE], END]
    other_thread = [[("/lib/threading.py", "run"), PLUGIN]] * 7
    figures = bench.sampled_figures(speedscope(threads=[main, other_thread]), owners(bench))
    assert figures["windows"] == 2
    assert (figures["plugin"], figures["fastdeploy"], figures["stand-ins"], figures["other"]) == (2, 1, 1, 0)
    assert figures["plugin_over_fastdeploy"] == 2.0


def test_a_sample_goes_to_its_innermost_owned_frame(benchmark_script):
    """Unowned frames (Paddle, numpy, builtins) go to the nearest owned caller; plugin code a stand-in
    calls is the stand-ins' (as in the profiled attribution), where FastDeploy calls it the plugin's;
    a stack with no owned frame is "other"."""
    bench = benchmark_script("real_steps_host_time")
    owner = owners(bench)
    assert bench.sample_owner([BENCH, DRIVER, FD, PADDLE], owner) == ("fastdeploy", 2)
    assert bench.sample_owner([BENCH, DRIVER, FD, PLUGIN, PADDLE, PADDLE], owner) == ("plugin", 3)
    assert bench.sample_owner([BENCH, DRIVER, FD, PLUGIN, CENSUS, PADDLE], owner) == ("plugin", 4)
    assert bench.sample_owner([BENCH, DRIVER, PADDLE, CENSUS], owner) == ("stand-ins", 3)
    assert bench.sample_owner([BENCH, DRIVER, PADDLE], owner) == ("stand-ins", 1)
    assert bench.sample_owner([("/lib/threading.py", "run"), PADDLE], owner) == ("other", None)
    assert bench.sample_owner([("/lib/threading.py", "run"), PLUGIN], owner) == ("plugin", 1)
    stacks = [BEGIN, [BENCH, DRIVER, FD, PLUGIN, PADDLE], [BENCH, DRIVER, FD, CENSUS], [BENCH, DRIVER, FD, PLUGIN], END]
    top = bench.sampled_figures(speedscope(*stacks), owner, top=1, shown=lambda f: f.split("/p/")[1])["plugin_top"]
    assert top == ["     2 samples  fd_async_copy_plugin/runtime/backend.py read"]


def test_files_as_py_spy_names_them(benchmark_script):
    """Relative files (to the child's folder) and the package seen through another path still match."""
    bench = benchmark_script("real_steps_host_time")
    owner = owners(bench, fd_dir="/t/fd24/fastdeploy/", cwd="/t")
    assert owner("fd24/fastdeploy/worker/input_batch.py") == "fastdeploy"
    assert owner("/elsewhere/fd24/fastdeploy/worker/input_batch.py") == "fastdeploy"
    assert owner("/site/fd_async_copy_plugin/patches/step.py") == "plugin"
    assert owner("/site/fd_async_copy_plugin/testing/real_steps/pinned.py") == "stand-ins"
    assert owner("benchmarks/real_steps_host_time.py") == "stand-ins"
    assert owner("/r/benchmarks/real_steps_host_time.py") == "stand-ins"
    assert owner("/lib/python3.11/site-packages/paddle/tensor/math.py") is None
    assert owner("<frozen importlib._bootstrap>") is None and owner("") is None


def test_on_the_replica_its_tree_is_fastdeploy(benchmark_script):
    """``--replica``: ``testing/reference/<line>/`` stands for FastDeploy, the rest of ``testing/`` is the stand-ins."""
    bench = benchmark_script("real_steps_host_time")
    owner = owners(bench, fd_dir="/p/fd_async_copy_plugin/testing/reference/fd24/")
    assert owner("/p/fd_async_copy_plugin/testing/reference/fd24/worker/gpu_model_runner.py") == "fastdeploy"
    assert owner("/q/fd_async_copy_plugin/testing/reference/fd24/worker/gpu_model_runner.py") == "fastdeploy"
    assert owner("/p/fd_async_copy_plugin/testing/reference/fd25/worker/gpu_model_runner.py") == "stand-ins"
    assert owner("/p/fd_async_copy_plugin/testing/reference/driver.py") == "stand-ins"
    assert owner("/p/fd_async_copy_plugin/runtime/backend.py") == "plugin"
    replica_fd = ("/p/fd_async_copy_plugin/testing/reference/fd24/worker/gpu_model_runner.py", "execute_model")
    assert bench.sample_owner([BENCH, DRIVER, replica_fd, PLUGIN, PADDLE], owner) == ("plugin", 3)
    assert bench.sample_owner([BENCH, DRIVER, replica_fd, PADDLE], owner) == ("fastdeploy", 2)


def test_the_interval_is_wilsons_on_the_share_mapped_to_the_ratio(benchmark_script):
    bench = benchmark_script("real_steps_host_time")
    low, high = bench.wilson(20, 100)
    assert (low, high) == (pytest.approx(0.1333, abs=1e-4), pytest.approx(0.2888, abs=1e-4))
    stacks = [BEGIN] + [[BENCH, DRIVER, FD, PLUGIN]] * 20 + [[BENCH, DRIVER, FD]] * 80 + [[BENCH, DRIVER]] * 3 \
        + [[("/lib/x.py", "f")]] + [END]
    figures = bench.sampled_figures(speedscope(*stacks), owners(bench))
    assert figures["plugin_over_fastdeploy"] == 0.25
    assert figures["interval95"] == [pytest.approx(low / (1 - low)), pytest.approx(high / (1 - high))]
    assert bench.sampled_line(figures) == ("sampled: plugin 20, fastdeploy 80, stand-ins 3, other 1 samples | "
                                           "plugin/fastdeploy 25.0% (95% interval 15.4-40.6%)")
    none = bench.sampled_figures(speedscope(BEGIN, [BENCH, DRIVER, PLUGIN], END), owners(bench))
    assert none["plugin_over_fastdeploy"] is None and bench.sampled_line(none).endswith("| plugin/fastdeploy -")


def fake_py_spy(tmp_path, body: str) -> str:
    import sys

    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\nimport json, subprocess, sys\nargv = sys.argv[1:]\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_without_py_spy_the_bench_goes_on(capsys, benchmark_script, tmp_path):
    """py-spy missing or failing (no ptrace permission): ``sampled: - (why)`` and the bench goes on."""
    bench = benchmark_script("real_steps_host_time")
    failing = fake_py_spy(tmp_path, "print('Error: Permission denied (os error 1)'); sys.exit(1)")
    for given, why in ((str(tmp_path / "absent"), "py-spy not found"), (failing, "py-spy exited 1: Error: Permission")):
        assert bench.main(["--replica", "fd24", "--batches", "2", "--steps", "3", "--rounds", "1", "--top", "0",
                           "--sampler", "--py-spy", given, "--json", str(tmp_path / "rows.json")]) == 0
        out = capsys.readouterr().out.splitlines()
        sampled = [line.strip() for line in out if "sampled:" in line]
        assert len(sampled) == 6 and all(line.startswith(f"sampled: - ({why}") for line in sampled)
        assert out[-1] == "RESULT: MEASURED"
        rows = json.loads((tmp_path / "rows.json").read_text())
        assert all(row["sampled"]["error"].startswith(why) for row in rows)
    bench.main(["--replica", "fd24", "--batches", "2", "--steps", "3", "--rounds", "1", "--top", "0"])
    assert "sampled:" not in capsys.readouterr().out  # off by default


def test_the_child_runs_the_row_under_py_spy(benchmark_script, tmp_path):
    """The row's parameters reach the child (this script, hidden child mode) that py-spy records,
    and its speedscope file is read back (and kept with ``--sample-out``)."""
    bench = benchmark_script("real_steps_host_time")
    file = ("benchmarks/real_steps_host_time.py", "x")
    recorded = {"shared": {"frames": [{"name": "_sampled_window_begins", "file": file[0]},
                                      {"name": "f", "file": "fd_async_copy_plugin/patches/step.py"},
                                      {"name": "_sampled_window_ends", "file": file[0]}]},
                "profiles": [{"samples": [[0], [1], [1], [2]]}]}
    spy = fake_py_spy(tmp_path, f"""
open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(argv))
child = argv[argv.index('--') + 1:]
code = subprocess.run(child + ['--sample-runs', '0']).returncode  # the child's parser, not its runs
open(argv[argv.index('-o') + 1], 'w').write(json.dumps({recorded!r}))
sys.exit(code)""")
    args = bench.argparse.Namespace(fd_root=None, replica="fd24", steps=3, vocab=64, overlap_count="prepare",
                                    sample_runs=5, sample_rate=250, sample_timeout=300, top=2,
                                    sample_out=str(tmp_path / "kept"))
    owner = bench.Owners(None, "/nowhere/fd_async_copy_plugin/", "/nowhere/fd_async_copy_plugin/testing/")
    figures = bench.sample_row(args, spy, 2, True, "all,overlap", owner)
    assert figures["plugin"] == 2 and figures["windows"] == 1 and figures["runs"] == 5 and figures["rate_hz"] == 250
    assert json.loads((tmp_path / "kept" / "B2-logprobs-all-overlap.speedscope.json").read_text()) == recorded
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:argv.index("--")] == ["record", "--nonblocking", "-r", "250", "-f", "speedscope", "-o", argv[7]]
    child = argv[argv.index("--") + 1:]
    assert child[1] == bench.__file__ and child[2:] == [
        "--replica", "fd24", "--batches", "2", "--steps", "3", "--vocab", "64", "--overlap-count", "prepare",
        "--sample-runs", "5", "--sampled-child", "1/all,overlap"]


def test_the_child_marks_each_window(benchmark_script, monkeypatch):
    """The child runs the loop ``--sample-runs`` times, marking each step window: the begin marker
    after the first (prefill) step's ``census.begin_step``, before the second's, the end after the last step."""
    from fd_async_copy_plugin.runtime import census

    bench = benchmark_script("real_steps_host_time")
    events, steps = [], []
    original = census.begin_step

    def begin_step(*args, **kwargs):
        steps.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(census, "begin_step", begin_step)
    monkeypatch.setattr(bench, "_sampled_window_begins", lambda: events.append(("begins", len(steps))))
    monkeypatch.setattr(bench, "_sampled_window_ends", lambda: events.append(("ends", len(steps))))
    assert bench.main(["--replica", "fd24", "--batches", "2", "--steps", "3", "--sample-runs", "2",
                       "--sampled-child", "0/default"]) == 0
    per_run = len(steps) // 2
    assert per_run >= 3 and events == [("begins", 1), ("ends", per_run), ("begins", per_run + 1), ("ends", 2 * per_run)]


def test_py_spy_samples_the_replica(capsys, benchmark_script, tmp_path):
    """With py-spy (not in CI): every row gets its sampled counts; unpatched, nothing of the plugin."""
    bench = benchmark_script("real_steps_host_time")
    if bench.find_py_spy(None) is None:
        pytest.skip("py-spy is not installed")
    assert bench.main(["--replica", "fd24", "--batches", "2", "--steps", "6", "--rounds", "1", "--top", "0",
                       "--sampler", "--sample-runs", "3", "--json", str(tmp_path / "rows.json")]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "rows.json").read_text())
    errors = [row["sampled"]["error"] for row in rows if "error" in row["sampled"]]
    if errors and all("ermission" in e or "ptrace" in e for e in errors):
        pytest.skip(f"py-spy may not read the child here: {errors[0]}")
    assert not errors, out
    assert all(row["sampled"]["windows"] == 3 for row in rows)
    assert all(row["sampled"]["plugin"] == 0 for row in rows if row["configuration"] == "unpatched")
    assert sum(row["sampled"]["plugin"] for row in rows if row["configuration"] != "unpatched") > 0


def test_each_row_prints_its_sampled_line(capsys, benchmark_script, tmp_path):
    """Under every row its sampled line, in ``--json`` its figures; with ``--top``, under a plugin
    row the plugin's largest sampled frames; a file without a marked window is a reason, not a figure."""
    bench = benchmark_script("real_steps_host_time")
    frames = [{"name": "_sampled_window_begins", "file": "benchmarks/real_steps_host_time.py"},
              {"name": "f", "file": "/x/fd_async_copy_plugin/patches/step.py"},
              {"name": "g", "file": "/x/fd_async_copy_plugin/testing/reference/fd24/worker/runner.py"},
              {"name": "_sampled_window_ends", "file": "benchmarks/real_steps_host_time.py"}]
    recorded = {"shared": {"frames": frames}, "profiles": [{"samples": [[0], [2, 1], [2], [2], [3]]}]}
    spy = fake_py_spy(tmp_path, f"open(argv[argv.index('-o') + 1], 'w').write(json.dumps({recorded!r}))")
    assert bench.main(["--replica", "fd24", "--batches", "2", "--steps", "3", "--rounds", "1", "--top", "1",
                       "--sampler", "--py-spy", spy, "--json", str(tmp_path / "rows.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    line = ("    sampled: plugin 1, fastdeploy 2, stand-ins 0, other 0 samples | plugin/fastdeploy 50.0% "
            "(95% interval 6.6-381.6%)")
    rows = [i for i, text in enumerate(out) if text.strip().startswith("B=2")]
    for i in rows:
        assert out[i + 1] == line if " unpatched " in out[i] else out[i + 2] == line
        if " unpatched " not in out[i]:  # the profiled top (one line), the sampled line, the sampled top
            assert out[i + 3] == "           1 samples  /x/fd_async_copy_plugin/patches/step.py f"
            # then the row beside the unpatched one (both: 3 samples per window)
            assert out[i + 4].startswith("    host Python for the same work (plugin + fastdeploy) over unpatched: ")
            assert out[i + 4].endswith(", sampled 1.00x (95% interval 0.20-4.95x)")
    saved = json.loads((tmp_path / "rows.json").read_text())
    assert all(row["sampled"]["plugin"] == 1 and row["sampled"]["windows"] == 1 for row in saved)
    assert all(("beside_unpatched" in row) == (row["configuration"] != "unpatched") for row in saved)
    assert all(("plugin_top" in row["sampled"]) == (row["configuration"] != "unpatched") for row in saved)

    recorded["profiles"][0]["samples"] = [[1], [2]]
    spy = fake_py_spy(tmp_path, f"open(argv[argv.index('-o') + 1], 'w').write(json.dumps({recorded!r}))")
    args = bench.argparse.Namespace(fd_root=None, replica="fd24", steps=3, vocab=64, overlap_count="exact",
                                    sample_runs=4, sample_rate=1000, sample_timeout=60, top=0)
    assert bench.sample_row(args, spy, 2, False, "default", None) == {
        "error": "no step window in the samples (of 4 runs)"}
    slow = fake_py_spy(tmp_path, "import time; time.sleep(30)")
    assert bench.sample_row(bench.argparse.Namespace(**dict(vars(args), sample_timeout=1)), slow, 2, False,
                            "default", None) == {"error": "py-spy timed out after 1 s"}


def test_py_spy_is_found_on_path_or_beside_python(benchmark_script, tmp_path, monkeypatch):
    bench = benchmark_script("real_steps_host_time")
    beside = tmp_path / "venv" / "bin"
    beside.mkdir(parents=True)
    spy = fake_py_spy(beside, "pass")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(bench.sys, "executable", str(beside / "python"))
    assert bench.find_py_spy(None) == spy
    assert bench.find_py_spy(spy) == spy and bench.find_py_spy(str(tmp_path / "absent")) is None
    monkeypatch.setattr(bench.sys, "executable", str(tmp_path / "python"))
    assert bench.find_py_spy(None) is None
    monkeypatch.setenv("PATH", str(beside))
    assert bench.find_py_spy(None) == spy and bench.find_py_spy("py-spy") == spy


def test_a_plugin_row_beside_the_unpatched_one(benchmark_script):
    """Plugin and FastDeploy time together over the unpatched row's for the same work: per run (the
    profiled figures per step times steps; samples per window); the interval is the ratio's of two
    Poisson counts; no sampled figure, no sampled ratio."""
    bench = benchmark_script("real_steps_host_time")
    unpatched = {"profiled_us_per_step": {"plugin": 0.0, "fastdeploy": 400.0}, "steps": 10,
                 "sampled": {"plugin": 4, "fastdeploy": 396, "windows": 4}}
    row = {"profiled_us_per_step": {"plugin": 100.0, "fastdeploy": 260.0}, "steps": 11,  # (overlap: a step more)
           "sampled": {"plugin": 90, "fastdeploy": 270, "windows": 3}}
    figures = bench.beside_unpatched(row, unpatched)
    assert figures["profiled"] == pytest.approx(360 * 11 / 4000)
    assert figures["sampled"] == pytest.approx((360 / 3) / (400 / 4))  # 1.2: fewer windows, more in each
    spread = math.exp(1.96 * (1 / 360 + 1 / 400) ** 0.5)
    assert figures["interval95"] == pytest.approx([1.2 / spread, 1.2 * spread])
    assert bench.beside_line(figures) == ("host Python for the same work (plugin + fastdeploy) over unpatched: "
                                          "profiled 0.99x, sampled 1.20x (95% interval 1.04-1.38x)")
    failed = bench.beside_unpatched(row, dict(unpatched, sampled={"error": "py-spy not found"}))
    assert failed["sampled"] is None and failed["profiled"] == pytest.approx(0.99)
    assert bench.beside_line(failed).endswith("profiled 0.99x, sampled -")
