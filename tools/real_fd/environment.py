"""Environment: FastDeploy first on sys.path, its compiled ops stubbed when missing; which modules imported."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile

from .common import FD_ROOT, IMPORT_ORDER, REPO_ROOT, Report
from .side import Side
from .source import checkout


def prepare_environment(fd_src: str | None, report: Report) -> None:
    if fd_src:
        path = checkout(fd_src)
        if not os.path.isfile(os.path.join(path, FD_ROOT, "__init__.py")):
            raise SystemExit(f"error: no {FD_ROOT}/__init__.py under {fd_src}")
        sys.path.insert(0, path)
        report.facts["fd_search_path"] = path
    # Our plugin: the installed one, else this checkout.
    if importlib.util.find_spec("fd_async_copy_plugin") is None:
        sys.path.insert(1 if fd_src else 0, REPO_ROOT)
    # FastDeploy writes logs under ./log and a Prometheus folder under /tmp at import time:
    # keep both in a scratch folder removed at exit, unless the user chose their own.
    scratch = tempfile.mkdtemp(prefix="fd-check-")
    report.facts["scratch_dir"] = scratch
    os.environ.setdefault("FD_LOG_DIR", os.path.join(scratch, "log"))
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", os.path.join(scratch, "prom"))
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)


def import_fastdeploy(fd: Side, report: Report) -> None:
    spec = importlib.util.find_spec(FD_ROOT)
    if spec is None:
        report.add("environment", "import fastdeploy", "MISMATCH", "fastdeploy is not importable")
        return
    report.facts["fastdeploy_location"] = os.path.dirname(spec.origin or "")
    fd_search = report.facts.get("fd_search_path")
    if fd_search and not (spec.origin or "").startswith(fd_search + os.sep):
        report.add("environment", "import fastdeploy", "MISMATCH",
                   f"fastdeploy resolves to {spec.origin}, not under {fd_search}")
    try:
        import paddle

        report.facts["paddle"] = paddle.__version__
        report.facts["paddle_cuda"] = bool(paddle.is_compiled_with_cuda())
        if not paddle.is_compiled_with_cuda():
            paddle.set_device("cpu")
    except Exception as exc:  # noqa: BLE001
        report.add("environment", "import paddle", "INFO", f"{type(exc).__name__}: {exc}")
    fastdeploy, error = _import_quietly(FD_ROOT)
    if error:
        report.add("environment", "import fastdeploy", "INFO",
                   f"failed ({error}); every check falls back to source (AST)")
        return
    report.facts["fastdeploy___version__"] = str(getattr(fastdeploy, "__version__", None))
    # fastdeploy.__getattr__ answers None for unknown names (surface §7): hasattr is always True.
    with contextlib.redirect_stdout(sys.stderr):
        report.facts["fastdeploy_hasattr_always_true"] = hasattr(fastdeploy, "no_such_attribute_fd_check")
    ops_name = f"{FD_ROOT}.model_executor.ops.gpu"
    ops, error = _import_quietly(ops_name)
    if error:
        report.facts["ops_gpu"] = f"import failed: {error}"
        return
    compiled = f"{ops_name}.fastdeploy_ops" in sys.modules
    if compiled:
        report.facts["ops_gpu"] = "compiled fastdeploy_ops present"
    elif hasattr(ops, "tolerant_import_error"):
        ops.tolerant_import_error()
        report.facts["ops_gpu"] = "not compiled: stubbed with ops.gpu.tolerant_import_error()"
    else:
        report.facts["ops_gpu"] = "not compiled and no tolerant_import_error(): GPU modules may not import"


def _import_quietly(name: str):
    """(module, "") or (None, what failed); FastDeploy's import-time prints go to stderr. Any
    failure (FD may call sys.exit while importing) is reported, except Ctrl-C."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return importlib.import_module(name), ""
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        return None, f"{type(exc).__name__}: {exc}"


def check_imports_status(side: Side, report: Report, section: str) -> None:
    for rel in IMPORT_ORDER:
        if side.resolve(rel) is None:
            continue
        side.load(rel)
        if rel in side.import_errors:
            report.add(section, f"import {side.root}.{rel}", "INFO",
                       f"{side.import_errors[rel]} - checked from source (AST)")
        else:
            report.add(section, f"import {side.root}.{rel}", "OK", "imported")
