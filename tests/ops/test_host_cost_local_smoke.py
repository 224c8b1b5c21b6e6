"""``benchmarks/host_cost_local.py`` (issue 24: the plugin's host path over a C stand-in for libcudart,
no GPU) runs and compares two trees side by side; its figures are a CPU's, not CUDA's."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_it_reports_each_case_for_each_tree_and_their_ratio(tmp_path):
    other = tmp_path / "other"  # a second checkout: the same package, copied
    shutil.copytree(REPO / "fd_async_copy_plugin", other / "fd_async_copy_plugin",
                    ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "host_cost_local.py"), "--tree", str(other),
                           "--rounds", "2", "--steps", "50"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("  this checkout ", "  other ")) and "/" not in line]
    # (the tests run with Paddle installed: its consumer case has figures too)
    assert len(rows) == 2 and all(len(re.findall(r"\d+\.\d+ \(\d+\.\d+-\d+\.\d+\)", r)) == 5 for r in rows), proc.stdout
    ratio = next(line for line in lines if "this checkout / other" in line)
    cases = ("fill, steady", "fill, changing", "step copies", "consumer", "consumer, Paddle")
    assert all(re.search(rf"(^|, |: ){case} \d+\.\d+x", ratio) for case in cases), ratio
