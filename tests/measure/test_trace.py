"""The step trace: Chrome trace-event JSON from `bench --trace` and FD_ASYNC_COPY_TRACE."""

from __future__ import annotations

import json

import pytest

from fd_async_copy_plugin import sync_check, trace
from fd_async_copy_plugin.cli.bench import TRACE_VARIANTS, write_trace
from fd_async_copy_plugin.testing.harness import CENSUS_VARIANTS, run_variant
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request

pytestmark = pytest.mark.usefixtures("plugin_off")

PHASES = {"prepare", "forward launch", "logits", "sampler", "post-process", "save"}


def check_format(data) -> None:
    """Independent of trace.validate: the fields every trace-event viewer reads."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    for e in data["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "i", "M", "B", "E")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g")


def spans(data, tid, cat=None):
    return [e for e in data["traceEvents"] if e["ph"] == "X" and e["tid"] == tid and (cat is None or e.get("cat") == cat)]


def inside(inner, outer) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


@pytest.fixture(scope="module")
def bench_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "bench.json"
    sync_check.stop()
    info = write_trace(str(path), steps=4)
    with open(path, encoding="utf-8") as f:
        return info, json.load(f)


def test_bench_trace_is_trace_event_json_with_one_track_per_variant(bench_trace):
    info, data = bench_trace
    check_format(data)
    assert trace.validate(data) == []
    names = {e["tid"]: e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(names.values()) == sorted(TRACE_VARIANTS) and info["tracks"] == list(TRACE_VARIANTS)
    for tid in names:
        steps = spans(data, tid, "step")
        assert len(steps) == 4
        # every phase and wait lies inside a step, and waits inside a phase nest in it
        for e in spans(data, tid, "phase") + spans(data, tid, "wait"):
            assert any(inside(e, s) for s in steps), e


def test_bench_trace_shows_the_phases_and_the_census_waits(bench_trace):
    _, data = bench_trace
    tids = {e["args"]["name"]: e["tid"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    unpatched, plugin = tids["fd24-unpatched"], tids["fd24-plugin"]
    assert {e["name"] for e in spans(data, unpatched, "phase")} >= PHASES - {"save"} | {"save"}
    decode_steps = spans(data, unpatched, "step")[1:]  # after the prefill step
    waits = spans(data, unpatched, "wait")
    per_step = [[w["name"] for w in waits if inside(w, s)] for s in decode_steps]
    # FD 2.4's waits inside execute_model (its worker loop's exist_prefill runs before it)
    assert all(sorted(p) == sorted(["wait S1", "wait S2", "wait S3/S7", "wait T", "wait S5", "wait S6"]) for p in per_step), per_step
    assert all(w["args"]["site"] and w["args"]["what"] for w in waits)
    t_wait = next(w for w in waits if w["name"] == "wait T")
    sampler = [p for p in spans(data, unpatched, "phase") if p["name"] == "sampler"]
    assert any(inside(t_wait, p) for p in sampler)  # T is the sampling op's wait
    plugin_waits = [[w["name"] for w in spans(data, plugin, "wait") if inside(w, s)] for s in spans(data, plugin, "step")[1:]]
    assert all(p == ["wait save event"] for p in plugin_waits), plugin_waits
    # the plugin's copies and events as instant events on its track
    instants = [e for e in data["traceEvents"] if e["ph"] == "i" and e["tid"] == plugin]
    assert any(e["name"].startswith("event record") for e in instants)
    assert any(e["name"].startswith("async_d2h") for e in instants)


@pytest.mark.parametrize("broken, problem", [
    ({"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
                      {"name": "b", "ph": "X", "pid": 1, "tid": 1, "ts": 5, "dur": 10}]}, "without nesting"),
    ({"traceEvents": [{"name": "a", "ph": "B", "pid": 1, "tid": 1, "ts": 0}]}, "never ended"),
    ({"traceEvents": [{"name": "a", "ph": "E", "pid": 1, "tid": 1, "ts": 0}]}, "E without B"),
    ({"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 0}]}, "needs dur"),
    ({"traceEvents": [{"name": "a", "ph": "Q", "pid": 1, "tid": 1, "ts": 0}]}, "unknown ph"),
    ({"traceEvents": [{"name": "a", "ph": "i", "pid": "1", "tid": 1, "ts": 0}]}, "integers"),
    ({"traceEvents": [{"name": "a", "ph": "i", "pid": 1, "tid": 1, "ts": -1}]}, "ts must be"),
    ({"events": []}, "no traceEvents"),
])
def test_validate_finds_each_kind_of_broken_trace(broken, problem):
    problems = trace.validate(broken)
    assert problems and problem in problems[0], problems


def test_validate_accepts_nested_and_sequential_spans_on_separate_tracks():
    ok = {"traceEvents": [
        {"name": "step", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"name": "prepare", "ph": "X", "pid": 1, "tid": 1, "ts": 1, "dur": 3},
        {"name": "wait", "ph": "X", "pid": 1, "tid": 1, "ts": 2, "dur": 1},
        {"name": "save", "ph": "X", "pid": 1, "tid": 1, "ts": 4, "dur": 6},
        {"name": "other", "ph": "X", "pid": 1, "tid": 2, "ts": 5, "dur": 10},
        {"name": "b", "ph": "B", "pid": 1, "tid": 3, "ts": 1}, {"name": "b", "ph": "E", "pid": 1, "tid": 3, "ts": 2},
    ]}
    assert trace.validate(ok) == []


def test_fd_async_copy_trace_env_writes_the_file_after_its_steps(tmp_path, monkeypatch):
    """FD_ASYNC_COPY_TRACE in a worker: the entry point's path, on the replica (tracking as the source)."""
    path = tmp_path / "worker-{pid}.json"
    env = {"FD_ASYNC_COPY_TRACE": str(path), "FD_ASYNC_COPY_TRACE_STEPS": "3", "FD_ASYNC_COPY_SYNC_CHECK_WARMUP": "1"}
    saved_census = trace_census()
    try:
        assert trace.install_from_env(root=ROOTS["fd24"], environ=env) is not None
        checker = sync_check.checker()
        assert checker is not None and checker.settings.mode == "count"  # the trace arms the check
        config = DriverConfig(max_num_seqs=3, vocab_size=128, max_model_len=64, block_size=64)
        requests = [Request(f"r{i}", [3 + i, 4, 5], max_tokens=8, eos_token_ids=[200]) for i in range(3)]
        run_variant(CENSUS_VARIANTS["fd24-plugin"], config, requests, max_steps=40, track=True)
    finally:
        t = trace.tracer()
        trace.activate(None)
        restore_census(saved_census)
    written = tmp_path / f"worker-{__import__('os').getpid()}.json"
    data = json.loads(written.read_text())
    assert trace.validate(data) == [] and t.written
    assert len([e for e in data["traceEvents"] if e.get("cat") == "step"]) == 3


