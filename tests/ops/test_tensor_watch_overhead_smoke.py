"""``benchmarks/tensor_watch_overhead.py`` (the per-step cost of step_syncs' share_inputs watch) runs,
with the watch really in use (the script asserts the replica's steps went through its scopes and
stand-ins, and that Paddle's tensor methods stay Paddle's own with step_syncs applied)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tensor_watch_overhead.py"


def test_smoke_run_reports_each_operation_and_the_added_time_per_step():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "4", "--repeat", "200"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    per_step = {line[:26].strip(): line[26:].split()[0] for line in proc.stdout.splitlines()
                if line.startswith(("scope", "stand-in"))}  # name, then the per-step count
    assert float(per_step["scope (enter + exit)"]) > 0, proc.stdout  # the replica's steps were watched
    assert float(per_step["stand-in __setitem__"]) > 0, proc.stdout
    assert "added host time per decode step inside watched calls" in proc.stdout
    assert "added host time per decode step outside watched calls: 0.0 us" in proc.stdout
