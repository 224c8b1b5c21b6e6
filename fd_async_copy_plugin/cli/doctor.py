"""``fd-async-copy doctor``: what the plugin would do in this environment, without patching anything."""

from __future__ import annotations

import json
import os
import platform
import sys

from ..config import ENV_BACKEND, ENV_FEATURES, ENV_VARS, AsyncCopyConfig, ConfigError
from ..registry.catalog import feature_catalog
from ..registry.plan import PADDLE_INSTALL_HINT


def _sync_check_vars() -> tuple[str, ...]:
    from ..sync_check import ENV_VARS as SYNC_CHECK_VARS

    return SYNC_CHECK_VARS


def _other_vars() -> tuple[str, ...]:
    """The variables read outside the worker's settings: where the ops live and how they are built,
    which CUDA runtime the CUDA layer loads, and the step trace."""
    from ..ops.build import CUDA_ARCHS_ENV
    from ..ops.cache import OPS_DIR_ENV
    from ..runtime.cudart import CUDART_ENV
    from ..trace import ENV_TRACE, ENV_TRACE_STEPS

    return (OPS_DIR_ENV, CUDA_ARCHS_ENV, CUDART_ENV, ENV_TRACE, ENV_TRACE_STEPS)


def all_vars() -> tuple[str, ...]:
    """Every ``FD_ASYNC_COPY*`` variable the plugin reads, in doctor's order."""
    return ENV_VARS + _sync_check_vars() + _other_vars()


def _other_var_errors(environ) -> list[str]:
    """FD_ASYNC_COPY_CUDA_ARCHS (as build-ops checks it before compiling) and FD_ASYNC_COPY_CUDART
    (a path must exist); the trace variables are listed, checked where they are read."""
    from ..ops.build import CUDA_ARCHS_ENV, cuda_archs_problem
    from ..runtime.cudart import CUDART_ENV

    problems = []
    archs = cuda_archs_problem(environ.get(CUDA_ARCHS_ENV))
    if archs:
        problems.append(archs + " (build-ops refuses it)")
    cudart = environ.get(CUDART_ENV)
    if cudart is not None and ("/" in cudart or not cudart.strip()) and not os.path.isfile(cudart):
        problems.append(f"{CUDART_ENV}={cudart!r}: no such file; point it at the libcudart.so Paddle loads, "
                        "or unset it (the CUDA backend stands down with this value)")
    return problems


def _trace_info(environ) -> dict:
    """FD_ASYNC_COPY_TRACE and FD_ASYNC_COPY_TRACE_STEPS as a worker would read them (the path with
    ``{pid}`` as written: each worker puts its own id there)."""
    from .. import trace

    if not environ.get(trace.ENV_TRACE):
        return {"on": False}
    try:
        path, steps = trace.settings_from_env(environ, pid=0)
    except trace.TraceConfigError as exc:
        return {"on": False, "config_error": str(exc)}
    return {"on": True, "path": environ[trace.ENV_TRACE], "steps": steps}


def _paddle_info() -> dict:
    try:
        import paddle
    except Exception as exc:
        return {"installed": False, "error": f"{type(exc).__name__}: {exc}"}
    from ..runtime.cuda import cuda_available

    ok, why = cuda_available()
    return {
        "installed": True,
        "version": paddle.__version__,
        "compiled_with_cuda": bool(paddle.is_compiled_with_cuda()),
        "cuda_usable": ok,
        "cuda_reason": why,
    }


def diagnose(root: str = "fastdeploy", environ=None) -> dict:
    """The ``status()`` shape, predicted by ``fd_async_copy_plugin.plan()`` - the function
    ``enable()`` decides with: a feature ``enable()`` would apply has the state ``apply``."""
    import fd_async_copy_plugin

    environ = os.environ if environ is None else environ
    trace_info = _trace_info(environ)  # first: a bad value is a one-line error whatever comes next
    report: dict = {
        "enabled": False,
        "doctor": True,
        "python": platform.python_version(),
        "paddle": _paddle_info(),
        "env": {name: environ.get(name) for name in all_vars() + ("FD_PLUGINS",)},
        "config_error": None,
        "config_errors": [],
        "env_errors": _other_var_errors(environ),
        # set, but read by nothing: a typo, most likely
        "env_unknown": sorted(name for name in environ if name.startswith("FD_ASYNC_COPY") and name not in all_vars()),
    }
    catalog = feature_catalog()
    try:
        config = AsyncCopyConfig.from_env(environ, catalog=catalog)
    except ConfigError as exc:
        report["config_error"] = str(exc)
        report["config_errors"] = list(exc.problems)
        config = AsyncCopyConfig(features=catalog.default)
    plugins = (environ.get("FD_PLUGINS") or "").split(",")
    report["fd_plugins_lists_us"] = "fd_async_copy" in plugins
    report["enabled"] = bool(config.enabled and report["config_error"] is None)
    report.update(fd_async_copy_plugin.plan(config.features, backend=config.backend, root=root))
    report["backend"], report["backend_reason"] = _backend(config.backend, report["config_error"], environ)
    _add_not_requested(report, config.features, config.backend, root)
    report["ops"] = _ops_info(report["paddle"])
    report["sync_check"] = _sync_check_info(environ)
    report["tensor_parallel"] = dict(TENSOR_PARALLEL)
    report["trace"] = trace_info
    return report


