"""``fd-async-copy doctor``: what the plugin would do in this environment, without patching anything."""

from __future__ import annotations

import json
import os
import platform
import sys

from ..config import ENV_VARS, AsyncCopyConfig, ConfigError


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
    report: dict = {
        "enabled": False,
        "doctor": True,
        "python": platform.python_version(),
        "paddle": _paddle_info(),
        "env": {name: environ.get(name) for name in ENV_VARS + ("FD_PLUGINS",)},
        "config_error": None,
    }
    try:
        config = AsyncCopyConfig.from_env(environ)
    except ConfigError as exc:
        report["config_error"] = str(exc)
        config = AsyncCopyConfig()
    plugins = (environ.get("FD_PLUGINS") or "").split(",")
    report["fd_plugins_lists_us"] = "fd_async_copy" in plugins
    report["enabled"] = bool(config.enabled and report["config_error"] is None)
    report.update(fd_async_copy_plugin.plan(config.features, backend=config.backend, root=root))
    report["ops"] = _ops_info(report["paddle"])
    return report


def _ops_info(paddle_info: dict) -> dict:
    if not paddle_info.get("installed"):
        return {"loadable": False, "error": "needs Paddle"}
    from ..ops import ops_status

    return ops_status()


def format_report(report: dict) -> str:
    paddle_info = report["paddle"]
    lines = [
        "fd-async-copy doctor",
        f"  python            {report['python']}",
        "  paddle            "
        + (
            f"{paddle_info['version']} (CUDA build: {paddle_info['compiled_with_cuda']}; {paddle_info['cuda_reason']})"
            if paddle_info.get("installed")
            else f"NOT INSTALLED ({paddle_info.get('error')})"
        ),
        f"  fastdeploy        {report['fastdeploy_version']} at root {report['root']!r}",
        f"  profile           {report['profile']} - {report['profile_reason']}",
        f"  backend           {report['backend']}",
        "  custom ops        " + _ops_line(report["ops"]),
        "  environment",
    ]
    for name, value in report["env"].items():
        lines.append(f"    {name:24s}{'(unset)' if value is None else repr(value)}")
    if report["config_error"]:
        lines.append(f"  CONFIG ERROR      {report['config_error']} (FastDeploy would run unpatched)")
    if not report["fd_plugins_lists_us"]:
        lines.append("  note              FD_PLUGINS does not list 'fd_async_copy': FastDeploy will not load the plugin")
    elif not report["enabled"]:
        lines.append("  note              FD_ASYNC_COPY is not 1: the plugin loads but stays inactive")
    lines.append("  features")
    for name, entry in report["features"].items():
        state = "would apply" if entry["state"] == "apply" else entry["state"]
        lines.append(f"    {name:16s}{state:13s}{entry['reason']}")
    return "\n".join(lines)


def _ops_line(ops: dict) -> str:
    if not ops.get("loadable"):
        return f"NOT LOADABLE: {ops.get('error')}"
    cuda = ops.get("cuda_kernels", {})
    kernels = "usable" if cuda.get("available") else f"not usable ({cuda.get('why')})"
    return f"loadable ({ops.get('path')}); CUDA kernels {kernels}"


def run(args) -> int:
    """Exit 0; 1 when a variable is invalid (FastDeploy would run unpatched)."""
    report = diagnose(root=args.root)
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 1 if report["config_error"] else 0
