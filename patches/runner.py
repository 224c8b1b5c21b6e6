"""The runner's plugin state, and how a feature names its line's function around a FastDeploy method.

What runs around a FastDeploy method is one function per FastDeploy line (``fd24/methods.py``,
``fd25/methods.py``); a feature names it with ``Patch(target, line("name"))``.

Per runner, ``RunnerState`` holds the features' parts (``stop``, ``syncs``, ``overlap``), each None
where that feature does not run for the runner. It is made in one place - the first part set up in
``_init_share_inputs`` - and found with ``runner_state()``/``parts_of()``; this module is the only
one that knows where a runner keeps it. A part never reads another part's private fields: what one
needs of another is a named method of ``RunnerState``.
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref

from fd_async_copy_plugin.registry.patch import Feature, IncompatibleError, Shared

log = logging.getLogger("fd_async_copy")

_SLOT = "_fdac_state"  # where a runner keeps its RunnerState (only this module names it)


class RunnerState:
    """One GPUModelRunner's plugin state: the features' parts, each None where it does not run."""

    __slots__ = ("stop", "syncs", "overlap", "__weakref__")

    def __init__(self) -> None:
        # stop_flag.StopFlagState, step_syncs.RunnerSyncs (no shadow on FD 2.5), overlap.OverlapState
        self.stop = self.syncs = self.overlap = None

    # -- what one part needs of another ---------------------------------------------------------
    def step_copies(self) -> list:
        """Right after the update op: the copies (dst, src, label) the step's event must cover
        (step_syncs' snapshot, then overlap's step flag), issued by the stop flag in one batch."""
        copies = []
        if self.syncs is not None and self.syncs.shadow is not None:
            copies += self.syncs.shadow.snapshot_copies()
        if self.overlap is not None and self.stop is not None:
            copies += self.overlap.step_flag_copies(self.stop.device)
        return copies

    def save_deferred(self) -> bool:
        """This step's save runs one step later (overlap): post_process leaves the flag pending."""
        return self.overlap is not None and self.overlap.in_step

    def holds_unsaved_step(self) -> bool:
        """A step's save (and its event wait) is still to come (overlap)."""
        return self.overlap is not None and self.overlap.holds_step()

    def bound_count_step(self) -> bool:
        """This step is sized with FD 2.5's upper bound (overlap ``bound``/``exact``), not the exact count."""
        return self.overlap is not None and self.overlap.in_step and self.overlap.by_bound

    def step_saved(self, reader: str) -> None:
        """A step's save waited on its event: its snapshot has landed."""
        if self.syncs is not None and self.syncs.shadow is not None:
            self.syncs.shadow.refresh(reader)


def runner_state(runner, create: bool = False) -> RunnerState | None:
    """The runner's ``RunnerState`` (made with ``create``), or None."""
    state = runner.__dict__.get(_SLOT)
    if state is None and create:
        state = runner.__dict__[_SLOT] = RunnerState()
    return state


_NONE = RunnerState()  # a runner without plugin state: every part None (never written)


def parts_of(runner) -> RunnerState:
    """The runner's ``RunnerState``, or one whose parts are all None."""
    return runner.__dict__.get(_SLOT) or _NONE


#: FastDeploy profile -> the module of that line's functions (each line's package registers itself)
LINES: dict = {}


def line(name: str):
    """A ``Patch.build``: the function ``name`` of the applying FastDeploy line (``LINES``)."""

    def build(original, ctx):
        function = getattr(LINES.get(ctx.profile), name, None)
        if function is None:
            raise IncompatibleError(f"the patch set has no {name} for {ctx.profile}")
        return Shared("runner", function, ctx)

    build.line = name  # what docs/architecture.md lists per FastDeploy attribute
    return build


def part(runner, slot: str):
    """The runner's part in ``slot`` (``stop``, ``syncs``, ``overlap``), or None."""
    return getattr(runner.__dict__.get(_SLOT), slot, None)


#: Live runners a ``disable()`` handed back to FastDeploy: a later ``enable()`` reports them as
#: keeping FastDeploy's own path until FastDeploy re-creates their ``share_inputs``.
_DETACHED: "weakref.WeakSet" = weakref.WeakSet()
HANDED_BACK = ("handed back to FastDeploy by disable(); keeps FastDeploy's own path until its share_inputs "
               "are re-created")


