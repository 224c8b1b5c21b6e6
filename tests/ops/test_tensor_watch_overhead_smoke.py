"""``benchmarks/tensor_watch_overhead.py`` (the per-step cost of step_syncs' tensor watch) runs, with
the watch really in place (the script asserts the junctions carry step_syncs' links)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tensor_watch_overhead.py"


def test_smoke_run_reports_each_method_and_the_added_time_per_step():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "4", "--repeat", "200"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["__setitem__"],
                                                                                       ["__getitem__"], ["numpy"])]
    assert len(rows) == 3 and all(float(row[1]) > 0 for row in rows), proc.stdout  # calls per step counted
    assert "added host time per decode step outside watching scopes" in proc.stdout
