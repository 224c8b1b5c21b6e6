"""``benchmarks/step_model.py --dry-run`` (fake clock, no GPU) with issue 40's options: the host
phases from a measured split (``--host-split``, the JSON ``overlap_exact_phases.py`` writes) and a
finishing pattern (``--finishes``). Logic checks of the model, not measurements."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "step_model.py")


def _model():
    spec = importlib.util.spec_from_file_location("step_model_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


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
    sm = _model()
    split = {"batches": {"64": {"phases": {
        "w": {"class": "worker", "host_us": 100.0}, "i": {"class": "independent", "host_us": 100.0},
        "m": {"class": "mixed", "host_us": 100.0}, "d": {"class": "dependent", "host_us": 100.0},
        "p": {"class": "post", "host_us": 9000.0}}}}}
    cfg = sm.split_config(sm.CONFIGS["hostheavy"], split, "64", "x.json")
    base = sm.CONFIGS["hostheavy"]
    assert (cfg.prepare_ms, cfg.between_ms, cfg.save_ms) == (base.prepare_ms, base.between_ms, base.save_ms)
    assert cfg.worker_ms == pytest.approx(base.prepare_ms / 4) and cfg.movable_ms == pytest.approx(base.prepare_ms / 2)


def test_prep_first_runs_the_count_free_prepare_before_exacts_wait(tmp_path, capsys):
    sm = _model()
    path = _split(tmp_path)
    assert sm.main(["--dry-run", "--quick", "--only", "hostheavy", "--host-split", path + ":64"]) in (0, 1)
    out = capsys.readouterr().out
    exact, first, bound = _ms(out, "overlap, exact"), _ms(out, "exact, prep first"), _ms(out, "fd24+overlap")
    # hostheavy: the forward (3 ms) cannot hide prepare after the wait; half of prepare moved ahead of it
    movable = sm.CONFIGS["hostheavy"].prepare_ms / 2
    assert first == pytest.approx(exact - movable, abs=0.05)
    assert bound < first < exact
    assert "exact, prep first (the count-independent and mixed prepare" in out and "prep first / bound" in out
    assert "0 mismatches" in out


def test_without_a_split_there_is_no_prep_first_row(capsys):
    sm = _model()
    sm.main(["--dry-run", "--quick", "--only", "hostheavy"])
    assert "exact, prep first" not in capsys.readouterr().out


def test_finishes_refill_every_step_and_an_insert_flushes_the_pending_save(tmp_path, capsys):
    """1-3 finishes a step: every step inserts, and the plugin's insert flushes the pending save first
    (its get_tasks/insert flush), so bound's overlap is lost as exact's is."""
    sm = _model()
    cfg = sm.replace(sm.CONFIGS["hostheavy"], finishes=(1, 3))
    assert [cfg.inserts_at(n) for n in range(7)] == [0, 1, 2, 3, 1, 2, 3]
    sm.main(["--dry-run", "--quick", "--only", "hostheavy", "--finishes", "1-3", "--insert-ms", "0"])
    out = capsys.readouterr().out
    assert "finishing pattern 1-3 per step" in out
    assert _ms(out, "fd24+overlap") == pytest.approx(_ms(out, "overlap, exact"), abs=0.05)
    assert _ms(out, "fd24+overlap") == pytest.approx(_ms(out, "fd24+one-wait"), abs=0.05)
    assert "0 mismatches" in out


@pytest.mark.parametrize("argv", [["--finishes", "3-1"], ["--finishes", "x"], ["--host-split", "/nonexistent.json"]])
def test_bad_options_are_one_line_errors(argv, capsys):
    sm = _model()
    with pytest.raises(SystemExit) as info:
        sm.main(["--dry-run", "--quick", "--only", "hostheavy", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert re.search(r"error: --(finishes|host-split)", err[-1]) and "Traceback" not in "\n".join(err)
