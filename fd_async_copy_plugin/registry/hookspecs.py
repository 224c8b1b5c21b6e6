"""The plugin surface of fd-async-copy, as pluggy hook specifications (project ``fd_async_copy``).

This module is the table of contents: every extension point is here. The built-in patch sets
(``fd_async_copy_plugin.patches``) implement these hooks and are registered through the
``fd_async_copy`` entry-point group, exactly like a third-party patch set would be.
"""

from __future__ import annotations

import pluggy

PROJECT = "fd_async_copy"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def fd_async_copy_features():
    """Return a list of ``Feature`` objects (see ``registry.patch``) this plugin contributes.

    Called once per ``enable()`` (and by ``fd-async-copy doctor``). Feature names must be unique
    across plugins. A feature's state is reported by ``status()``; there is no notification hook:
    observers read ``fd_async_copy_plugin.status()``.
    """
