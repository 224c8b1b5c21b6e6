"""benchmarks/plot_step_model.py: the picture comes from the recorded step model results."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "step_model.txt")


@pytest.fixture(scope="module")
def plot():
    spec = importlib.util.spec_from_file_location("plot_step_model", os.path.join(ROOT, "benchmarks", "plot_step_model.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["plot_step_model"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recorded():
    with open(RESULTS, encoding="utf-8") as f:
        return f.read()


def test_parses_every_config_and_variant_of_the_recorded_file(plot, recorded):
    configs = plot.parse(recorded)
    assert list(configs) == ["tpot11", "hostheavy"]
    tpot = configs["tpot11"]
    assert (tpot.forward_ms, tpot.sampler_ms, tpot.host_ms) == (9.0, 0.5, 2.0)
    assert tpot.bound == "GPU-bound" and configs["hostheavy"].bound == "GPU-bound"  # as the recorded run says
    fd24 = tpot.rows["fd24"]
    # the file's first run (later runs in the file, e.g. another tree's, are not the record)
    assert (fd24.ms, fd24.p10, fd24.p90, fd24.ratio, fd24.waited, fd24.host) == (11.424, 11.409, 11.437, 1.0, 9.259, 2.165)
    # FD 2.4's blocking points, a copy's H2D/D2H parts folded into their site
    assert fd24.wait_sites == ["S7", "S1", "S2", "S3", "T", "S5", "S6"]
    assert tpot.rows["fd24+one-wait"].wait_sites == ["event"]
    assert tpot.rows["overlap, T kept"].wait_sites == ["T", "event"]
    hostheavy = configs["hostheavy"]
    # recorded before the renaming: its "overlap, exact" is today's prepare, "exact, at launch" today's exact
    assert hostheavy.rows["fd24+overlap"].ms == 3.520 and hostheavy.rows["overlap, prepare"].ms == 4.968
    assert hostheavy.rows["exact, at launch"].ms == 3.569
    assert hostheavy.rows["gpu-only"].host == 0.170
    for config in configs.values():
        assert all(key in config.rows for key, _ in plot.VARIANTS)


def test_a_report_with_the_fd25_block_parses_both_blocks(plot):
    """A GPU run's report (measured + model columns; here the fake clock fills both) has FD 2.5's block
    after FD 2.4's table: FD 2.4's rows keep their ratios against FD 2.4, FD 2.5's against FD 2.5."""
    code = (
        "import sys; sys.path.insert(0, 'benchmarks'); import step_model as m\n"
        "for name, cfg in m.CONFIGS.items():\n"
        "    res = m.measure(m.FakeEngine(cfg, 64, 256), 5, 20, 1)\n"
        "    m.report(cfg, res, res, 'fake clock twice')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fd25+plugin-overlap" in done.stdout and "  FD 2.5 (" in done.stdout
    configs = plot.parse(done.stdout)
    assert list(configs) == ["tpot11", "hostheavy"]
    for config in configs.values():
        assert all(key in config.rows for key, _ in plot.VARIANTS)
        assert all(key in config.rows for key, _ in plot.FD25_VARIANTS), list(config.rows)
        assert config.rows["fd24"].ratio == 1.0 and config.rows["fd24"].wait_sites[:2] == ["S7", "S1"]
        assert config.rows["fd25"].ratio == 1.0 and config.rows["fd25"].wait_sites == ["tn", "tn2", "T", "event"]
        assert "T" not in config.rows["fd25+plugin-overlap"].wait_sites


def test_the_recorded_fd25_rows_are_parsed(plot, recorded):
    row = plot.parse(recorded)["hostheavy"].rows["fd25+plugin-overlap"]
    assert (row.ms, row.ratio, row.waited, row.host) == (3.535, 0.584, 0.507, 3.029)


def test_a_file_that_is_not_step_model_output_is_refused(plot, recorded):
    with pytest.raises(plot.ParseError, match="no 'config NAME"):
        plot.parse("RESULT: PASS\n")
    without_gpu_only = "\n".join(line for line in recorded.splitlines() if not line.lstrip().startswith("gpu-only"))
    with pytest.raises(plot.ParseError, match="gpu-only"):
        plot.parse(without_gpu_only)
    bad_sum = recorded.replace("11.424  11.409  11.437   1.000x  11.594  1.000x   9.259  2.165",
                               "11.424  11.409  11.437   1.000x  11.594  1.000x   9.259  3.165")
    with pytest.raises(plot.ParseError, match="waited 9.259 \\+ host 3.165"):
        plot.parse(bad_sum)


def test_main_without_matplotlib_says_what_to_install(plot, tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert plot.main(["--input", RESULTS, "--output", str(tmp_path / "x.png")]) == 2
    assert "pip install '.[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_renders_a_png_from_the_recorded_file(plot, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "step_model.png"
    assert plot.main(["--input", RESULTS, "--output", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_the_committed_picture_exists():
    with open(os.path.join(ROOT, "docs", "step_model.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
