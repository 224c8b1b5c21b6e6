"""pytest plugin ``fd_async_copy``: run FastDeploy's own tests with the plugin's patches applied.

Registered as the ``pytest11`` entry point ``fd_async_copy``, so pytest loads it in every session
of an environment where fd-async-copy-plugin is installed. Loading does nothing: **only
``--fd-async-copy`` activates it** (on the command line, in ``addopts``, or through
``PYTEST_ADDOPTS="--fd-async-copy"``). ``-p fd_async_copy`` is redundant then; it only makes sure it is loaded, which
matters when autoloading is off (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` or
``--disable-plugin-autoload``). The ``FD_ASYNC_COPY`` variable does not activate it: that variable
belongs to FastDeploy's plugin loader, and an exported ``FD_ASYNC_COPY=1`` must not silently
patch every pytest run in the shell.

When active:

1. Before the initial conftest files and any test module are imported
   (``pytest_load_initial_conftests``), it calls ``fd_async_copy_plugin.enable(...)`` with the
   options below. FastDeploy binds the patched functions with ``from ... import``, so the patches
   have to be in place before test modules import them. (If the plugin is registered late, e.g.
   from a conftest ``pytest_plugins`` list, ``pytest_configure`` applies them instead; test modules
   are still collected after that, but conftest files imported earlier keep the names they bound.)
2. It exports, for the whole session, so that server subprocesses started by FastDeploy's
   end-to-end tests (``python -m fastdeploy.entrypoints.openai.api_server``, and its engine and
   worker processes, which inherit the environment) load the plugin too:
   ``FD_PLUGINS`` = the previous comma list plus ``fd_async_copy`` (no spaces: FastDeploy does not
   strip them), ``FD_ASYNC_COPY=1``, and ``FD_ASYNC_COPY_FEATURES`` / ``FD_ASYNC_COPY_BACKEND`` /
   ``FD_ASYNC_COPY_STRICT=1`` with the effective values. The replica root (``--fd-async-copy-root``)
   and the ``sim`` backend apply to the pytest process only; subprocesses always patch the real
   ``fastdeploy`` (and get no ``FD_ASYNC_COPY_BACKEND`` when ``sim`` was asked for).
3. The pytest header shows the FastDeploy profile, the backend and each feature's state, and the
   terminal summary shows the states again at the end (``pending`` features are applied when their
   FastDeploy module is first imported).
4. At session end (``pytest_unconfigure``) it calls ``disable()`` and restores the environment.

Options override the ``FD_ASYNC_COPY_FEATURES`` / ``FD_ASYNC_COPY_BACKEND`` /
``FD_ASYNC_COPY_STRICT`` variables; options left out fall back to those variables, then to the
defaults (all features, ``auto`` backend, not strict), so the pytest process and its subprocesses
use the same settings. Bad values, sub-options without ``--fd-async-copy``, an ``enable()`` that
raises, or (with strict) a feature ``skipped``/``incompatible``/``failed``/``passthrough`` at session start stop the session with a
usage error: a test run that asked for the patches must not quietly run without them. (With strict,
a ``pending`` feature that cannot be applied when its FastDeploy module is imported raises
``StrictModeError`` from that import, which pytest reports as a collection error of the importing
test module.)
"""

from __future__ import annotations

import os
import textwrap
import warnings
from dataclasses import dataclass, field

import pytest

PLUGIN_ENTRY_POINT = "fd_async_copy"  # FastDeploy entry point name, as listed in FD_PLUGINS
DEFAULT_ROOT = "fastdeploy"


@dataclass
class Activation:
    root: str
    features: str
    backend: str
    strict: bool
    #: what the user set to ask for strict mode (the flag or the variable), named in strict errors
    strict_source: str = "--fd-async-copy-strict"
    #: Variables this plugin set, and what they were before (None: unset).
    env_set: dict[str, str] = field(default_factory=dict)
    env_before: dict[str, str | None] = field(default_factory=dict)


