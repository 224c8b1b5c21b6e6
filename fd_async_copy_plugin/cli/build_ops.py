"""``fd-async-copy build-ops``: build the custom ops, then print their state. Exit 0 when usable."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from pathlib import Path

from ..ops import BuildError, build_ops, cache, ops_status
from ..registry.plan import PADDLE_INSTALL_HINT

#: the loader's advice for an unbuilt library; after a failed build it would send the user in a circle
_RERUN_HINTS = ("; run `fd-async-copy build-ops --force`", "; run `fd-async-copy build-ops` with nvcc available",
                ", then run `fd-async-copy build-ops`", "; run `fd-async-copy build-ops`")


def main_build_ops(argv: list[str] | None = None) -> int:
    """``fd-async-copy build-ops``: build, then print the ops status. Exit 0 when usable."""
    parser = argparse.ArgumentParser(prog="fd-async-copy build-ops", description="Compile the custom ops for this Paddle (pybind module with g++, CUDA kernels with nvcc).")
    parser.add_argument("--verbose", action="store_true", help="show compiler commands and output")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--no-cuda", action="store_true", help="do not build the CUDA kernels")
    parser.add_argument(
        "--require-cuda", action="store_true", help="fail when the CUDA kernels cannot be built"
    )
    parser.add_argument(
        "--clean", action="store_true",
        help="first remove the ops folders of Paddle installs that no longer exist (deleted venvs)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.no_cuda and args.require_cuda:
        parser.error("--no-cuda and --require-cuda contradict each other: give one of them")

    def progress(line: str) -> None:
        print(f"build-ops: {line}", file=sys.stderr, flush=True)

    if not args.no_cuda:
        # before anything compiles (the pybind module takes about a minute): a bad value fails now
        from ..ops.build import CUDA_ARCHS_ENV, cuda_archs_problem
        from ..ops.cache import find_nvcc

        raw = os.environ.get(CUDA_ARCHS_ENV)
        problem = cuda_archs_problem(raw, find_nvcc()[0] if raw is not None else None)
        if problem:
            print(f"fd-async-copy build-ops: error: {problem}", file=sys.stderr)
            return 2

    from ..ops.cache import ignored_cuda_roots

    warnings = [f"{problem}: ignored for the CUDA kernels; fix or unset it" for problem in ignored_cuda_roots()]
    for warning in warnings:
        progress(f"WARNING: {warning}")
    code = 0
    paddle_missing = False
    try:
        removed = _clean(progress) if args.clean else []
        report = build_ops(verbose=args.verbose, force=args.force, cuda=not args.no_cuda, progress=progress)
    except ImportError as exc:  # Paddle missing: the ops are built against the Paddle that loads them
        report = {"error": f"Paddle is not importable ({exc}): {PADDLE_INSTALL_HINT}"}
        paddle_missing = True
        code = 1
    except (BuildError, ValueError, OSError) as exc:  # OSError: unwritable cache dir
        report = {"error": str(exc)}
        code = 1
    if args.clean and not paddle_missing:
        report["removed"] = [str(p) for p in removed]
    if args.require_cuda and not paddle_missing and report.get("cuda", {}).get("status") not in ("built", "up to date"):
        cuda = report.get("cuda", {})
        report["error"] = report.get("error") or (
            f"--require-cuda: the CUDA kernels are {cuda.get('status', 'not built')}: "
            f"{cuda.get('reason') or cuda.get('error') or 'see above'}")
        code = 1
    if warnings:
        report["warnings"] = warnings
    if not paddle_missing:
        report["status"] = ops_status()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        _print_report(report)
    return code


def _clean(progress) -> list:
    current = cache.ops_dir()
    removed = []
    for folder, why in orphaned_ops_dirs(current):
        shutil.rmtree(folder, ignore_errors=True)
        progress(f"removed {folder} ({why})")
        removed.append(folder)
    if not removed:
        progress(f"nothing to clean under {cache_root()}")
    return removed


def _print_report(report: dict) -> None:
    failed = "error" in report
    if failed:
        print(f"build-ops FAILED: {report['error']}")
    if "status" not in report:  # Paddle missing: there is no ops folder to describe
        return
    print(f"ops dir: {report.get('ops_dir', report['status'].get('ops_dir'))}")
    for name in ("pybind", "cuda"):
        if name in report:
            entry = report[name]
            detail = entry.get("path") or entry.get("reason") or ("see above" if failed else entry.get("error", ""))
            print(f"  {name:7s} {entry['status']}: {detail}")
    status = report["status"]
    error = _after_failure(status.get("error") or "", failed)
    print(f"  loadable: {status['loadable']}" + (f" ({error})" if error else ""))
    kernels = status["cuda_kernels"]
    print(f"  cuda kernels usable: {kernels['available']} ({_after_failure(kernels['why'] or '', failed)})")


def _after_failure(text: str, failed: bool) -> str:
    """After a failed build, "run build-ops" is circular: say to fix the error above instead."""
    if not failed:
        return text
    for hint in _RERUN_HINTS:
        if hint in text:
            return text.replace(hint, "; fix the error above, then build again")
    return text


def cache_root() -> Path:
    """The folder that holds one ops folder per Paddle build (``ops_dir()``'s parent by default)."""
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "fd_async_copy"


def orphaned_ops_dirs(current: Path) -> list[tuple[Path, str]]:
    """Ops folders under ``cache_root()`` whose Paddle install is gone (a deleted venv), with why;
    never ``current``. A folder whose build manifest cannot be read is kept (it may be in use)."""
    found = []
    root = cache_root()
    if not root.is_dir():
        return found
    for folder in sorted(root.glob("paddle-*")):
        if not folder.is_dir() or folder.resolve() == current.resolve():
            continue
        manifest = cache.read_manifest(folder / cache.PYBIND_FILE) or {}
        build = manifest.get("fingerprint", {}).get("paddle_build", "")
        location = build.partition("@")[2]
        if location and not Path(location).is_dir():
            found.append((folder, f"its Paddle ({location}) no longer exists"))
    return found
