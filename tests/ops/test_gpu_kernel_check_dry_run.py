"""The GPU kernel check's own plumbing runs here (``--framework dry-run``: the host library stands
in for the CUDA one), so a broken check script is found before a GPU session is spent on it."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_kernel_check.py"


def test_dry_run_passes_and_reports_branch_coverage():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--framework", "dry-run", "--slots", "2000", "--steps", "5"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "RESULT: PASS" in proc.stdout
    assert "branches {" in proc.stdout and "COVERAGE" not in proc.stdout
