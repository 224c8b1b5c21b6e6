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

    Called once per ``enable()``. Feature names must be unique across plugins.
    """


@hookspec
def fd_async_copy_feature_state(name, state, reason):
    """Notification: feature ``name`` entered ``state`` ("applied", "native", "skipped",
    "failed", "pending", "reverted") for ``reason``. Return value ignored."""


@hookspec
def fd_async_copy_status_extra(status):
    """Return a dict of extra JSON-serialisable entries to merge into ``status()`` (optional)."""
