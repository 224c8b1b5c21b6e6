"""PatchManager: collects features through pluggy, acts on ``plan()``'s decisions, reverts, reports."""

from __future__ import annotations

import functools
import logging
import sys
import threading
from importlib.metadata import entry_points
from typing import Any

import pluggy

from ..config import BACKENDS, RunSettings
from ..profile import ProfileInfo, detect_profile
from .catalog import (ENTRY_POINT_GROUP, FeatureCatalog, available_features, collect_features,  # noqa: F401
                      feature_catalog, plugin_manager)
from .imports import WATCHER
from .patch import STEP_GATE, AppliedFeature, Feature, IncompatibleError, PatchContext, apply_feature
from .plan import (APPLIED, APPLY, FAILED, INCOMPATIBLE, NATIVE, PARTIAL, PASSTHROUGH, PENDING, Decision,
                   option_decision, plan, requirement_decision, strict_violations)

log = logging.getLogger("fd_async_copy")

#: backends beyond the shipped ones: ``name = "module:factory"``, imported only when that name is asked for
BACKEND_GROUP = "fd_async_copy.backends"


def backend_names() -> tuple[str, ...]:
    """Every backend name ``enable(backend=...)`` accepts: the shipped ones, then the entry points'."""
    return BACKENDS + tuple(sorted({ep.name for ep in entry_points(group=BACKEND_GROUP)} - set(BACKENDS)))


def make_backend(name: str):
    """The backend ``name``: a shipped one (``runtime.make_backend``) or an entry point's factory."""
    found = [] if name in BACKENDS else list(entry_points(group=BACKEND_GROUP, name=name))
    if found:
        return found[0].load()()
    from .. import runtime  # imports Paddle: only once a feature is to be applied

    return runtime.make_backend(name)


class StrictModeError(RuntimeError):
    """Raised in strict mode when a requested feature was not applied (see ``plan.REFUSED_IN_STRICT_MODE``)."""