def trace_census():
    from fd_async_copy_plugin.runtime import census
    from fd_async_copy_plugin.runtime.backend import CopyBackend
    from fd_async_copy_plugin.runtime.cuda import RuntimeBackend

    return census._ACTIVE, CopyBackend.__dict__["record"], RuntimeBackend.__dict__["_issue"]


def restore_census(saved):
    from fd_async_copy_plugin.runtime import census
    from fd_async_copy_plugin.runtime.backend import CopyBackend
    from fd_async_copy_plugin.runtime.cuda import RuntimeBackend

    census._ACTIVE, CopyBackend.record, RuntimeBackend._issue = saved


def test_a_bad_trace_steps_value_traces_nothing(tmp_path):
    assert trace.install_from_env({"FD_ASYNC_COPY_TRACE": str(tmp_path / "t.json"), "FD_ASYNC_COPY_TRACE_STEPS": "0"}) is None
    assert trace.tracer() is None


def test_bench_cli_accepts_trace(tmp_path):
    from fd_async_copy_plugin.cli import build_parser

    args = build_parser().parse_args(["bench", "--smoke", "--trace", str(tmp_path / "t.json"), "--trace-steps", "3"])
    assert args.trace == str(tmp_path / "t.json") and args.trace_steps == 3


# ---- issue 41: the trace writes regular files only, and says so before any work ----------------

import os  # noqa: E402
import stat  # noqa: E402


