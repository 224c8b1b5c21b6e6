"""fd-async-copy-plugin: asynchronous GPU->host output copies for PaddlePaddle FastDeploy.

Public API (kept stable; FastDeploy users and FastDeploy itself see these names):

- ``register()`` - the ``fastdeploy.model_register_plugins`` entry point ``fd_async_copy``. Cheap
  and idempotent: FastDeploy calls it in the API-server/engine process and in every worker.
- ``enable(features=None, backend="auto", strict=False)``, ``disable()``, ``status()``.
- ``plan(features=None, backend="auto")``: what ``enable()`` would decide per feature, patching
  nothing (``fd-async-copy doctor`` shows it).

Importing this package does not import Paddle or FastDeploy; ``enable()`` does what it needs.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from .config import AsyncCopyConfig, ConfigError, RunSettings, parse_backend, parse_features, strict_from_env

__version__ = "0.2.0"  # as pyproject.toml (tests/cli check it)

log = logging.getLogger("fd_async_copy")

_lock = threading.Lock()
_manager = None
_inactive_logged = False


def _get_manager():
    global _manager
    with _lock:
        if _manager is None:
            from .registry.manager import PatchManager

            _manager = PatchManager()
        return _manager


def _ensure_log_handler() -> None:
    """FastDeploy configures its own loggers, not ours: make sure our few lines are seen."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[fd_async_copy] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _feature_names(features) -> tuple[str, ...]:
    """The requested names checked against (and ``all`` expanded by) the installed patch sets."""
    if features is not None and not isinstance(features, str):  # an iterable of names
        features = list(features)
        if not features:
            raise ConfigError("features=[] names no feature; pass None or 'all' for every feature")
        features = ",".join(features)
    return parse_features(features, source="features", catalog=_get_manager().catalog())


def plan(features=None, backend: str = "auto", root: str = "fastdeploy") -> dict:
    """What ``enable()`` would decide here, without patching or loading anything into FastDeploy.

    Returns ``{"profile": ..., "profile_reason": ..., "backend": ..., "features": {name: {"state",
    "reason"}}}``; a feature ``enable()`` would apply has the state ``apply``. Works without
    Paddle installed (every feature is then ``skipped`` with what to install).
    """
    from .registry.manager import backend_names
    from .registry.predict import predict

    return predict(_feature_names(features), parse_backend(backend, source="backend", allowed=backend_names()), root)


def enable(features=None, backend: str = "auto", strict: bool = False, root: str = "fastdeploy",
           ring_max_bytes=None, overlap_count: str | None = None) -> dict:
    """Apply the requested features to the FastDeploy found at ``root``; return ``status()``.

    ``features``: None or "all" for every feature but the opt-in ``overlap`` ("all,overlap" adds
    it), else an iterable (or comma string) of ``logprobs``, ``sync_scope``, ``stop_flag``,
    ``sampled_tokens`` (an option of ``stop_flag``), ``step_syncs``, ``flag_race`` and ``overlap``
    (docs/features.md).
    ``backend``: ``auto``, ``cuda``, ``host`` (or a name of the ``fd_async_copy.backends``
    entry-point group: the testing package's fake CUDA runtime, ``sim``). Invalid arguments raise ``ConfigError`` before anything is touched. Features whose
    FastDeploy modules are not imported yet are applied when they are (state ``pending`` until
    then). Called again with other arguments, it reverts and plans the new request afresh.
    ``ring_max_bytes`` (int, or a string such as "256M") and ``overlap_count`` (``exact``/``prepare``/``bound``):
    as ``FD_ASYNC_COPY_RING_MAX_BYTES``/``FD_ASYNC_COPY_OVERLAP_COUNT``, which they default to.
    """
    from .registry.manager import backend_names

    names = _feature_names(features)
    backend = parse_backend(backend, source="backend", allowed=backend_names())
    settings = RunSettings.parse(ring_max_bytes, overlap_count)
    _get_manager().enable(names, backend=backend, strict=bool(strict), root=root, settings=settings)
    return status()


def disable() -> None:
    """Revert every patch, restoring the exact original objects."""
    if _manager is not None:
        _manager.disable()


def status() -> dict:
    """JSON-serialisable state: enabled, fastdeploy_version, profile, backend, features, ops.

    Reads state only: it loads no ops, imports nothing and runs no deferred patch."""
    return _get_manager().status()


def register() -> None:
    """FastDeploy plugin entry point (group ``fastdeploy.model_register_plugins``).

    FastDeploy calls it unguarded at import time of its models package, so it never raises
    outside strict mode (``FD_ASYNC_COPY_STRICT=1``): a bad value is logged and FastDeploy runs
    unpatched."""
    global _inactive_logged
    _ensure_log_handler()
    if (os.environ.get("FD_ASYNC_COPY_SYNC_CHECK") or "off").lower() != "off" or os.environ.get("FD_ASYNC_COPY_TRACE"):
        if os.environ.get("FD_ASYNC_COPY_TRACE"):
            from .trace import install_from_env  # arms the sync check too
        else:
            from .sync_check import install_from_env
        install_from_env()  # also with the plugin inactive; never raises; off: not even imported
    try:
        config = AsyncCopyConfig.from_env(catalog=_get_manager().catalog())
    except Exception as exc:
        log.error("fd_async_copy: %s. FastDeploy runs unpatched.", exc)
        if strict_from_env() and isinstance(exc, ConfigError):
            raise
        return
    if not config.enabled:
        if not _inactive_logged:
            log.info("fd_async_copy: loaded but inactive; set FD_ASYNC_COPY=1 to enable asynchronous "
                     "output copies (see `fd-async-copy doctor`)")
            _inactive_logged = True
        return
    try:
        if _get_manager().enabled:
            return  # idempotent: a second call in the same process changes nothing
        enable(config.features, backend=config.backend, strict=config.strict,
               ring_max_bytes=config.ring_max_bytes, overlap_count=config.overlap_count)
        summary = ", ".join(f"{n}={s['state']}" for n, s in status()["features"].items())
    except Exception:
        # FastDeploy calls this at module level of its models package: an exception here would stop
        # the server from starting. Only strict mode asks for that.
        if config.strict:
            raise
        log.exception("fd_async_copy: enabling failed; FastDeploy runs unpatched")
        disable()
        return
    log.info("fd_async_copy: %s", summary or "no features")