_ACTIVATION = pytest.StashKey[Activation]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fd-async-copy", "fd-async-copy-plugin (FastDeploy asynchronous output copies)")
    group.addoption(
        "--fd-async-copy",
        action="store_true",
        default=False,
        dest="fd_async_copy",
        help="apply the fd-async-copy patches to FastDeploy for this session and export "
        "FD_PLUGINS=...,fd_async_copy FD_ASYNC_COPY=1 to subprocesses (inactive without this option)",
    )
    group.addoption(
        "--fd-async-copy-features",
        default=None,
        dest="fd_async_copy_features",
        metavar="all|LIST",
        help=f"'all' (every feature but the opt-in {', '.join(_opt_in())}) or a comma list of "
        f"{', '.join(_known_features())} (default: $FD_ASYNC_COPY_FEATURES, else all)",
    )
    group.addoption(
        "--fd-async-copy-backend",
        default=None,
        dest="fd_async_copy_backend",
        metavar="auto|cuda|host|sim",
        help="copy backend (default: $FD_ASYNC_COPY_BACKEND, else auto); sim applies to this process only",
    )
    group.addoption(
        "--fd-async-copy-root",
        default=None,
        dest="fd_async_copy_root",
        metavar="MODULE",
        help="root module of the FastDeploy to patch (default: fastdeploy; e.g. "
        "fd_async_copy_plugin.testing.reference.fd24 for the replica); this process only",
    )
    group.addoption(
        "--fd-async-copy-strict",
        action="store_true",
        default=False,
        dest="fd_async_copy_strict",
        help="fail the session if any requested feature cannot be applied (default: $FD_ASYNC_COPY_STRICT)",
    )


def _known_features() -> tuple[str, ...]:
    from .registry.catalog import feature_catalog

    return feature_catalog().names


def _opt_in() -> tuple[str, ...]:
    from .registry.catalog import feature_catalog

    return feature_catalog().opt_in


def _source(flag: str, value, variable: str) -> str:
    """What the user set: the flag when given, else the variable it fell back to."""
    return flag if value else variable


# --- activation --------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser, args) -> None:
    _activate(early_config, early_config.known_args_namespace)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _activate(config, config.option)


def _activate(config: pytest.Config, ns) -> None:
    if config.stash.get(_ACTIVATION, None) is not None:
        return
    if not getattr(ns, "fd_async_copy", False):
        orphans = [
            flag
            for flag, dest in (
                ("--fd-async-copy-features", "fd_async_copy_features"),
                ("--fd-async-copy-backend", "fd_async_copy_backend"),
                ("--fd-async-copy-root", "fd_async_copy_root"),
                ("--fd-async-copy-strict", "fd_async_copy_strict"),
            )
            if getattr(ns, dest, None)
        ]
        if orphans:
            raise pytest.UsageError(f"{', '.join(orphans)} given without --fd-async-copy (which activates the plugin)")
        return

    from . import config as fd_config
    from .registry.catalog import feature_catalog
    from .registry.manager import backend_names

    try:
        features = fd_config.parse_features(
            ns.fd_async_copy_features or os.environ.get(fd_config.ENV_FEATURES), catalog=feature_catalog(),
            source=_source("--fd-async-copy-features", ns.fd_async_copy_features, fd_config.ENV_FEATURES),
        )
        backend = fd_config.parse_backend(
            ns.fd_async_copy_backend or os.environ.get(fd_config.ENV_BACKEND),
            source=_source("--fd-async-copy-backend", ns.fd_async_copy_backend, fd_config.ENV_BACKEND),
            allowed=backend_names(),
        )
    except fd_config.ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc
    strict = bool(ns.fd_async_copy_strict) or os.environ.get(fd_config.ENV_STRICT, "").strip() == "1"
    activation = Activation(
        root=ns.fd_async_copy_root or DEFAULT_ROOT,
        features=",".join(features),
        backend=backend,
        strict=strict,
        strict_source="--fd-async-copy-strict" if ns.fd_async_copy_strict else f"{fd_config.ENV_STRICT}=1",
    )
    _export_env(activation, fd_config)
    try:
        _enable(activation)
    except BaseException:
        _restore_env(activation)
        raise
    config.stash[_ACTIVATION] = activation


