"""``benchmarks/step_model.py --dry-run`` (fake clock, no GPU) with issue 40's options: the host
phases from a measured split (``--host-split``, the JSON ``overlap_exact_phases.py`` writes) and a
finishing pattern (``--finishes``). Logic checks of the model, not measurements. The script must
import without Paddle, so it runs in a subprocess (this process may have imported Paddle)."""

from __future__ import annotations

import subprocess
import json
import os
import re
import sys

import pytest

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "step_model.py")


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, PATH, *argv], capture_output=True, text=True, timeout=300)


def _split(tmp_path, worker=0.0, independent=100.0, mixed=100.0, dependent=200.0):
    phases = {"w": {"class": "worker", "host_us": worker}, "i": {"class": "independent", "host_us": independent},
              "m": {"class": "mixed", "host_us": mixed}, "d": {"class": "dependent", "host_us": dependent},
              "p": {"class": "post", "host_us": 5000.0}, "s": {"class": "save", "host_us": 50.0},
              "x": {"class": "stand-in", "host_us": 999.0}}
    path = tmp_path / "split.json"
    path.write_text(json.dumps({"batches": {"64": {"phases": phases}}}))
    return str(path)


def _ms(out: str, variant: str) -> float:
    row = next(line for line in out.splitlines() if line.startswith(f"  {variant} ") and "x " in line)
    return float(row[len(variant) + 2:].split()[0])


def test_split_divides_prepare_only():
    code = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sm", {PATH!r})
sm = importlib.util.module_from_spec(spec); sys.modules["sm"] = sm; spec.loader.exec_module(sm)
split = {{"batches": {{"64": {{"phases": {{
    "w": {{"class": "worker", "host_us": 100.0}}, "i": {{"class": "independent", "host_us": 100.0}},
    "m": {{"class": "mixed", "host_us": 100.0}}, "d": {{"class": "dependent", "host_us": 100.0}},
    "p": {{"class": "post", "host_us": 9000.0}}}}}}}}}}
