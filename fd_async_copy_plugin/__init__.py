"""fd-async-copy-plugin: asynchronous GPU->host output copies for PaddlePaddle FastDeploy.

Public API (kept stable; FastDeploy users and FastDeploy itself see these names):

- ``register()`` - the ``fastdeploy.model_register_plugins`` entry point ``fd_async_copy``. Cheap
  and idempotent: FastDeploy calls it in the API-server/engine process and in every worker.
- ``enable(features=None, backend="auto", strict=False)``, ``disable()``, ``status()``.

Importing this package does not import Paddle or FastDeploy; ``enable()`` does what it needs.
"""

from __future__ import annotations

import logging
import sys
import threading

__version__ = "0.1.0"

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


def enable(features=None, backend: str = "auto", strict: bool = False, root: str = "fastdeploy") -> dict:
    """Apply the requested features to the FastDeploy found at ``root``; return ``status()``.

    ``features``: None or "all" for every feature, else an iterable (or comma string) of
    ``logprobs``, ``stop_flag``, ``sampled_tokens``, ``sync_scope``. ``backend``: ``auto``,
    ``cuda``, ``host`` (or ``sim``, the race-detecting simulator used by tests). Invalid arguments
    raise ``ConfigError`` before anything is touched. Features whose FastDeploy modules are not
    imported yet are applied when they are (state ``pending`` until then).
    """
    from .config import API_BACKENDS, ConfigError, parse_backend, parse_features

    if features is None or isinstance(features, str):
        names = parse_features(features, source="features")
    else:
        features = list(features)
        if not features:
            raise ConfigError("features=[] names no feature; pass None or 'all' for every feature")
        names = parse_features(",".join(features), source="features")
    backend = parse_backend(backend, source="backend", allowed=API_BACKENDS)
    _get_manager().enable(names, backend=backend, strict=bool(strict), root=root)
    return status()


def disable() -> None:
    """Revert every patch, restoring the exact original objects."""
    if _manager is not None:
        _manager.disable()


def status() -> dict:
    """JSON-serialisable state: enabled, fastdeploy_version, profile, backend, features, ops."""
    return _get_manager().status()


def register() -> None:
    """FastDeploy plugin entry point (group ``fastdeploy.model_register_plugins``)."""
    global _inactive_logged
    from .config import AsyncCopyConfig, ConfigError, strict_from_env

    _ensure_log_handler()
    try:
        config = AsyncCopyConfig.from_env()
    except ConfigError as exc:
        log.error("fd_async_copy: %s. FastDeploy runs unpatched.", exc)
        if strict_from_env():
            raise
        return
    if not config.enabled:
        if not _inactive_logged:
            log.info(
                "fd_async_copy: loaded but inactive; set FD_ASYNC_COPY=1 to enable asynchronous "
                "output copies (see `fd-async-copy doctor`)"
            )
            _inactive_logged = True
        return
    manager = _get_manager()
    if manager.enabled:
        return  # idempotent: a second call in the same process changes nothing
    try:
        enable(config.features, backend=config.backend, strict=config.strict)
    except Exception:
        # FastDeploy calls this at module level of its models package: an exception here would stop
        # the server from starting. Only strict mode asks for that.
        if config.strict:
            raise
        log.exception("fd_async_copy: enabling failed; FastDeploy runs unpatched")
        disable()
        return
    summary = ", ".join(f"{n}={s['state']}" for n, s in status()["features"].items())
    log.info("fd_async_copy: %s", summary or "no features")
