"""The installed patch sets and the feature names they answer to (pluggy).

A patch set is a module registered in the ``fd_async_copy`` entry-point group (the built-in one,
``fd_async_copy_plugin.patches``, and any third-party distribution's). ``feature_catalog()`` asks
each for its names (``hookspecs.fd_async_copy_catalog``, answered without importing Paddle):
``FD_ASYNC_COPY_FEATURES``, ``enable(features=...)`` and ``doctor`` accept exactly those names (and
those of features a set returns without naming them there: in ``all``), and ``all`` stands for the
``default`` ones. No list of feature names is kept anywhere else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pluggy

from . import hookspecs
from .plan import PADDLE_INSTALL_HINT

log = logging.getLogger("fd_async_copy")

ENTRY_POINT_GROUP = "fd_async_copy"
#: ``default``: in ``all``; ``opt-in``: applied only when named (``all,overlap``); ``option``: an
#: option of a feature (``Feature.options``), in ``all`` like its feature
KINDS = ("default", "opt-in", "option")


@dataclass(frozen=True)
class FeatureCatalog:
    default: tuple[str, ...] = ()  # what ``all`` stands for, in the patch sets' order
    opt_in: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return self.default + self.opt_in


def plugin_manager() -> pluggy.PluginManager:
    """A pluggy manager with every patch set from the ``fd_async_copy`` entry-point group."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    if pm.get_plugin("builtin") is None:
        # A source checkout run without `pip install`: the entry points are not registered.
        # Register the built-in set through the same pluggy path so behaviour is identical.
        from .. import patches as builtin

        log.debug("fd_async_copy: no built-in entry point in group %r; registering it", ENTRY_POINT_GROUP)
        pm.register(builtin, name="builtin")
    return pm


def feature_catalog(pm: pluggy.PluginManager | None = None) -> FeatureCatalog:
    """The names of the installed patch sets (``pm``'s, else the entry points'), built-in set first."""
    pm = pm or plugin_manager()
    default, opt_in = {}, {}  # name -> None (ordered sets): what ``all`` stands for, the opt-in ones
    impls = sorted(pm.hook.fd_async_copy_catalog.get_hookimpls(), key=lambda impl: impl.plugin_name != "builtin")
    for impl in impls:  # the built-in set first, then the others as pluggy found them
        for name, kind in (impl.function() or {}).items():
            if kind not in KINDS:
                raise ValueError(f"patch set feature {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
            if name in default or name in opt_in or name == "all":
                raise ValueError(f"two patch sets answer to the feature name {name!r}")
            (opt_in if kind == "opt-in" else default)[name] = None
    features = available_features(pm)  # a set naming a feature only there: it is in ``all``
    for feature in features.values() if isinstance(features, dict) else ():
        default.update(dict.fromkeys(n for n in (feature.name, *feature.options) if n not in opt_in))
    return FeatureCatalog(tuple(default), tuple(opt_in))


def collect_features(pm: pluggy.PluginManager) -> dict:
    features: dict = {}
    for contributed in pm.hook.fd_async_copy_features():
        for feature in contributed or ():
            if feature.name in features:
                raise ValueError(f"two plugins contribute a feature named {feature.name!r}")
            features[feature.name] = feature
    return features


def available_features(pm: pluggy.PluginManager) -> dict | str:
    """The installed features, or why they cannot be loaded (the patch sets need Paddle)."""
    try:
        return collect_features(pm)
    except ModuleNotFoundError as exc:
        if str(exc.name).partition(".")[0] != "paddle":
            raise
        return f"Paddle is not importable ({exc}): {PADDLE_INSTALL_HINT}"