cfg, base = sm.split_config(sm.CONFIGS["hostheavy"], split, "64", "x.json"), sm.CONFIGS["hostheavy"]
c = sm.replace(base, finishes=(1, 3))
print(json.dumps([cfg.prepare_ms, cfg.between_ms, cfg.save_ms, base.prepare_ms, base.between_ms, base.save_ms,
                  cfg.worker_ms, cfg.movable_ms, [c.inserts_at(n) for n in range(7)]]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    p, b, sv, bp, bb, bs, worker, movable, inserts = json.loads(done.stdout.strip().splitlines()[-1])
    assert (p, b, sv) == (bp, bb, bs)  # between and save stay the config's; prepare keeps its total
    assert worker == pytest.approx(bp / 4) and movable == pytest.approx(bp / 2)
    assert inserts == [0, 1, 2, 3, 1, 2, 3]  # refills of the last step's finishes, cycling 1..3


def test_prep_first_runs_the_count_free_prepare_before_prepares_wait(tmp_path):
    path = _split(tmp_path)
    out = _run("--dry-run", "--quick", "--only", "hostheavy", "--host-split", path + ":64").stdout
    prepare, first, bound = _ms(out, "overlap, prepare"), _ms(out, "prepare, prep first"), _ms(out, "fd24+overlap")
    # hostheavy: the forward (3 ms) cannot hide prepare after the wait; half of prepare moved ahead of it
    movable = 1.4 / 2  # hostheavy's prepare (1.40 ms), half of it independent + mixed in the split
    assert first == pytest.approx(prepare - movable, abs=0.05)
    assert bound < first < prepare
    assert "prepare, prep first (the count-independent and mixed prepare" in out and "prep first / bound" in out
    assert "0 mismatches" in out


def test_without_a_split_there_is_no_prep_first_row():
    out = _run("--dry-run", "--quick", "--only", "hostheavy").stdout
    assert "overlap, prepare" in out and "prep first" not in out


def test_finishes_refill_every_step_and_an_insert_flushes_the_pending_save():
    """1-3 finishes a step: every step inserts, and the plugin's insert flushes the pending save first
    (its get_tasks/insert flush), so bound's overlap is lost as prepare's is."""
    out = _run("--dry-run", "--quick", "--only", "hostheavy", "--finishes", "1-3", "--insert-ms", "0").stdout
    assert "finishing pattern 1-3 per step" in out
    assert _ms(out, "fd24+overlap") == pytest.approx(_ms(out, "overlap, prepare"), abs=0.05)
    assert _ms(out, "fd24+overlap") == pytest.approx(_ms(out, "fd24+one-wait"), abs=0.05)
    assert "0 mismatches" in out


@pytest.mark.parametrize("argv", [["--finishes", "3-1"], ["--finishes", "x"], ["--host-split", "/nonexistent.json"]])
def test_bad_options_are_one_line_errors(argv):
    done = _run("--dry-run", "--quick", "--only", "hostheavy", *argv)
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert re.search(r"error: --(finishes|host-split)", err[-1]) and "Traceback" not in "\n".join(err)


def test_exact_at_launch_leaves_only_the_trim_after_the_wait(tmp_path):
    """``exact, at launch``: all of prepare sized by the bound, then the wait and the trim right
    before the forward: bound's time plus the wake-up and the trim, whatever the split says."""
    out = _run("--dry-run", "--quick", "--only", "hostheavy", "--host-split", _split(tmp_path) + ":64").stdout
    prepare, first, launch, bound = (_ms(out, v) for v in ("overlap, prepare", "prepare, prep first", "exact, at launch",
                                                          "fd24+overlap"))
    assert bound < launch < first < prepare
    assert launch == pytest.approx(bound + 0.04, abs=0.05)  # TRIM_MS after the wait
    assert re.search(r"at launch / bound 1\.0[0-2]\dx", out) and "0 mismatches" in out


def _call(expression: str):
    """``expression`` over the script loaded as ``sm``, in a subprocess (it must import without Paddle,
    which this process may have imported); its value back as JSON."""
    code = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sm", {PATH!r})
sm = importlib.util.module_from_spec(spec); sys.modules["sm"] = sm; spec.loader.exec_module(sm)
print(json.dumps({expression}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_captured_sizes_and_the_size_a_count_replays():
    """FD 2.4's decode capture list (config.py) and ``real_shape_to_captured_size``: the smallest
    captured size >= the count."""
    s64, s60, s256, s1024, mapped = _call(
        "[sm.captured_sizes(64), sm.captured_sizes(60), sm.captured_sizes(256), sm.captured_sizes(1024), "
        "[sm.captured_size(sm.captured_sizes(256), n) for n in (0, 1, 3, 4, 5, 16, 17, 129, 256)]]")
    assert s64 == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert s60[-2:] == [56, 60]  # max_num_seqs itself is captured
    assert s256[-9:] == [128, 144, 160, 176, 192, 208, 224, 240, 256]
    assert s1024[-2:] == [480, 512]  # capped at 512
    assert mapped == [0, 1, 4, 4, 8, 16, 24, 144, 256]


def test_graph_size_decisions_bound_their_cases():
    none_eos, all_eos, half = _call("[sm.graph_size_decisions(64, (1, 3), e, k, batches=20) "
                                    "for e, k in ((0.0, 0.0), (1.0, 0.0), (1.0, 0.5))]")
    assert none_eos["decided"] == none_eos["exact_known"] == none_eos["guess_same"] == 1.0
    assert none_eos["bound_same"] < 0.9  # a finish crossing a size edge: the bound replays another graph
    assert all_eos["decided"] == all_eos["exact_known"] == 0.0  # every running slot could end by EOS
    assert all_eos["guess_same"] == all_eos["bound_same"]  # nothing known: the guess is the bound
    assert all_eos["guess_same"] < half["guess_same"] < 1.0


def test_graph_sizes_option_prints_its_table_and_runs_no_schedule():
    done = _run("--graph-sizes", "--finishes", "1-3")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "FD 2.4 capture sizes at max_num_seqs=64: 1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d\.\d\d\s+\d\.\d\d\s+\d+\s", line)]
    assert len(rows) == len(_call("sm.GRAPH_CASES")) and "RESULT" not in out and "fd24" not in out
