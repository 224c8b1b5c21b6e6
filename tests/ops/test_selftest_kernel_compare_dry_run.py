"""``benchmarks/selftest_kernel_compare.py`` (the selftest's kernel comparison, Paddle-free, run on
the H200) runs here with ``--framework dry-run`` and Paddle made unimportable: its plumbing works
before a GPU session is spent on it, and it really needs no Paddle."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "selftest_kernel_compare.py"
NO_PADDLE = (
    "import runpy, sys; sys.modules['paddle'] = None; "
    f"sys.argv = [{str(SCRIPT)!r}, '--framework', 'dry-run', '--slots', '2000']; "
    f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
)


def test_dry_run_without_paddle_passes_and_catches_the_planted_bug():
    proc = subprocess.run([sys.executable, "-c", NO_PADDLE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "RESULT: PASS" in proc.stdout
    assert "v1: " in proc.stdout and "v0: " in proc.stdout and "identical" in proc.stdout
    assert "planted bug (flag flipped in batch 2): caught" in proc.stdout
