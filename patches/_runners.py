"""Per-runner state of a feature that builds on another one (``step_syncs``, ``overlap``).

Runners are held weakly (a runner FastDeploy drops is freed with its state); a runner the feature
cannot serve is recorded with the reason and reported ``passthrough``; the aggregate never claims
more than what runs (``partial`` when some runners are patched and others not).
"""

from __future__ import annotations

import logging
import threading
import weakref

from fd_async_copy_plugin.registry.patch import wraps

log = logging.getLogger("fd_async_copy")


def describe(runner) -> str:
    return f"{type(runner).__name__}@{id(runner):#x}"


class FeatureRunners:
    """``attr``: where a runner keeps the feature's state (e.g. ``_fdac_syncs``); the state may
    offer ``report() -> dict`` (extra fields of its runner entry) and ``detach()``."""

    def __init__(self, feature: str, attr: str) -> None:
        self.feature, self.attr = feature, attr
        self._lock = threading.Lock()
        self._runners: dict[int, weakref.ref] = {}
        self._stood_down: dict[int, tuple[weakref.ref, str]] = {}

    def add(self, runner, state) -> None:
        setattr(runner, self.attr, state)
        with self._lock:
            self._runners[id(runner)] = weakref.ref(runner)
        weakref.finalize(runner, self._runners.pop, id(runner), None)

    def stand_down(self, runner, reason: str) -> None:
        log.error("fd_async_copy %s: %s; this runner keeps FastDeploy's own path", self.feature, reason)
        with self._lock:
            self._stood_down[id(runner)] = (weakref.ref(runner), reason)
        weakref.finalize(runner, self._stood_down.pop, id(runner), None)

    def live(self) -> list:
        with self._lock:
            refs = list(self._runners.values())
        return [r for r in (ref() for ref in refs) if r is not None]

    def report(self) -> dict | None:
        patched = self.live()
        with self._lock:
            standing = [(ref(), why) for ref, why in self._stood_down.values() if ref() is not None]
        runners = []
        for runner in patched:
            state = runner.__dict__.get(self.attr)
            extra = state.report() if hasattr(state, "report") else {}
            runners.append({"runner": describe(runner), "state": "applied", "reason": "", **extra})
        runners += [{"runner": describe(r), "state": "passthrough", "reason": why} for r, why in standing]
        if not runners:
            return None
        if not standing:
            return {"state": "applied", "reason": "", "runners": runners}
        reasons = "; ".join(sorted({why for _, why in standing}))
        return {"state": "partial" if patched else "passthrough", "reason": reasons, "runners": runners}

    def detach_all(self) -> None:
        runners = self.live()
        with self._lock:
            self._runners.clear()
            self._stood_down.clear()
        for runner in runners:
            state = runner.__dict__.pop(self.attr, None)
            if state is not None and hasattr(state, "detach"):
                state.detach()


def per_runner(original, attr: str):
    """Decorator for a replacement runner method ``body(state, self, *args, **kwargs)``: FastDeploy's
    own method runs for a runner without the feature's state (``attr``)."""

    def decorate(body):
        @wraps(original)
        def method(self, *args, **kwargs):
            state = self.__dict__.get(attr)
            if state is None:
                return original(self, *args, **kwargs)
            return body(state, self, *args, **kwargs)

        return method

    return decorate
