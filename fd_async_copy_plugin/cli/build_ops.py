"""``fd-async-copy build-ops``: build the custom ops, then print their state. Exit 0 when usable."""

from __future__ import annotations

import argparse
import json

from ..ops import BuildError, build_ops, ops_status
from ..registry.plan import PADDLE_INSTALL_HINT


def main_build_ops(argv: list[str] | None = None) -> int:
    """``fd-async-copy build-ops``: build, then print the ops status. Exit 0 when usable."""
    parser = argparse.ArgumentParser(prog="fd-async-copy build-ops", description="Compile the custom ops for this Paddle (pybind module with g++, CUDA kernels with nvcc).")
    parser.add_argument("--verbose", action="store_true", help="show compiler commands and output")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--no-cuda", action="store_true", help="do not build the CUDA kernels")
    parser.add_argument(
        "--require-cuda", action="store_true", help="fail when the CUDA kernels cannot be built"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    code = 0
    try:
        report = build_ops(verbose=args.verbose, force=args.force, cuda=not args.no_cuda)
    except ImportError as exc:  # Paddle missing: the ops are built against the Paddle that loads them
        report = {"error": f"{exc}: {PADDLE_INSTALL_HINT}"}
        code = 1
    except (BuildError, ValueError, OSError) as exc:  # OSError: unwritable cache dir
        report = {"error": str(exc)}
        code = 1
    if args.require_cuda and report.get("cuda", {}).get("status") not in ("built", "up to date"):
        code = 1
    report["status"] = ops_status()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        _print_report(report)
    return code


def _print_report(report: dict) -> None:
    if "error" in report:
        print(f"build-ops FAILED: {report['error']}")
    print(f"ops dir: {report.get('ops_dir', report['status'].get('ops_dir'))}")
    for name in ("pybind", "cuda"):
        if name in report:
            entry = report[name]
            detail = entry.get("path") or entry.get("reason") or ("see above" if "error" in report else entry.get("error", ""))
            print(f"  {name:7s} {entry['status']}: {detail}")
    status = report["status"]
    print(f"  loadable: {status['loadable']}" + (f" ({status['error']})" if status.get("error") else ""))
    kernels = status["cuda_kernels"]
    print(f"  cuda kernels usable: {kernels['available']} ({kernels['why']})")