def _enable(activation: Activation) -> None:
    import fd_async_copy_plugin as api

    from .registry.manager import StrictModeError

    try:
        with warnings.catch_warnings():  # Paddle's import warns about ccache: nothing the user can act on
            warnings.filterwarnings("ignore", message=".*No ccache found", category=UserWarning)
            status = api.enable(
                features=activation.features, backend=activation.backend, strict=activation.strict,
                root=activation.root,
            )
    except StrictModeError as exc:
        why = str(exc).split(": ", 1)[-1]
        raise pytest.UsageError(
            f"{activation.strict_source}: not every requested feature applied (StrictModeError): {why}"
        ) from exc
    except Exception as exc:
        raise pytest.UsageError(
            f"--fd-async-copy: enable(root={activation.root!r}, backend={activation.backend!r}) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    # enable(strict=True) raises by itself; this also covers a status that says otherwise.
    from .registry.plan import REFUSED_IN_STRICT_MODE

    bad = {n: f for n, f in (status.get("features") or {}).items() if f.get("state") in REFUSED_IN_STRICT_MODE}
    if status.get("profile") == "absent":
        api.disable()
        raise pytest.UsageError(
            f"--fd-async-copy: no FastDeploy to patch at root {activation.root!r} "
            f"({status.get('profile_reason') or 'not importable'}); the session would run FastDeploy-less "
            "tests unpatched. Install FastDeploy in this environment, or name one with --fd-async-copy-root"
        )
    if activation.strict and bad:
        api.disable()
        raise pytest.UsageError(
            f"{activation.strict_source}: feature(s) not applied: "
            + "; ".join(f"{n}: {f.get('state')} ({f.get('reason', '')})" for n, f in bad.items())
        )


def _merged_fd_plugins(current: str | None) -> str:
    names = [n for n in (current or "").split(",") if n]
    if PLUGIN_ENTRY_POINT not in names:
        names.append(PLUGIN_ENTRY_POINT)
    return ",".join(names)


def subprocess_env(activation: Activation, environ=os.environ, fd_config=None) -> dict[str, str]:
    """The variables exported for subprocesses (FastDeploy servers and workers)."""
    if fd_config is None:
        from . import config as fd_config
    env = {
        "FD_PLUGINS": _merged_fd_plugins(environ.get("FD_PLUGINS")),
        fd_config.ENV_ENABLE: "1",
        fd_config.ENV_FEATURES: activation.features,
    }
    if activation.backend in fd_config.BACKENDS:  # sim is not a valid FD_ASYNC_COPY_BACKEND
        env[fd_config.ENV_BACKEND] = activation.backend
    if activation.strict:
        env[fd_config.ENV_STRICT] = "1"
    return env


def _export_env(activation: Activation, fd_config) -> None:
    activation.env_set = subprocess_env(activation, os.environ, fd_config)
    activation.env_before = {k: os.environ.get(k) for k in activation.env_set}
    os.environ.update(activation.env_set)


def _restore_env(activation: Activation) -> None:
    for key, value in activation.env_before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    activation = config.stash.get(_ACTIVATION, None)
    if activation is None:
        return
    del config.stash[_ACTIVATION]
    import fd_async_copy_plugin as api

    try:
        api.disable()
    finally:
        _restore_env(activation)


# --- reporting ---------------------------------------------------------------------------------


def _status_lines(activation: Activation) -> list[str]:
    import fd_async_copy_plugin as api

    status = api.status()
    lines = [
        f"fd-async-copy: enabled={status.get('enabled')} profile={status.get('profile')} "
        f"fastdeploy={status.get('fastdeploy_version')} backend={status.get('backend')} root={activation.root}"
        + (" strict" if activation.strict else "")
    ]
    features = status.get("features") or {}
    lines.append(
        "fd-async-copy features: " + (", ".join(f"{n}={f.get('state')}" for n, f in features.items()) or "none")
    )
    for name, f in features.items():
        if f.get("state") not in ("applied", "pending") and f.get("reason"):
            lines.append(f"  {name}: {f.get('state')} ({f.get('reason')})")
    lines.append("fd-async-copy subprocess env: " + " ".join(f"{k}={v}" for k, v in activation.env_set.items()))
    return lines


def _wrapped(line: str, width: int = 100) -> list[str]:
    """A status line within ``width`` columns, continuation lines indented."""
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False) or [line]


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    activation = config.stash.get(_ACTIVATION, None)
    if activation is None:
        return None
    return [part for line in _status_lines(activation) for part in _wrapped(line)]


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    activation = config.stash.get(_ACTIVATION, None)
    if activation is None:
        return
    terminalreporter.write_sep("-", "fd-async-copy (state at session end)")
    for line in _status_lines(activation)[:-1]:
        for part in _wrapped(line):
            terminalreporter.write_line(part)
