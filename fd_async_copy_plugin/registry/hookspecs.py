"""What a patch set provides, as pluggy hook specifications (project ``fd_async_copy``).

pluggy does one job here: it finds the patch sets - modules registered through the
``fd_async_copy`` entry-point group (today the built-in ``fd_async_copy_plugin.patches``) - and calls
the two hooks below on each. The feature lifecycle itself - the declared targets, the checks,
``prepare``/``report``/``quiesce``/``teardown`` - is the ``Feature`` class protocol in
``registry/patch.py``, not a set of hooks: a patch set subclasses ``Feature``. A feature is
requested by name, and ``config.KNOWN_FEATURES`` lists the names ``FD_ASYNC_COPY_FEATURES`` and
``enable()`` accept (a typo is an error, not an unknown plugin), so a new patch set's feature names
are added there.
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


@hookspec
def fd_async_copy_order():
    """Return ``{"module:attr": (feature, ...)}``: the order of the features' links around each
    FastDeploy attribute several features touch, outermost first (``registry.patch.Junction``).
    Two patch sets giving different rows for one attribute is an error."""