NOT_REQUESTED = "not requested"

#: Under ``--tensor-parallel-size N`` every rank's worker runs its own runner, and the ranks must take
#: the same decision every step (docs/tensor-parallel.md; checked by tests/tp/ at TP=2 and TP=4 with
#: ranks' devices at different speeds). Per feature: what steers FastDeploy's loop, and why it is alike.
TENSOR_PARALLEL = {
    "stands_down": [],  # no feature stands down because of tensor parallelism
    "summary": ("every rank decides alike: no feature stands down under TP. What steers FastDeploy's loop "
                "(not_need_stop(), the token count, exist_prefill(), when the save runs) follows the step "
                "state, which every rank holds alike; where a patch asks whether a copy has landed (FD 2.5's "
                "overlap schedule) the answer only picks between its shadow and FastDeploy's own wait, which "
                "give the same value. Only rank 0 sends output, as in FastDeploy. Under expert parallelism "
                "step_syncs and overlap keep FastDeploy's path on every rank alike. See "
                "docs/tensor-parallel.md"),
}


def _backend(name: str, config_error: str | None, environ) -> tuple[str, str]:
    """The backend ``enable()`` would use with this environment, and why (``none``: it stands down)."""
    if config_error:
        raw = environ.get(ENV_BACKEND)
        bad = f"{ENV_BACKEND}={raw!r} is invalid" if raw is not None and ENV_BACKEND in config_error \
            else "a variable is invalid"
        return "none", f"{bad} (CONFIG ERROR below): FastDeploy would run unpatched"
    from ..registry.predict import probe_backend

    used, problem = probe_backend(name)
    if problem:
        return used, problem
    if used == "cuda":
        return used, f"{ENV_BACKEND}={name}: Paddle is compiled with CUDA and sees a GPU"
    return used, f"{ENV_BACKEND}={name}: the patched code with synchronous host copies (no GPU needed)"


def _add_not_requested(report: dict, requested: tuple, backend: str, root: str) -> None:
    """Every known feature is listed: one not requested says how to request it and what it would do."""
    import fd_async_copy_plugin

    catalog = feature_catalog()
    missing = [name for name in catalog.names if name not in report["features"]]
    if not missing:
        return
    would = fd_async_copy_plugin.plan(tuple(requested) + tuple(missing), backend=backend, root=root)["features"]
    for name in missing:
        how = (f"opt-in: {ENV_FEATURES}=all,{name}" if name in catalog.opt_in
               else f"not in {ENV_FEATURES}; add it to request it")
        entry = would[name]
        state = "would apply" if entry["state"] == "apply" else entry["state"]
        report["features"][name] = {"state": NOT_REQUESTED, "reason": f"{how}. If requested: {state} - {entry['reason']}"}


def _sync_check_info(environ) -> dict:
    """FD_ASYNC_COPY_SYNC_CHECK as a worker would read it, and this process's figures if armed."""
    from .. import sync_check

    try:
        settings = sync_check.Settings.from_env(environ)
    except sync_check.SyncCheckConfigError as exc:
        return {"mode": "off", "config_error": str(exc)}
    info = {"mode": settings.mode, "warmup": settings.warmup, "allow": list(settings.allow),
            "log_every": settings.log_every}
    if sync_check.checker() is not None:
        info["figures"] = sync_check.status()
    return info


def _ops_info(paddle_info: dict) -> dict:
    if not paddle_info.get("installed"):
        return {"loadable": False, "error": "needs Paddle"}
    from ..ops import ops_status

    return ops_status()


