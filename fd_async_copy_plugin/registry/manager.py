"""PatchManager: collects features through pluggy, decides per feature, applies, reverts, reports."""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any

import pluggy

from .. import runtime
from ..profile import ProfileInfo, detect_profile
from . import hookspecs
from .imports import WATCHER
from .patch import AppliedFeature, Feature, IncompatibleError, PatchContext, apply_feature

log = logging.getLogger("fd_async_copy")

ENTRY_POINT_GROUP = "fd_async_copy"
STATES = ("applied", "native", "skipped", "failed", "pending")


class StrictModeError(RuntimeError):
    """Raised in strict mode when a requested feature was skipped or failed."""


@dataclass
class FeatureState:
    state: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"state": self.state, "reason": self.reason}


def plugin_manager() -> pluggy.PluginManager:
    """A pluggy manager with every patch set from the ``fd_async_copy`` entry-point group."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    if not pm.get_plugins():
        # A source checkout run without `pip install`: the entry points are not registered.
        # Register the built-in set through the same pluggy path so behaviour is identical.
        from .. import patches as builtin

        log.debug("fd_async_copy: no entry points in group %r; registering built-ins", ENTRY_POINT_GROUP)
        pm.register(builtin, name="builtin")
    return pm


def collect_features(pm: pluggy.PluginManager) -> dict[str, Feature]:
    features: dict[str, Feature] = {}
    for contributed in pm.hook.fd_async_copy_features():
        for feature in contributed or ():
            if feature.name in features:
                raise ValueError(f"two plugins contribute a feature named {feature.name!r}")
            features[feature.name] = feature
    return features


class PatchManager:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.pm: pluggy.PluginManager | None = None
        self.enabled = False
        self.root = "fastdeploy"
        self.backend_name = "none"
        self.backend: Any = None
        self.profile: ProfileInfo | None = None
        self.states: dict[str, FeatureState] = {}
        self.applied: dict[str, AppliedFeature] = {}
        self._pending: dict[str, Any] = {}
        self.strict = False
        self.requested: tuple[str, ...] = ()
        self.requested_backend = "auto"
        self._features: dict[str, Feature] = {}

    def add_plugin(self, plugin, name: str | None = None) -> None:
        """Register a patch-set plugin object (what an ``fd_async_copy`` entry point provides)."""
        self.pm = self.pm or plugin_manager()
        self.pm.register(plugin, name=name)

    # -- decisions -----------------------------------------------------------------------------
    def _set_state(self, name: str, state: str, reason: str) -> None:
        self.states[name] = FeatureState(state, reason)
        level = logging.INFO if state in ("applied", "native", "pending") else logging.WARNING
        log.log(level, "fd_async_copy: feature %s: %s (%s)", name, state, reason)
        self._notify(name, state, reason)

    def _notify(self, name: str, state: str, reason: str) -> None:
        """Tell observers; a failing third-party hook must not break FastDeploy (it may run inside
        FD's own imports, when a deferred feature is applied)."""
        if self.pm is None:
            return
        try:
            self.pm.hook.fd_async_copy_feature_state(name=name, state=state, reason=reason)
        except Exception:
            log.exception("fd_async_copy: a fd_async_copy_feature_state hook failed (ignored)")

    def plan(
        self, feature: Feature, profile: str, requested: tuple[str, ...], profile_reason: str = ""
    ) -> tuple[str, str]:
        """(state, reason) a feature gets before any import: apply / native / skipped."""
        if profile in ("absent", "unknown"):
            what = "FastDeploy not found" if profile == "absent" else "unrecognised FastDeploy"
            return "skipped", f"{what}: {profile_reason or profile}; nothing patched"
        decision = feature.profiles.get(profile)
        if decision is None:
            known = ", ".join(sorted(feature.profiles))
            return "skipped", f"not for profile {profile!r} (serves: {known}); FastDeploy left as is"
        if decision.startswith("native"):
            return "native", decision.partition(":")[2].strip() or "FastDeploy already does this"
        missing = [r for r in feature.requires if r not in requested]
        if missing:
            return "skipped", f"needs feature(s) {', '.join(missing)} requested too"
        return "apply", f"mirrors {feature.mirrors}" if feature.mirrors else "apply"

    # -- enable / disable ----------------------------------------------------------------------
    def enable(
        self,
        features: tuple[str, ...],
        backend: str = "auto",
        strict: bool = False,
        root: str = "fastdeploy",
    ) -> None:
        with self._lock:
            if self.enabled:
                same = (root, backend, strict) == (self.root, self.requested_backend, self.strict)
                if same and set(features) <= set(self.states):
                    return  # idempotent: FastDeploy calls the entry point in every process, maybe twice
                self.disable()
            self.pm = self.pm or plugin_manager()
            self.root, self.strict = root, strict
            self.requested, self.requested_backend = tuple(features), backend
            self.enabled = True
            self.states = {}
            all_features = collect_features(self.pm)
            self._features = all_features
            unknown = [f for f in features if f not in all_features]
            for name in unknown:
                self._set_state(name, "skipped", "no installed patch set provides this feature")
            self.profile = detect_profile(root)
            profile = self.profile.profile
            planned = {}
            for name in features:
                if name in all_features:
                    planned[name] = self.plan(all_features[name], profile, features, self.profile.reason)
            for name, (state, reason) in planned.items():
                if state != "apply":
                    self._set_state(name, state, reason)
            # Dependencies first (sampled_tokens needs stop_flag applied), whatever order was asked.
            to_apply = _dependency_order(
                [name for name, (state, _) in planned.items() if state == "apply"], all_features
            )
            if not to_apply:
                self._finish_strict()
                return
            try:
                self.backend = runtime.make_backend(backend)
                self.backend_name = self.backend.name
            except Exception as exc:
                self.backend, self.backend_name = None, backend
                for name in to_apply:
                    self._set_state(name, "skipped", f"backend stands down: {exc}")
                self._finish_strict()
                return
            runtime.use(self.backend)
            for name in to_apply:
                feature = all_features[name]
                ops = None
                if feature.needs_ops:
                    ops, why = _load_ops()
                    if ops is None:
                        prefix = "custom ops unavailable"
                        self._set_state(name, "skipped", why if why.startswith(prefix) else f"{prefix}: {why}")
                        continue
                ctx = PatchContext(
                    root=root, profile=profile, backend=self.backend, features=features, ops=ops, strict=strict,
                    stand_down=functools.partial(self._stand_down, name),
                )
                self._schedule(feature, ctx)
            self._finish_strict()

    def _schedule(self, feature: Feature, ctx: PatchContext) -> None:
        """Apply now if every module is imported; otherwise when the last one is."""
        modules = feature.module_names(ctx)
        waiting = [m for m in modules if not WATCHER.is_ready(m)]
        if not waiting:
            self._apply(feature, ctx)
            return
        self._set_state(feature.name, "pending", f"waiting for import of {', '.join(waiting)}")

        def on_import() -> None:
            if not self.enabled or self._pending.get(feature.name) is not on_import:
                return
            if all(WATCHER.is_ready(m) for m in modules):
                self._pending.pop(feature.name, None)
                self._apply(feature, ctx)
                self._finish_strict()

        self._pending[feature.name] = on_import
        for module in waiting:
            WATCHER.when_ready(module, on_import)

    def _apply(self, feature: Feature, ctx: PatchContext) -> None:
        unmet = [r for r in feature.requires if self.states.get(r, FeatureState("", "")).state != "applied"]
        if unmet:
            detail = ", ".join(f"{r} is {self.states[r].state if r in self.states else 'not requested'}" for r in unmet)
            self._set_state(feature.name, "skipped", f"needs {detail}")
            return
        try:
            self.applied[feature.name] = apply_feature(feature, ctx)
        except IncompatibleError as exc:
            self._set_state(feature.name, "skipped", f"incompatible: {exc}")
        except Exception as exc:  # never let a patch crash the server; FD stays unpatched
            log.exception("fd_async_copy: applying %s failed; FastDeploy left unpatched", feature.name)
            self._set_state(feature.name, "failed", f"{type(exc).__name__}: {exc}")
        else:
            self._set_state(feature.name, "applied", self.states_reason(feature))

    def _stand_down(self, name: str, reason: str) -> None:
        """A patch left FastDeploy's own path in place at run time (its wrappers pass through)."""
        self._set_state(name, "skipped", reason)
        for dependent, state in list(self.states.items()):
            if state.state == "applied" and name in getattr(self._features.get(dependent), "requires", ()):
                self._set_state(dependent, "skipped", f"needs {name}, which stood down: {reason}")

    @staticmethod
    def states_reason(feature: Feature) -> str:
        return f"mirrors {feature.mirrors}" if feature.mirrors else "applied"

    def _ordered_names(self) -> list[str]:
        """Feature names in the order they were requested (states are set in decision order)."""
        requested = [n for n in self.requested if n in self.states]
        return requested + [n for n in self.states if n not in requested]

    def _finish_strict(self) -> None:
        if not self.strict:
            return
        bad = {n: s for n, s in self.states.items() if s.state in ("skipped", "failed")}
        if bad:
            detail = "; ".join(f"{n}: {s.state} ({s.reason})" for n, s in bad.items())
            self.disable()
            raise StrictModeError(f"FD_ASYNC_COPY_STRICT=1 and not every feature applied: {detail}")

    def disable(self) -> None:
        with self._lock:
            for callback in self._pending.values():
                WATCHER.cancel(callback)
            self._pending.clear()
            for name in reversed(list(self.applied)):
                self.applied.pop(name).revert()
                self._notify(name, "reverted", "disable()")
            if self.enabled:
                runtime.use(None)
            self.enabled = False
            self.states = {}
            self.backend = None
            self.backend_name = "none"

    # -- reporting -----------------------------------------------------------------------------
    def status(self) -> dict:
        WATCHER.poll()
        profile = self.profile or detect_profile(self.root)
        status = {
            "enabled": self.enabled,
            "fastdeploy_version": profile.version,
            "profile": profile.profile,
            "profile_reason": profile.reason,
            "root": self.root,
            "backend": self.backend_name,
            "strict": self.strict,
            "features": {n: self.states[n].as_dict() for n in self._ordered_names()},
            "ops": _ops_status(),
            # the cuda backend's startup probe per device (runtime/probe.py); {} before first use
            "accessor_probe": {str(d): r for d, r in getattr(self.backend, "probes", {}).items()},
        }
        if self.pm is not None:
            for extra in self.pm.hook.fd_async_copy_status_extra(status=status):
                status.update(extra or {})
        return status


def _dependency_order(names: list[str], features: dict[str, Feature]) -> list[str]:
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered or name not in names:
            return
        for required in features[name].requires:
            visit(required)
        ordered.append(name)

    for name in names:
        visit(name)
    return ordered


def _load_ops():
    try:
        from ..ops import load_ops
    except Exception as exc:  # pragma: no cover - the ops package is part of the plugin
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return load_ops(), ""
    except Exception as exc:
        return None, str(exc)


def _ops_status() -> dict:
    try:
        from ..ops import ops_status

        return ops_status()
    except Exception as exc:
        return {"state": "unavailable", "error": f"{type(exc).__name__}: {exc}"}
