"""Patches and features: declared targets, a compatibility check, all-or-nothing apply, exact revert.

A ``Feature`` (e.g. ``logprobs``) is a set of ``Patch`` objects. Each patch names its ``Target``
(module relative to the FastDeploy root + attribute path) and builds a replacement from the
original. Applying a feature:

1. resolves every target (the module must be fully imported; the attribute must exist);
2. runs every patch's ``check`` and the feature's ``check`` - nothing is touched yet;
3. builds every replacement;
4. sets them one by one; if any set fails, the ones already set are restored in reverse order.

Reverting restores the exact original objects (``is``-identical), including class attributes that
were inherited (those are deleted again rather than shadowed). Targets with ``required=False`` are
modules that re-bound a name with ``from ... import`` (e.g. the Metax/GCU runners importing
``post_process``): patched when loaded, and restored on revert wherever they still point at the
replacement.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

_MISSING = object()


class IncompatibleError(RuntimeError):
    """This FastDeploy does not have the shape a patch expects. Nothing was changed."""


@dataclass(frozen=True)
class Target:
    module: str  # relative to the FastDeploy root, e.g. "worker.gpu_model_runner"
    attr: str  # attribute path inside the module, e.g. "GPUModelRunner.not_need_stop"
    required: bool = True
    #: ``module`` is a full module name outside FastDeploy (e.g. ``paddle.device``)
    absolute: bool = False

    def module_name(self, root: str) -> str:
        if self.absolute:
            return self.module
        return f"{root}.{self.module}" if self.module else root

    def describe(self, root: str) -> str:
        return f"{self.module_name(root)}:{self.attr}"

    def resolve(self, root: str) -> tuple[Any, str, Any]:
        """(owner object, final attribute name, current raw value) - raises IncompatibleError."""
        name = self.module_name(root)
        module = sys.modules.get(name)
        if module is None:
            try:
                module = importlib.import_module(name)
            except Exception as exc:
                raise IncompatibleError(f"cannot import {name}: {exc}") from exc
        owner: Any = module
        parts = self.attr.split(".")
        for part in parts[:-1]:
            owner = getattr(owner, part, _MISSING)
            if owner is _MISSING or owner is None:
                raise IncompatibleError(f"{self.describe(root)}: {part!r} not found")
        last = parts[-1]
        raw = _raw_attr(owner, last)
        if raw is _MISSING:
            raise IncompatibleError(f"{self.describe(root)} not found")
        return owner, last, raw


def _raw_attr(owner: Any, name: str) -> Any:
    """The attribute as stored (a class's own ``__dict__`` entry keeps staticmethod wrappers)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                return vars(klass)[name]
        return _MISSING
    return getattr(owner, name, _MISSING)


@dataclass
class Patch:
    target: Target
    #: builds the replacement from (original raw value, context)
    build: Callable[[Any, "PatchContext"], Any]
    #: raises IncompatibleError when the original does not look as expected
    check: Callable[[Any, "PatchContext"], None] | None = None


@dataclass
class PatchContext:
    """What a feature needs to build its patches: where FD is, which FD, how to copy."""

    root: str
    profile: str
    backend: Any  # runtime.CopyBackend
    features: tuple[str, ...]  # every feature requested in this enable() call
    ops: Any = None  # loaded custom ops, or None
    state: dict[str, Any] = field(default_factory=dict)  # feature-owned runtime state
    strict: bool = False
    #: called by a patch that finds, at run time, that it must leave FastDeploy's own path in place
    #: (e.g. a runner too large for the kernels); the manager records the feature as skipped
    stand_down: Callable[[str], None] = lambda reason: None

    def module(self, relative: str):
        return sys.modules[f"{self.root}.{relative}" if relative else self.root]


class Feature:
    """Base class for a patch set. Subclasses set the class attributes and ``patches``."""

    #: feature name as used in FD_ASYNC_COPY_FEATURES
    name: str = ""
    #: upstream PR(s) it mirrors, for status/doctor
    mirrors: str = ""
    #: profile -> "apply" or "native: <why>"; profiles not listed are skipped
    profiles: dict[str, str] = {}
    #: other features that must be requested together with this one
    requires: tuple[str, ...] = ()
    #: needs the compiled custom ops
    needs_ops: bool = False

    def modules(self, ctx: PatchContext) -> list[str]:
        """Modules (relative to root) that must be fully imported before applying."""
        return sorted({p.target.module for p in self.patches(ctx) if p.target.required and not p.target.absolute})

    def module_names(self, ctx: PatchContext) -> list[str]:
        """Full names of the modules to wait for (``modules()`` under the root, plus absolute ones)."""
        names = {f"{ctx.root}.{m}" if m else ctx.root for m in self.modules(ctx)}
        names |= {p.target.module for p in self.patches(ctx) if p.target.required and p.target.absolute}
        return sorted(names)

    def patches(self, ctx: PatchContext) -> list[Patch]:
        raise NotImplementedError

    def check(self, ctx: PatchContext) -> None:
        """Feature-level compatibility check, after every target resolved. Raise IncompatibleError."""

    def prepare(self, ctx: PatchContext) -> None:
        """Create runtime state (buffers, rings) - after checks, before patching."""

    def teardown(self, ctx: PatchContext) -> None:
        """Drop runtime state after revert."""


@dataclass
class _Applied:
    owner: Any
    name: str
    original: Any
    replacement: Any
    own: bool  # the original lived in owner's own __dict__ (else it was inherited)
    target: Target


class AppliedFeature:
    """The record of one applied feature: enough to restore every original exactly."""

    def __init__(self, feature: Feature, ctx: PatchContext, records: list[_Applied]) -> None:
        self.feature = feature
        self.ctx = ctx
        self.records = records

    def revert(self) -> None:
        for record in reversed(self.records):
            _restore(record)
        # Modules that imported the replaced name after we patched (``from x import name``)
        # hold the replacement: point them back at the original too (one pass over all modules).
        originals = {id(r.replacement): r.original for r in self.records if r.replacement is not r.original}
        if originals:
            for module in list(sys.modules.values()):
                namespace = getattr(module, "__dict__", None)
                if not isinstance(namespace, dict):
                    continue
                for key, value in list(namespace.items()):
                    original = originals.get(id(value), _MISSING)
                    if original is not _MISSING:
                        namespace[key] = original
        self.feature.teardown(self.ctx)


def _set(owner: Any, name: str, value: Any) -> None:
    setattr(owner, name, value)


def _restore(record: _Applied) -> None:
    if record.own:
        _set(record.owner, record.name, record.original)
    else:
        delattr(record.owner, record.name)


def apply_feature(feature: Feature, ctx: PatchContext) -> AppliedFeature:
    """All-or-nothing apply. Raises IncompatibleError (nothing changed) or re-raises the error
    that stopped a partial apply after restoring every original."""
    patches = feature.patches(ctx)
    resolved = []
    for patch in patches:
        if not patch.target.required and patch.target.module_name(ctx.root) not in sys.modules:
            continue  # an importer of the name that is not loaded: it will import the replacement
        owner, name, original = patch.target.resolve(ctx.root)
        if patch.check is not None:
            patch.check(original, ctx)
        own = (name in vars(owner)) if isinstance(owner, type) else True
        resolved.append((patch, owner, name, original, own))
    feature.check(ctx)
    feature.prepare(ctx)
    records: list[_Applied] = []
    try:
        built = [(p, o, n, orig, own, p.build(orig, ctx)) for p, o, n, orig, own in resolved]
        for patch, owner, name, original, own, replacement in built:
            _set(owner, name, replacement)
            records.append(_Applied(owner, name, original, replacement, own, patch.target))
    except BaseException:
        for record in reversed(records):
            _restore(record)
        feature.teardown(ctx)
        raise
    return AppliedFeature(feature, ctx, records)