WIDTH = 100


def _row(label: str, text: str, indent: int = 2, width: int = 18) -> list[str]:
    """``label`` then ``text`` wrapped to WIDTH columns, continuation lines aligned under it."""
    import textwrap

    head = " " * indent + f"{label:{width}s}"
    return textwrap.wrap(text, WIDTH, initial_indent=head, subsequent_indent=" " * len(head)) or [head.rstrip()]


def format_report(report: dict) -> str:
    """Plain text within WIDTH columns."""
    paddle_info = report["paddle"]
    if paddle_info.get("installed"):
        paddle_text = (f"{paddle_info['version']} (CUDA build: {paddle_info['compiled_with_cuda']}; "
                       f"{paddle_info['cuda_reason']})")
    else:
        paddle_text = f"NOT INSTALLED ({paddle_info.get('error')}); {PADDLE_INSTALL_HINT}"
    lines = ["fd-async-copy doctor"]
    lines += _row("python", report["python"])
    lines += _row("paddle", paddle_text)
    lines += _row("fastdeploy", f"{report['fastdeploy_version']} at root {report['root']!r}")
    lines += _row("profile", f"{report['profile']} - {report['profile_reason']}")
    lines += _row("backend", f"{report['backend']} - {report['backend_reason']}")
    lines += _row("custom ops", _ops_line(report["ops"]))
    lines.append("  environment")
    width = max([24] + [len(name) + 2 for name in report["env"]])  # the longest name, then a gap
    for name, value in report["env"].items():
        lines += _row(name, "(unset)" if value is None else repr(value), indent=4, width=width)
    for problem in report["config_errors"]:
        lines += _row("CONFIG ERROR", f"{problem} (FastDeploy would run unpatched)")
    for problem in report.get("env_errors", []):
        lines += _row("CONFIG ERROR", problem)
    for name in report.get("env_unknown", []):
        lines += _row("note", f"{name} is set but the plugin reads no such variable (a typo?)")
    if not report["fd_plugins_lists_us"]:
        lines += _row("note", "FD_PLUGINS does not list 'fd_async_copy': FastDeploy will not load the plugin")
    elif not report["enabled"]:
        lines += _row("note", "FD_ASYNC_COPY is not 1: the plugin loads but stays inactive")
    sync = report.get("sync_check", {})
    if sync.get("config_error"):
        lines += _row("sync check", f"CONFIG ERROR {sync['config_error']}")
    else:
        lines += _row("sync check", sync.get("mode", "off") if sync.get("mode", "off") == "off" else
                      f"{sync['mode']} (warm-up {sync['warmup']} steps; figures in status()['sync_check'])")
    tp = report.get("tensor_parallel")
    if tp:
        stands = ", ".join(tp["stands_down"])
        lines += _row("tensor parallel", (f"STANDS DOWN on every rank: {stands}; " if stands else "") + tp["summary"])
    trace_info = report.get("trace", {})
    if trace_info.get("config_error"):
        lines += _row("step trace", f"CONFIG ERROR {trace_info['config_error']}")
    elif trace_info.get("on"):
        lines += _row("step trace", f"{trace_info['steps']} decode steps after the sync check's warm-up to "
                      f"{trace_info['path']} (one file per worker where the path has {{pid}})")
    lines.append("  features")
    previous = None
    for name, entry in report["features"].items():
        state = {"apply": "would apply", NOT_REQUESTED: "not requested"}.get(entry["state"], entry["state"])
        reason = "(same reason as above)" if entry["reason"] == previous else entry["reason"]
        previous = entry["reason"]
        lines += _row(name, f"{state:14s}{reason}", indent=4, width=16)
    return "\n".join(lines)


def _ops_line(ops: dict) -> str:
    if not ops.get("loadable"):
        return f"NOT LOADABLE: {ops.get('error')}"
    cuda = ops.get("cuda_kernels", {})
    kernels = "usable" if cuda.get("available") else f"not usable ({cuda.get('why')})"
    return f"loadable ({ops.get('path')}); CUDA kernels {kernels}"


def run(args) -> int:
    """Exit 0; 1 when a variable is invalid or Paddle is not importable (nothing can be applied)."""
    report = diagnose(root=args.root)
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    bad = (report["config_error"] or report["sync_check"].get("config_error") or report["env_errors"]
           or report["trace"].get("config_error"))
    return 1 if bad or not report["paddle"].get("installed") else 0
