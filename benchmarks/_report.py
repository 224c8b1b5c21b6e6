"""What the GPU check scripts share: their common options and their report.

Standard library only (the scripts run on a GPU machine without Paddle). A script imports it with
its own folder on ``sys.path``::

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _report

``Report`` prints every line as it comes, keeps a copy for ``--output`` (headed by the command
line), and ends with the ``RESULT: PASS`` / ``RESULT: FAIL (...)`` line and the exit status.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every kernel check takes: framework, prebuilt libraries, slot states, output."""
    parser.add_argument("--framework", default="auto", choices=["auto", "torch", "cupy", "dry-run"])
    parser.add_argument("--cuda-lib", help="a prebuilt libfd_async_copy_cuda.so (else compiled with nvcc)")
    parser.add_argument("--host-lib", help="a prebuilt host library (else compiled with g++)")
    parser.add_argument("--slots", type=int, default=12_000, help="random slot states per op (>= 10,000)")
    parser.add_argument("--output", help="also write the report to this file")


class Report:
    """Callable as ``report(line)``; the first line is the command that produced the report."""

    def __init__(self, script: str, argv=None) -> None:
        self._text = io.StringIO()
        words = argv if argv is not None else sys.argv[1:]
        self(f"$ python3 benchmarks/{script} " + " ".join(words))

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self._text.write(line + "\n")

    def text(self) -> str:
        return self._text.getvalue()

    def finish(self, failures: int, output: str | None) -> int:
        """Report the result line, write ``output`` if given; the exit status (0 pass, 1 fail)."""
        self(f"RESULT: {'PASS' if failures == 0 else f'FAIL ({failures} failing checks)'}")
        if output:
            Path(output).write_text(self.text())
        return 0 if failures == 0 else 1
