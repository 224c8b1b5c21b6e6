"""``benchmarks/padded_gemm_check.py``'s Paddle path (the one an FD user runs on a GPU) runs here on
CPU Paddle with small shapes, so a broken script is found before anyone's GPU time is spent. CPU
float32 GEMMs are measured there, not a GPU's."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "padded_gemm_check.py"


def test_paddle_cpu_smoke_run_reports_every_shape_and_the_fixed_m_check():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--framework", "paddle", "--device", "cpu", "--dtype", "float32",
         "--shapes", "tiny", "--max-m", "5"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("padded_gemm_check: CPU, paddle")
    rows = [line for line in lines if line.startswith("tiny")]
    assert len(rows) == 4 and all(line.rstrip().endswith("same") for line in rows), rows  # fixed M: pads inert
    assert "RESULT: MEASURED" in proc.stdout


def test_a_missing_gpu_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--framework", "paddle", "--device", "gpu"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "cannot run with paddle on gpu" in proc.stderr, proc.stderr[-500:]
