"""Patches and features: declared targets, a compatibility check, all-or-nothing apply, exact revert.

A ``Feature`` (e.g. ``logprobs``) declares its ``patches`` as a class attribute, so its targets can
be read without running anything. Each ``Patch`` names one ``Target`` (module relative to the
FastDeploy root + attribute path) and builds a replacement from the original. The modules a feature
waits for are exactly the modules of its required targets (``Feature.modules``). Applying a feature:

1. resolves every target (the module must be fully imported; the attribute must exist);
2. runs every patch's ``check`` and the feature's ``check`` - nothing is touched yet;
3. builds every replacement (``Feature.prepare`` first creates the feature's own state);
4. sets them one by one; if any set fails, the ones already set are restored in reverse order.

Reverting restores the exact original objects (``is``-identical), including class attributes that
were inherited (those are deleted again rather than shadowed).

One replacement per attribute, whatever number of features touch it: every patched attribute gets a
``Junction``, the single function installed there. A feature's ``Patch.build(next, ctx)`` returns a
*link*: its part of the work around ``next`` (the following link, or FastDeploy's original) - or a
``Shared``: the patch set's one function for that attribute on this FastDeploy line, which every
feature touching the attribute names and which reads, top to bottom, what each of them does around
FastDeploy's original (the built-ins': ``patches/fd24``, ``patches/fd25``). A shared function is
installed once, while at least one of its features is applied, and learns which ones are.

``from x import name`` re-bindings are handled one way: the importing module is declared as a
target with ``required=False`` (e.g. the Metax/GCU runners importing ``post_process``). It is
patched when it is loaded at apply time, imports the replacement itself when loaded later, and is
pointed back at the original on revert wherever it still holds the replacement.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

_MISSING = object()
_ident = threading.get_ident


class IncompatibleError(RuntimeError):
    """This FastDeploy does not have the shape a patch expects. Nothing was changed."""


@dataclass(frozen=True)
class Target:
    module: str  # relative to the FastDeploy root, e.g. "worker.gpu_model_runner"
    attr: str  # attribute path inside the module, e.g. "GPUModelRunner.not_need_stop"
    #: False: a module that re-bound the name with ``from ... import`` (see the module docstring)
    required: bool = True
    #: ``module`` is a full module name outside FastDeploy (e.g. ``paddle.device``)
    absolute: bool = False

    def module_name(self, root: str) -> str:
        return self.module if self.absolute else f"{root}.{self.module}" if self.module else root

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
        *path, last = self.attr.split(".")
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                raise IncompatibleError(f"{self.describe(root)}: {part!r} not found")
        raw = _raw_attr(owner, last)
        if raw is _MISSING:
            raise IncompatibleError(f"{self.describe(root)} not found")
        return owner, last, raw


def _raw_attr(owner: Any, name: str) -> Any:
    """The attribute as stored (a class's own ``__dict__`` entry keeps staticmethod wrappers)."""
    if isinstance(owner, type):
        return next((vars(klass)[name] for klass in owner.__mro__ if name in vars(klass)), _MISSING)
    return getattr(owner, name, _MISSING)


@dataclass(frozen=True)
class Patch:
    target: Target
    #: builds the replacement from (original raw value, context)
    build: Callable[[Any, "PatchContext"], Any]
    #: raises IncompatibleError when the original does not look as expected
    check: Callable[[Any, "PatchContext"], None] | None = None
    #: the profiles this patch is for; ``None``: every profile the feature applies to
    profiles: tuple[str, ...] | None = None
    #: hands out data whose copies complete later (e.g. ``gather_logprobs``): restored first on
    #: revert, then ``Feature.quiesce`` runs, and only then are the consumer guards removed
    producer: bool = False
    #: a call of the target is a step section (``STEP_GATE``): ``enable()``/``disable()`` on another
    #: thread wait for it to end, and it waits for them (a runner's inserts, step, flag check)
    step: bool = False


def wraps(original: Any) -> Callable[[Callable], Callable]:
    """The one way a replacement function is made to look like FastDeploy's original: keeps
    ``__name__``, ``__qualname__``, ``__doc__``, ``__module__`` and sets ``__wrapped__`` (for
    ``inspect.signature``, tracebacks and FastDeploy code that logs function names)."""
    return functools.wraps(original, updated=())


@dataclass
class PatchContext:
    """What one feature's patches see: where FD is, which FD, how to copy, and the feature's own
    state (what ``Feature.prepare`` returned)."""

    root: str
    profile: str
    backend: Any  # runtime.CopyBackend: the only way a patch reaches the backend
    options: frozenset = frozenset()  # the feature's options requested (e.g. ``sampled_tokens``)
    strict: bool = False
    state: Any = None  # the feature's own typed state, from ``Feature.prepare``
    #: called by a patch that finds, at run time, that it must leave FastDeploy's own path in place
    #: (e.g. a runner too large for the kernels); the feature is then reported as ``passthrough``
    stand_down: Callable[[str], None] = lambda reason: None
    #: the validated settings (``config.RunSettings``): the only way a patch reads configuration
    settings: Any = None

    def module(self, relative: str):
        return sys.modules[f"{self.root}.{relative}" if relative else self.root]


class Feature:
    """Base class for a patch set: class attributes only, plus optional ``check``/``prepare``/
    ``teardown``/``unavailable`` hooks."""

    #: feature name as used in FD_ASYNC_COPY_FEATURES
    name: str = ""
    #: upstream PR(s) it mirrors, for status/doctor
    mirrors: str = ""
    #: profile -> "apply" or "native: <why>"; profiles not listed are skipped
    profiles: dict[str, str] = {}
    #: the targets, declared up front
    patches: tuple[Patch, ...] = ()
    #: option name -> what it adds; an option is requested like a feature (FD_ASYNC_COPY_FEATURES)
    #: and reported with this feature's state
    options: dict[str, str] = {}
    #: features this one builds on (their per-runner state): it is applied only with them
    requires: tuple[str, ...] = ()

    def required(self, profile: str) -> tuple[str, ...]:
        """What this feature builds on in ``profile`` (default: ``requires`` in every profile)."""
        return self.requires

    def mirrors_in(self, profile: str) -> str:
        """What it mirrors where it applies in ``profile`` (default: ``mirrors``)."""
        return self.mirrors

    def patches_for(self, profile: str) -> list[Patch]:
        return [p for p in self.patches if p.profiles is None or profile in p.profiles]

    def modules(self, root: str, profile: str) -> list[str]:
        """Full names of the modules that must be fully imported before applying."""
        return sorted({p.target.module_name(root) for p in self.patches_for(profile) if p.target.required})

    def unavailable(self, backend: str) -> str:
        """Why this feature cannot run on ``backend`` here (e.g. custom ops not built); "" if it can.
        Called by the planner before anything is imported or patched."""
        return ""

    def check(self, ctx: PatchContext) -> None:
        """Feature-level compatibility check, after every target resolved. Raise IncompatibleError."""

    def prepare(self, ctx: PatchContext) -> Any:
        """Create and return the feature's runtime state (buffers, rings) - after checks, before
        the replacements are built; it is handed to the builders as ``ctx.state``."""

    def report(self, ctx: PatchContext) -> dict | None:
        """What runs now, per runner, for ``status()`` (reads only): ``{"state", "reason",
        "runners": [...]}`` overriding an ``applied`` decision, or None to keep the decision."""

    def quiesce(self, ctx: PatchContext) -> None:
        """On revert, after the producers are restored and before the consumer guards go: finish
        everything the producers issued (``disable()`` may run on another thread mid-step)."""

    def teardown(self, ctx: PatchContext) -> None:
        """Drop runtime state after revert."""


# --- one replacement per attribute ------------------------------------------------------------------

JUNCTION_MARK = "__fd_async_copy_junction__"


class StepGate:
    """``enable()``/``disable()`` never land in the middle of a runner's step: a step section (a call
    of a ``Patch.step`` target: inserts, ``execute_model``, the flag check) is held open in
    ``run()``, and a change of the patches (``change()``) waits until no other thread is in one,
    at most ``timeout`` seconds (then it goes ahead, logged: never a hang). Sections of different
    threads run side by side: runners stepped by threads of one process (tensor-parallel ranks in
    tests, each forward meeting the others in a collective) must never wait for each other here
    (docs/tensor-parallel.md). Re-entrant: a section's own thread may change the patches, and
    sections nest."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout, self._lock = timeout, threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._open: collections.Counter = collections.Counter()  # thread id -> its open sections
        self._changer: int | None = None  # the thread changing the patches now
        self._waiting = 0  # changes waiting for sections to close (a section's end notifies them)

    def run(self, function: Callable, /, *args, **kwargs) -> Any:
        """``function(*args, **kwargs)`` as a step section of this thread (one frame per gated call:
        waits only while another thread changes the patches, notifies only a change that waits)."""
        me = _ident()
        with self._lock:
            if self._changer is not None and self._changer != me:
                self._cond.wait_for(lambda: self._changer in (None, me))
            self._open[me] += 1
        try:
            return function(*args, **kwargs)
        finally:
            with self._lock:
                self._open[me] -= 1
                if self._waiting:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def change(self):
        me = threading.get_ident()
        with self._cond:
            self._waiting += 1  # (left raised by an exception in the wait: a section notifies in vain)
            done = self._cond.wait_for(lambda: self._changer in (None, me) and not any(
                n for t, n in self._open.items() if t != me), self.timeout)
            self._waiting -= 1
            if not done:
                logging.getLogger("fd_async_copy").warning(
                    "fd_async_copy: a runner step did not end within %g s; the patches change during it", self.timeout)
            outer, owns = self._changer, self._changer in (None, me)  # (else beside a stuck change)
            if owns:
                self._changer = me
        try:
            yield
        finally:
            if owns:
                with self._cond:
                    self._changer = outer
                    self._cond.notify_all()


STEP_GATE = StepGate()
_junctions: dict[tuple[int, str], "Junction"] = {}
_junctions_lock = threading.RLock()


class _Next:
    """What a link calls to continue: the following link of its junction, or FastDeploy's original.
    Looks like the original (name, doc, ``__wrapped__``) for the builders that name or inspect it."""

    def __init__(self, bottom: Any) -> None:
        self.target = bottom  # set by the junction's relink
        functools.update_wrapper(self, bottom, updated=())

    def __call__(self, *args, **kwargs):
        return self.target(*args, **kwargs)


@dataclass(frozen=True)
class Shared:
    """A ``Patch.build``'s result: the patch set's one ``function(fd, on, *args, **kwargs)`` for the
    attribute, ``fd`` what follows (FastDeploy's original), ``on`` the applied features naming it
    -> their ``PatchContext``; ``key`` its place in the junction."""

    key: str
    function: Callable
    ctx: Any


class Junction:
    """The one function installed on a patched attribute: it calls the first link. Links run: a
    diagnostic's ``outermost`` one, a patch set's ``Shared`` function, then other links by name."""

    def __init__(self, owner: Any, name: str, original: Any, own: bool) -> None:
        self.owner, self.name, self.original, self.own = owner, name, original, own
        #: a staticmethod/classmethod keeps its kind; the links work on its function
        self.descriptor = type(original) if isinstance(original, (staticmethod, classmethod)) else None
        function = original.__func__ if self.descriptor else original
        self.links: dict[str, Callable] = {}  # link name (a feature, or a Shared key) -> link
        self.members: dict[str, dict] = {}  # Shared key -> {feature: its PatchContext}
        self.shared: dict[str, Callable] = {}  # Shared key -> the patch set's function
        self.ranks: dict[str, tuple] = {}  # link name -> (0 outermost, 1 shared, 2 a feature's own; name)
        self.nexts: dict[str, _Next] = {}  # each link's "next", linked now or not
        #: ``bottom``: what the last link calls: FastDeploy's original, unless instrumentation (device
        #: tracking in tests) put itself beneath the links (``set_bottom``)
        self.head = self.bottom = function
        self.gated = False  # a link's patch is a step section (``Patch.step``)
        junction = self

        @wraps(function)
        def installed(*args, **kwargs):
            return STEP_GATE.run(junction.head, *args, **kwargs) if junction.gated else junction.head(*args, **kwargs)

        setattr(installed, JUNCTION_MARK, self)
        self.installed = self.descriptor(installed) if self.descriptor else installed

    @staticmethod
    def at(owner: Any, name: str) -> "Junction | None":
        """The junction installed on ``owner.name`` now, if any."""
        found = _junctions.get((id(owner), name))
        installed = found is not None and found.owner is owner and _raw_attr(owner, name) is found.installed
        return found if installed else None

    @classmethod
    def on(cls, owner: Any, name: str) -> "Junction":
        """The junction of ``owner.name``: the one installed, or a new one (installed by its first link)."""
        own = (name in vars(owner)) if isinstance(owner, type) else True
        return cls.at(owner, name) or cls(owner, name, _raw_attr(owner, name), own)

    def features(self) -> list[str]:
        """The features with a part here, outermost first (a shared function's, by name)."""
        ordered = sorted(self.links, key=self.ranks.get)
        return [feature for name in ordered for feature in sorted(self.members.get(name, [name]))]

    def set_bottom(self, bottom: Any) -> None:
        """What the last link calls from now on (``original`` again to undo)."""
        with _junctions_lock:
            self.bottom = bottom
            self._relink()

    def _relink(self) -> None:
        # every link that was attached keeps its next: a link taken out while a call it made is
        # still running (a save captured before disable()) continues with the links after its place
        # A shared function is handed what follows it directly (one frame less per call).
        following, links = self.bottom, dict(self.links)
        for name in sorted(self.nexts, key=self.ranks.get, reverse=True):
            self.nexts[name].target = following
            if name in links and name in self.members:
                links[name] = functools.partial(self.shared[name], following, self.members[name])
            following = links.get(name, following)
        self.links = links  # copied, never changed in place: readers iterate it
        self.head = following  # the head last: a call in flight sees a whole chain

    def attach(self, feature: str, build: Callable[[Any], Any], step: bool = False, outermost: bool = False) -> None:
        """Add ``feature``'s link (``outermost``: before every other, for a diagnostic that is no
        feature), or make it a member of the shared function its build returns."""
        with _junctions_lock:
            if feature in self.features():
                raise IncompatibleError(f"{self.name}: feature {feature!r} declares two patches of it")
            nxt = _Next(self.bottom)
            link = build(nxt)
            shared = isinstance(link, Shared)
            name = link.key if shared else feature  # a shared function's link is under its key
            if shared:
                self.shared[name] = link.function
                self.members = {**self.members, name: {**self.members.get(name, {}), feature: link.ctx}}
            self.nexts[name], self.ranks[name] = nxt, (1 if shared else 0 if outermost else 2, name)
            self.links = {**self.links, name: link}
            self.gated = self.gated or step
            self._relink()
            if _junctions.get((id(self.owner), self.name)) is not self:
                _junctions[(id(self.owner), self.name)] = self
                setattr(self.owner, self.name, self.installed)

    def detach(self, feature: str) -> None:
        """Take ``feature``'s link out; the last one out puts FastDeploy's original back."""
        with _junctions_lock:
            name = next((key for key, on in self.members.items() if feature in on), feature)
            members = dict(self.members)
            rest = {f: ctx for f, ctx in members.pop(name, {}).items() if f != feature}
            self.members = {**members, name: rest} if rest else members  # a shared function stays while used
            if not rest:
                self.links = {key: link for key, link in self.links.items() if key != name}
            self._relink()
            if not self.links:
                if _junctions.get((id(self.owner), self.name)) is self:
                    del _junctions[(id(self.owner), self.name)]
                if self.own:
                    setattr(self.owner, self.name, self.original)
                elif self.name in vars(self.owner):
                    delattr(self.owner, self.name)


class AppliedFeature:
    """The record of one applied feature: enough to restore every original exactly. ``records``:
    (patch, the junction its link is in) per target set."""

    def __init__(self, feature: Feature, ctx: PatchContext, records: list) -> None:
        self.feature, self.ctx, self.records = feature, ctx, records

    def drifted(self) -> list[str]:
        """Targets whose current binding is no longer the replacement (e.g. ``importlib.reload`` of
        a FastDeploy module re-bound FastDeploy's originals). Reads only; imports nothing. A class
        re-bound to a subclass of the patched one (tests, FD's platform runners) is not a drift."""
        lost = []
        for patch, junction in self.records:
            if sys.modules.get(patch.target.module_name(self.ctx.root)) is None:
                continue  # (so resolve() imports nothing)
            try:
                owner, _, current = patch.target.resolve(self.ctx.root)
            except IncompatibleError:
                owner = current = None
            if isinstance(owner, type) and isinstance(junction.owner, type) and issubclass(owner, junction.owner):
                current = _raw_attr(junction.owner, junction.name)
            if current is not junction.installed:  # one junction per attribute: nothing wraps it
                lost.append(patch.target.describe(self.ctx.root))
        return lost

    def revert(self) -> None:
        # Producers first, then whatever they issued is finished, then the consumers' guards go:
        # a result handed out before the revert never reaches an unguarded consumer unfinished.
        ordered = list(reversed(self.records))
        for patch, junction in ordered:
            if patch.producer:
                junction.detach(self.feature.name)
        try:
            self.feature.quiesce(self.ctx)
        except Exception:  # a revert always completes: FastDeploy must get every original back
            logging.getLogger("fd_async_copy").exception(
                "fd_async_copy: finishing %s's in-flight work on revert failed", self.feature.name)
        for patch, junction in ordered:
            if not patch.producer:
                junction.detach(self.feature.name)
        # Importers (the declared ``from ... import`` targets, ``required=False``) loaded after apply
        # imported a replacement themselves: point them back too (once no feature has a link left in
        # that junction).
        originals = {id(j.installed): j.original for _, j in self.records if not j.links}
        for target in (p.target for p in self.feature.patches_for(self.ctx.profile) if not p.target.required):
            module = sys.modules.get(target.module_name(self.ctx.root))
            current = getattr(module, target.attr, None) if module is not None else None
            if current is not None and id(current) in originals:
                setattr(module, target.attr, originals[id(current)])
        self.feature.teardown(self.ctx)


def apply_feature(feature: Feature, ctx: PatchContext) -> AppliedFeature:
    """All-or-nothing apply. Raises IncompatibleError (nothing changed) or re-raises the error
    that stopped a partial apply after restoring every original."""
    resolved = []
    for patch in feature.patches_for(ctx.profile):
        if not patch.target.required and patch.target.module_name(ctx.root) not in sys.modules:
            continue  # an importer of the name that is not loaded: it will import the replacement
        owner, name, current = patch.target.resolve(ctx.root)
        junction = Junction.at(owner, name)
        # checks see FastDeploy's own object, not the junction another feature installed
        original = junction.original if junction is not None else current
        if patch.check is not None:
            patch.check(original, ctx)
        if original is not None:  # None: FastDeploy's ops import resolved to None (ops not compiled)
            resolved.append((patch, owner, name))
    feature.check(ctx)
    ctx.state = feature.prepare(ctx)
    records: list = []
    try:
        for patch, owner, name in resolved:
            junction = Junction.on(owner, name)
            junction.attach(feature.name, lambda nxt, patch=patch: patch.build(nxt, ctx), patch.step)
            records.append((patch, junction))
    except BaseException:
        for _, junction in reversed(records):
            junction.detach(feature.name)
        feature.teardown(ctx)
        raise
    return AppliedFeature(feature, ctx, records)