class FeatureRunners:
    """A feature's runners (its ``ctx.state``): the runners with its part, and those that keep
    FastDeploy's own path (with why). Runners are held weakly; a part may offer ``report() -> dict``
    (extra fields of its runner entry) and ``detach()``. The aggregate never claims more than what
    runs (``partial`` when some runners are patched and others not)."""

    def __init__(self, feature: str, slot: str) -> None:
        self.feature, self.slot = feature, slot
        self._lock = threading.Lock()
        self._runners: dict[int, weakref.ref] = {}
        self._stood_down: dict[int, tuple[weakref.ref, str]] = {}
        if len(_DETACHED):
            gc.collect()  # runners only kept by reference cycles are gone, not "live"
        for runner in list(_DETACHED):
            self._record_stand_down(runner, HANDED_BACK)

    def add(self, runner, part_state) -> None:
        setattr(runner_state(runner, create=True), self.slot, part_state)
        _DETACHED.discard(runner)
        with self._lock:
            self._stood_down.pop(id(runner), None)
            self._runners[id(runner)] = weakref.ref(runner)
        weakref.finalize(runner, self._runners.pop, id(runner), None)

    def stand_down(self, runner, reason: str, level: int = logging.ERROR) -> None:
        """``runner`` keeps FastDeploy's path (logged at ``level``: INFO where that is the runner's
        configuration, not a problem)."""
        log.log(level, "fd_async_copy %s: %s; this runner keeps FastDeploy's own path", self.feature, reason)
        self._record_stand_down(runner, reason)

    def _record_stand_down(self, runner, reason: str) -> None:
        with self._lock:
            self._stood_down[id(runner)] = (weakref.ref(runner), reason)
        weakref.finalize(runner, self._stood_down.pop, id(runner), None)

    def live(self) -> list:
        return [runner for runner in map(weakref.ref.__call__, list(self._runners.values()))
                if runner is not None and part(runner, self.slot) is not None]

    def parts(self) -> list:
        """The live runners' parts (asked several times a step; no lock: copying the dict's values
        is one step under the GIL)."""
        out = []
        for ref in list(self._runners.values()):
            runner = ref()
            part_state = None if runner is None else getattr(runner.__dict__.get(_SLOT), self.slot, None)
            if part_state is not None:
                out.append(part_state)
        return out

    def report(self) -> dict | None:
        patched = self.live()
        with self._lock:
            standing = [(ref(), why) for ref, why in self._stood_down.values() if ref() is not None]
        runners = [{"runner": f"{type(r).__name__}@{id(r):#x}", "state": "applied", "reason": "",
                    **getattr(part(r, self.slot), "report", dict)()} for r in patched]
        runners += [{"runner": f"{type(r).__name__}@{id(r):#x}", "state": "passthrough", "reason": why}
                    for r, why in standing]
        if not runners:
            return None
        if not standing:
            return {"state": "applied", "reason": "", "runners": runners}
        reasons = "; ".join(sorted({why for _, why in standing}))
        if patched:
            reasons = f"{len(patched)} of {len(runners)} runners patched; the others keep FastDeploy's " \
                      f"own path: {reasons}"
        return {"state": "partial" if patched else "passthrough", "reason": reasons, "runners": runners}

    def detach_all(self) -> None:
        """Take the part off every runner (``detach()`` it)."""
        runners = self.live()
        with self._lock:
            self._runners.clear()
            self._stood_down.clear()
        for runner in runners:
            state = runner_state(runner)
            part_state = getattr(state, self.slot)
            setattr(state, self.slot, None)
            getattr(part_state, "detach", lambda: None)()
            _DETACHED.add(runner)


class RunnerFeature(Feature):
    """A feature with per-runner parts: its ``ctx.state`` is a ``FeatureRunners``, reported per
    runner and taken off every runner on teardown."""

    def report(self, ctx) -> dict | None:
        return ctx.state.report() if isinstance(ctx.state, FeatureRunners) else None

    def teardown(self, ctx) -> None:
        registry, ctx.state = ctx.state, None
        if registry is not None:
            registry.detach_all()


def is_cuda_runner(runner_module) -> bool:
    """The runner module's platform is CUDA (DCU and Iluvatar runners subclass ``GPUModelRunner``
    on their own platforms: they keep FastDeploy's behaviour)."""
    platform = getattr(runner_module, "current_platform", None)
    return platform is None or platform.is_cuda()
