"""The copy backend the replica's own host<->device interactions go through (testing side only).

The shipped runtime has no process-global backend: the plugin's patches get theirs from their
``PatchContext``. The replica - FastDeploy's stand-in, whose 2.5 code has pinned buffers and events
of its own, and whose census counts every interaction - gets one here: the backend handed over with
``use()`` (harness, fixtures), or, once ``enable()`` is called after that, the enabled plugin's
backend (so the replica and the patches share one simulator), else a ``host`` backend.
"""

from __future__ import annotations

from ...runtime import CopyBackend, HostBackend

_handed: CopyBackend | None = None  # from use()
_plugin_backend_at_use: CopyBackend | None = None  # the plugin's backend when use() was called
_default: CopyBackend | None = None


def _plugin_backend() -> CopyBackend | None:
    import fd_async_copy_plugin

    manager = fd_async_copy_plugin._manager
    return getattr(manager, "backend", None) if manager is not None and manager.enabled else None


def current() -> CopyBackend:
    """The replica's backend: the plugin's if it was enabled after the last ``use()``, else the
    one ``use()`` handed over, else a ``host`` backend."""
    global _default
    plugin = _plugin_backend()
    if plugin is not None and plugin is not _plugin_backend_at_use:
        return plugin
    if _handed is not None:
        return _handed
    if _default is None:
        _default = HostBackend()
    return _default


def use(backend: CopyBackend | None) -> CopyBackend | None:
    """Hand ``backend`` to the replica (``None``: back to the default); returns the previous one."""
    global _handed, _plugin_backend_at_use
    previous, _handed = _handed, backend
    _plugin_backend_at_use = _plugin_backend()
    return previous
