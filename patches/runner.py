"""The runner pipeline: what happens around each FastDeploy method the plugin touches, in one table,
and the one per-runner state object the features' parts share.

Each FastDeploy attribute gets exactly one replacement (a ``Junction``, ``registry/patch.py``); every
feature contributes a *link* to it, and the links run in the order below, outermost first, whatever
the order features are listed or applied in. Read a row top to bottom as "what happens around
``insert_tasks_v1``": the first part runs first on the way in and last on the way out.

Per runner, ``RunnerState`` holds the features' parts (``stop``, ``syncs``, ``overlap``). It is made
in one place - the first part set up in ``_init_share_inputs`` - and found with ``runner_state()``;
this module is the only one that knows where a runner keeps it. A part never reads another part's
private fields: what one needs of another is a named method of ``RunnerState``.
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref

from fd_async_copy_plugin.registry.patch import Feature, wraps

log = logging.getLogger("fd_async_copy")

_R = "worker.gpu_model_runner:GPUModelRunner."
_P = "model_executor.pre_and_post_process:"

#: FastDeploy attribute -> the features with a part around it, outermost first. Every attribute that
#: more than one built-in feature touches has a row (a test checks it). What each part does is in the
#: comment above its row, in the same order.
PIPELINE: dict[str, tuple[str, ...]] = {
    # after FastDeploy's body (inner parts finish first): stop_flag makes the stop part (device and
    # pinned flags, pinned sampled tokens); step_syncs the syncs part (device seed, host shadow; needs
    # stop); overlap the overlap part (needs stop and syncs)
    _R + "_init_share_inputs": ("overlap", "step_syncs", "stop_flag"),
    # after FastDeploy's body: step_syncs (FD 2.5+) moves the seed to the device; logprobs notes
    # whether the runner decodes speculatively (then its own sampler gathers: status() says so)
    _R + "__init__": ("step_syncs", "logprobs"),
    # overlap: finish the pending step's save first; step_syncs: reload the shadow afterwards;
    # stop_flag: make the flag current, hide the pinned keys from FD's fill_(), reset them after
    _R + "reset_share_inputs": ("overlap", "step_syncs", "stop_flag"),
    # overlap: finish the pending step's save first; flag_race (FD 2.5): wait for the last
    # post-process event before a task insert; stop_flag: make the legacy flag current, afterwards
    # copy it to the pinned flag; step_syncs: refresh the shadow, watch FD's writes, flush the staged
    # block-table rows
    _R + "insert_tasks_v1": ("overlap", "flag_race", "stop_flag", "step_syncs"),
    _R + "insert_prefill_inputs": ("overlap", "stop_flag", "step_syncs"),  # as insert_tasks_v1
    # overlap: the save one step later (the saves run inside the next step)
    # stop_flag: none but the step itself as one section (``Patch.step``: no enable()/disable() inside)
    # (the diagnostics' step boundary, ``sync_check``, is outermost of all: ``Junction.attach(outermost)``)
    _R + "execute_model": ("overlap", "stop_flag"),
    # overlap: right after the forward launch, run the last step's save; while output is pending,
    # True; stop_flag: answer from the legacy flag made current
    _R + "not_need_stop": ("overlap", "stop_flag"),
    # sync_scope (FD 2.5+): its device-wide synchronize waits for this stream only; logprobs: prompt
    # logprobs are copied the blocking way (they are read at once)
    _R + "_get_prompt_logprobs_list": ("sync_scope", "logprobs"),
    # overlap: capture the save, it runs after the next forward launch; stop_flag: the flag made
    # current, the sampled tokens read from pinned after the event; logprobs: pinned logprob
    # buffers read after their event
    _P + "save_output": ("overlap", "stop_flag"),
    # stop_flag (FD 2.4): the device flag, then RunnerState.step_copies(); step_syncs (FD 2.5): the
    # token-count shadow's snapshot (the two never run on the same FastDeploy)
    _P + "update_inputs_v1": ("stop_flag", "step_syncs"),
    _P + "save_output_topk": ("overlap", "stop_flag", "logprobs"),
}

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
        """This step is sized with FD 2.5's upper bound (overlap ``bound``), not the exact count."""
        return self.overlap is not None and self.overlap.in_step and self.overlap.count_mode == "bound"

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
        with self._lock:
            refs = list(self._runners.values())
        return [r for r in (ref() for ref in refs) if r is not None and part(r, self.slot) is not None]

    def parts(self) -> list:
        return [part(r, self.slot) for r in self.live()]

    def report(self) -> dict | None:
        patched = self.live()
        with self._lock:
            standing = [(ref(), why) for ref, why in self._stood_down.values() if ref() is not None]
        runners = []
        for runner in patched:
            state = part(runner, self.slot)
            extra = state.report() if hasattr(state, "report") else {}
            runners.append({"runner": f"{type(runner).__name__}@{id(runner):#x}", "state": "applied", "reason": "",
                            **extra})
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
            if hasattr(part_state, "detach"):
                part_state.detach()
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


def per_runner(original, slot: str):
    """Decorator for a link ``body(part, self, *args, **kwargs)`` of a runner method: the rest of the
    chain runs directly for a runner without the feature's part in ``slot``."""

    def decorate(body):
        @wraps(original)
        def method(self, *args, **kwargs):
            found = part(self, slot)
            if found is None:
                return original(self, *args, **kwargs)
            return body(found, self, *args, **kwargs)

        return method

    return decorate


def is_cuda_runner(runner_module) -> bool:
    """The runner module's platform is CUDA (DCU and Iluvatar runners subclass ``GPUModelRunner``
    on their own platforms: they keep FastDeploy's behaviour)."""
    platform = getattr(runner_module, "current_platform", None)
    return platform is None or platform.is_cuda()


def build_step_section(original, ctx):
    """A link that adds nothing but the step gate (declared with ``Patch(..., step=True)``)."""
    return original