def _special_paths(tmp_path):
    """A symlink (to a file whose content must stay), a FIFO, a directory and a device node."""
    target = tmp_path / "target.json"
    target.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    directory = tmp_path / "dir.json"
    directory.mkdir()
    return {"a symbolic link": link, "a FIFO": fifo, "a directory": directory, "a character device": "/dev/null"}


def test_trace_write_never_replaces_a_path_that_is_not_a_regular_file(tmp_path):
    recorder = trace.Trace("t")
    for kind, path in _special_paths(tmp_path).items():
        before = os.lstat(path)
        assert kind in trace.path_problem(str(path))
        with pytest.raises(OSError, match=kind):
            recorder.write(str(path))
        after = os.lstat(path)
        assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino, kind
    assert (tmp_path / "target.json").read_text() == "keep"  # the link's target untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "fifo.json", "link.json", "target.json"]
    assert list((tmp_path / "dir.json").iterdir()) == []  # no PATH.tmp left behind anywhere


def test_trace_write_replaces_a_regular_file_and_keeps_its_mode(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("old")
    path.chmod(0o640)
    trace.Trace("t").write(str(path))
    assert json.loads(path.read_text())["traceEvents"] and stat.S_IMODE(path.stat().st_mode) == 0o640
    new = tmp_path / "new.json"
    trace.Trace("t").write(str(new))
    assert stat.S_IMODE(new.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "t.json"]


@pytest.mark.parametrize("bad", ["missing-dir/t.json", "dir.json", "fifo.json", "link.json"])
def test_bench_refuses_a_bad_trace_path_before_any_work(tmp_path, bad, monkeypatch, capsys):
    from fd_async_copy_plugin.cli import main
    from fd_async_copy_plugin.testing import harness

    _special_paths(tmp_path)

    def no_work(*args, **kwargs):
        raise AssertionError("the benchmark ran before the trace path was checked")

    monkeypatch.setattr(harness, "run_variant", no_work)
    assert main(["bench", "--smoke", "--trace", str(tmp_path / bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fd-async-copy bench FAILED: --trace") and "\n" not in err and "Traceback" not in err
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("steps", ["0", "1001", "\u0663", "1_0", "+3", "ten"])
def test_trace_steps_is_ascii_digits_from_1_to_the_bound(steps):
    with pytest.raises(trace.TraceConfigError, match="an integer from 1 to 1000"):
        trace.parse_trace_steps(steps)
    assert trace.parse_trace_steps("1000") == trace.MAX_TRACE_STEPS and trace.parse_trace_steps(None) == 20


def test_a_bad_trace_env_arms_nothing_and_logs_one_line(tmp_path, caplog):
    paths = _special_paths(tmp_path)
    env = {"FD_ASYNC_COPY_TRACE": str(paths["a FIFO"])}
    with caplog.at_level("ERROR", logger="fd_async_copy"):
        assert trace.install_from_env(root=ROOTS["fd24"], environ=env) is None
    assert trace.tracer() is None and sync_check.checker() is None  # the trace alone armed nothing
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "FD_ASYNC_COPY_TRACE=" in errors[0] and "a FIFO" in errors[0] and "\n" not in errors[0]


def test_doctor_shows_and_validates_the_trace_settings(tmp_path, capsys):
    from fd_async_copy_plugin.cli import doctor

    paths = _special_paths(tmp_path)
    good = doctor.diagnose(environ={"FD_ASYNC_COPY_TRACE": str(tmp_path / "w-{pid}.json"),
                                    "FD_ASYNC_COPY_TRACE_STEPS": "5"})
    assert good["trace"] == {"on": True, "path": str(tmp_path / "w-{pid}.json"), "steps": 5}
    assert good["env"]["FD_ASYNC_COPY_TRACE_STEPS"] == "5"
    assert "step trace        5 decode steps" in doctor.format_report(good)
    bad = doctor.diagnose(environ={"FD_ASYNC_COPY_TRACE": str(paths["a symbolic link"]),
                                   "FD_ASYNC_COPY_TRACE_STEPS": "1_0"})
    error = bad["trace"]["config_error"]
    assert "FD_ASYNC_COPY_TRACE_STEPS='1_0'" in error and "a symbolic link" in error
    assert "CONFIG ERROR" in doctor.format_report(bad)
