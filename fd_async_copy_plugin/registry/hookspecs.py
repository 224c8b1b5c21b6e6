"""What a patch set provides, as pluggy hook specifications (project ``fd_async_copy``).

pluggy does one job here: it finds the patch sets - modules registered through the
``fd_async_copy`` entry-point group (the built-in ``fd_async_copy_plugin.patches`` and any
third-party distribution's) - and calls the hooks below on each. The feature lifecycle itself - the declared targets, the checks,
``prepare``/``report``/``quiesce``/``teardown`` - is the ``Feature`` class protocol in
``registry/patch.py``, not a set of hooks: a patch set subclasses ``Feature``. A feature is
requested by name; the names ``FD_ASYNC_COPY_FEATURES`` and ``enable()`` accept are those the
installed sets' ``fd_async_copy_catalog`` give (a typo is an error naming them).
"""

from __future__ import annotations

import pluggy

PROJECT = "fd_async_copy"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def fd_async_copy_catalog():
    """Return ``{name: kind}``: the feature names this patch set answers to, without importing
    Paddle or FastDeploy (``doctor`` and the configuration read it). ``kind``: ``default`` (in
    ``all``), ``opt-in`` (applied only when named) or ``option`` (an option of a feature). A feature
    ``fd_async_copy_features`` returns that is not named here is a ``default`` one."""


@hookspec
def fd_async_copy_features():
    """Return a list of ``Feature`` objects (see ``registry.patch``) this plugin contributes.

    Called once per ``enable()`` (and by ``fd-async-copy doctor``). Feature names must be unique
    across plugins. A feature's state is reported by ``status()``; there is no notification hook:
    observers read ``fd_async_copy_plugin.status()``.
    """