class PatchManager:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.pm: pluggy.PluginManager | None = None
        self.enabled = False
        self.requested, self.root, self.strict, self.settings = (), "fastdeploy", False, None
        self._request: tuple = ()  # the last ``enable()``'s arguments (a repeated identical call: no-op)
        self.backend: Any = None
        self.profile: ProfileInfo | None = None
        self.decisions: dict[str, Decision] = {}
        self.applied: dict[str, AppliedFeature] = {}
        self._pending: dict[str, Any] = {}
        self._features: dict[str, Feature] = {}

    def catalog(self) -> FeatureCatalog:
        """The feature names of this manager's patch sets (the entry points', and those registered
        on ``pm`` itself)."""
        self.pm = self.pm or plugin_manager()
        return feature_catalog(self.pm)

    # -- enable / disable ----------------------------------------------------------------------
    def enable(self, features: tuple[str, ...], backend: str = "auto", strict: bool = False,
               root: str = "fastdeploy", settings: RunSettings | None = None) -> None:
        settings = settings or RunSettings()
        with STEP_GATE.change(), self._lock:
            request = (tuple(features), root, backend, strict, settings)
            if self.enabled:
                if request == self._request:
                    return  # idempotent: FastDeploy calls the entry point in every process, maybe twice
                self.disable()  # a different request is planned afresh, never merged into the old one
            self.pm = self.pm or plugin_manager()
            self._request, self.enabled = request, True
            self.requested, self.root, _, self.strict, self.settings = request
            available = available_features(self.pm)
            self._features = available if isinstance(available, dict) else {}
            self.profile = detect_profile(root)
            # The backend is created only if some feature gets that far in the plan.
            decisions = plan(features, available, self.profile, functools.partial(self._make_backend, backend))
            self.decisions = {}
            for name, decision in decisions.items():
                if decision.option_of is None or decision.option_of not in decisions:
                    self._decide(name, decision)  # an option is decided with its feature
            for name, decision in decisions.items():  # any order: what runs around a method is its line's function
                if decision.state == APPLY and decision.option_of is None:
                    self._schedule(self._features[name])
            self._finish_strict()

    def _make_backend(self, backend: str) -> tuple[str, str]:
        try:
            self.backend = make_backend(backend)
        except Exception as exc:
            return backend, str(exc)
        return self.backend.name, ""

    def _decide(self, name: str, decision: Decision) -> None:
        """Record a feature's decision (and its options'), and log it once."""
        self.decisions[name] = decision
        if decision.state != APPLY:
            level = logging.INFO if decision.state in (APPLIED, NATIVE, PENDING) else logging.WARNING
            log.log(level, "fd_async_copy: feature %s: %s (%s)", name, decision.state, decision.reason)
        feature = self._features.get(name)
        for option in [o for o in getattr(feature, "options", {}) if o in self.requested]:
            self.decisions[option] = option_decision(feature, option, decision)

    def _context(self, feature: Feature) -> PatchContext:
        options = frozenset(o for o in feature.options if o in self.requested)
        stand_down = functools.partial(self._stand_down, feature.name)
        return PatchContext(self.root, self.profile.profile, self.backend, options, self.strict,
                            stand_down=stand_down, settings=self.settings)

    def _schedule(self, feature: Feature) -> None:
        """Apply now if every module is imported; otherwise when the last one is."""
        modules = feature.modules(self.root, self.profile.profile)
        waiting = [m for m in modules if not WATCHER.is_ready(m)]
        if not waiting:
            self._apply(feature)
            return
        self._decide(feature.name, Decision(PENDING, f"waiting for import of {', '.join(waiting)}"))

        def on_import() -> None:
            still_wanted = self.enabled and self._pending.get(feature.name) is on_import
            if still_wanted and all(WATCHER.is_ready(m) for m in modules):
                self._pending.pop(feature.name, None)
                self._apply(feature)
                self._finish_strict()

        self._pending[feature.name] = on_import
        for module in waiting:
            WATCHER.when_ready(module, on_import)

    def _apply(self, feature: Feature) -> None:
        # What it builds on may have ended incompatible/failed when it was applied itself.
        unmet = requirement_decision(feature, self.decisions, self.profile.profile)
        if unmet is not None:
            self._decide(feature.name, unmet)
            return
        try:
            self.applied[feature.name] = apply_feature(feature, self._context(feature))
        except IncompatibleError as exc:
            self._decide(feature.name, Decision(INCOMPATIBLE, str(exc)))
        except Exception as exc:  # never let a patch crash the server; FD stays unpatched
            log.exception("fd_async_copy: applying %s failed; FastDeploy left unpatched", feature.name)
            self._decide(feature.name, Decision(FAILED, f"{type(exc).__name__}: {exc}"))
        else:
            mirrors = feature.mirrors_in(self.profile.profile)
            self._decide(feature.name, Decision(APPLIED, f"mirrors {mirrors}" if mirrors else "applied"))

    def _stand_down(self, name: str, reason: str) -> None:
        """A patch left FastDeploy's own path in place at run time (its wrappers pass through)."""
        self._decide(name, Decision(PASSTHROUGH, reason))

    def _finish_strict(self) -> None:
        if refused := (strict_violations(self.decisions) if self.strict else ""):
            self.disable()
            raise StrictModeError(f"FD_ASYNC_COPY_STRICT=1 and not every feature applied: {refused}")

    def disable(self) -> None:
        with STEP_GATE.change(), self._lock:
            for callback in self._pending.values():
                WATCHER.cancel(callback)
            self._pending.clear()
            for name in reversed(list(self.applied)):
                self.applied.pop(name).revert()
            if self.backend is not None:
                self.backend.release_freed()  # the pinned memory of what the revert dropped
            self.enabled, self.decisions, self.backend = False, {}, None

    # -- reporting -----------------------------------------------------------------------------
    def status(self) -> dict:
        """What this process's plugin did; reads state only (loads nothing, fires nothing). Taken
        under the manager's lock: never the half of an ``enable()``/``disable()`` in progress."""
        with self._lock:
            return self._status()

    def _status(self) -> dict:
        profile, features = self.profile or detect_profile(self.root), self._feature_report()
        # enabled: enable() ran AND some feature's patches are in place or waiting for FD's import;
        # with every feature skipped, native, incompatible or failed nothing of the plugin runs
        active = any(e.get("state") in (APPLIED, PENDING, PARTIAL, PASSTHROUGH) for e in features.values())
        out = {
            "enabled": self.enabled and active,
            "fastdeploy_version": profile.version,
            "profile": profile.profile, "profile_reason": profile.reason,
            "root": self.root, "strict": self.strict,
            "backend": self.backend.name if self.backend is not None else "none",
            "features": features,
            "ops": ops_report(),
            # the cuda backend's startup probe per device (runtime/probe.py); {} before first use
            "accessor_probe": {str(d): r for d, r in getattr(self.backend, "probes", {}).items()},
            # the cuda backend: a step's copies in one C call (fdac_d2h_batch) or one ctypes call each, and why;
            # whether that call issues the copies in one cudaMemcpyBatchAsync (CUDA >= 12.8), and why
            "copy_batch": getattr(self.backend, "batch_origin", None),
            "copy_batch_api": getattr(getattr(getattr(self.backend, "rt", None), "batch", None), "batch_api_state", None),
            # FD_ASYNC_COPY_SYNC_CHECK: host waits per decode step by site ({"mode": "off"} when off)
            "sync_check": _sync_check_status()}
        if self.enabled and not active:
            out["enabled_reason"] = ("enable() ran, but no feature is applied or pending: each requested feature is "
                                     "skipped, native, incompatible or failed (see features); FastDeploy runs as is")
        return out


    def _feature_report(self) -> dict:
        """Each feature's decision, checked against what is bound now: a feature whose replacements
        were re-bound away (a reloaded FastDeploy module) is not reported applied."""
        report = {n: self.decisions[n].as_dict() for n in self.requested if n in self.decisions}
        for name, applied in list(self.applied.items()):
            try:
                runs = applied.feature.report(applied.ctx)
            except Exception as exc:  # reporting must never fail
                runs = {"state": FAILED, "reason": f"cannot report: {type(exc).__name__}: {exc}"}
            if lost := applied.drifted():
                runs = {"state": FAILED, "runners": [],
                        "reason": f"no longer in place (module reloaded?): {', '.join(lost)} are not the plugin's; "
                                  "FastDeploy's own code runs there - disable() and enable() to re-apply"}
            for key in [name, *getattr(applied.feature, "options", {})] if runs else ():
                if key in report and report[key]["state"] == APPLIED:
                    entry = report[key] if runs["state"] == APPLIED else {"state": runs["state"], "reason": runs["reason"]}
                    report[key] = {**entry, "runners": list(runs.get("runners", []))}
        return report


def _sync_check_status() -> dict:
    module = sys.modules.get("fd_async_copy_plugin.sync_check")  # not imported: never armed
    return module.status() if module is not None else {"mode": "off"}


def ops_report() -> dict:
    """The custom ops as this process has them, without loading them (and without Paddle)."""
    if "paddle" not in sys.modules:
        return {"loadable": None, "error": "not checked: Paddle is not imported in this process"}
    try:
        from ..ops import ops_status

        return ops_status(load=False)
    except Exception as exc:
        return {"loadable": None, "error": f"{type(exc).__name__}: {exc}"}
