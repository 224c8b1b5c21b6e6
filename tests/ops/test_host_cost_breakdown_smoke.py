"""``benchmarks/host_cost_breakdown.py`` (issue 24: the plugin's host time per decode step split into
its parts) runs on the host backend, so a broken script is found before anyone's GPU time is spent.
The figures there are host memmoves, not CUDA's."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "host_cost_breakdown.py"


def test_cpu_smoke_run_reports_every_variant_and_the_parts(tmp_path):
    out = tmp_path / "report.txt"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--sizes", "4", "--steps", "5", "--warmup", "2",
         "--rounds", "1", "--output", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = proc.stdout
    for variant in ("plugin: ring + copy_d2h_many", "plugin, census on", "plugin, per-copy API",
                    "plugin: ring.fill (one ctypes call per copy)"):
        assert text.count(variant) == 3, variant  # a row of the table, its segments and a breakdown
    for variant in ("FD 2.4: blocking copies", "FD 2.5: per-step pinned + event"):
        assert text.count(variant) == 2, variant
    assert "fdac_d2h_batch (default)" not in text  # the batch needs CUDA: not on the host backend
    # the fourth cut's call sequence (batched; the plain and the census variant), the per-copy API and
    # the logprobs producer's ring.fill
    for segment, variants in (("ring.acquire", 3), ("backend.copy_d2h_many", 2), ("3 x backend.copy_d2h", 1),
                              ("backend.record", 1), ("ring.fill", 1), ("backend.wait", 4), ("3 x backend.read", 4)):
        assert text.count(f"producer: {segment} ") + text.count(f"consumer: {segment} ") == variants, segment
    # the plugin's parts were each seen: the ring, the census, the runtime's copy and record, the glue
    for part in ("ring: acquire", "census.record", "HostRuntime.memcpy_d2h_async", "HostRuntime.event_record",
                 "framework accessors (glue.address)", "backend: copy_d2h", "call-site Python"):
        assert part in text, part
    # the breakdown charges the parts to the segment they ran in, scaled to its plain time
    assert text.count("[backend.copy_d2h_many:") == 2 and text.count("[3 x backend.copy_d2h:") == 1, text[-3000:]
    assert text.count("[backend.wait:") == 4 and text.count("[ring.fill:") == 1, text[-3000:]
    # 3 copies and 1 event per step: the calls per step are counted, not guessed
    copy_line = next(line for line in text.splitlines() if "HostRuntime.memcpy_d2h_async" in line)
    assert copy_line.split()[-2] == "3.0", copy_line
    # a decode step's own copies (FD 2.4's default path): one by one vs one batch
    assert "one by one: 6 x copy_d2h + record (fourth cut)" in text
    assert "one copy_d2h_many, one ctypes call per copy" in text
    assert text.rstrip().endswith("RESULT: MEASURED") and out.read_text() == text
