"""One decision per feature, made in one place: ``plan()``.

``enable()``, ``fd-async-copy doctor`` and strict mode all use ``plan()``: doctor cannot predict
something ``enable()`` would decide differently, because there is only one function that decides.
``plan()`` patches nothing and imports no FastDeploy module; the probes it is given say whether the
copy backend and each feature's own requirements (e.g. the custom ops) are usable here.

States (``Decision.state``):

- before anything is applied: ``apply`` (to be applied), ``native`` (this FastDeploy already does
  it), ``skipped`` (not applied, FastDeploy runs its own code; the reason says why);
- after ``enable()`` acts on ``apply``: ``applied``, ``pending`` (waiting for FastDeploy to import
  its modules), ``incompatible`` (a target did not have the expected shape: nothing changed),
  ``failed`` (an unexpected error while applying: every original restored);
- at run time: ``passthrough`` (applied, but a runner found it cannot use it - e.g. a batch too large
  for the kernels - so the wrappers pass through to FastDeploy's own path).

Strict mode refuses every state in ``REFUSED_IN_STRICT_MODE``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ..profile import ProfileInfo
from .patch import Feature

STATES = ("apply", "applied", "pending", "native", "skipped", "incompatible", "failed", "passthrough", "partial")
#: ``partial``: some of the process's runners run the patched path, others FastDeploy's own (``runners``)
APPLY, APPLIED, PENDING, NATIVE, SKIPPED, INCOMPATIBLE, FAILED, PASSTHROUGH, PARTIAL = STATES
REFUSED_IN_STRICT_MODE = (SKIPPED, INCOMPATIBLE, FAILED, PASSTHROUGH, PARTIAL)

PADDLE_INSTALL_HINT = ("install Paddle: paddlepaddle-gpu (the build FastDeploy uses) next to FastDeploy, or "
                       "the CPU paddlepaddle==3.3.0 to run the plugin's tests")


@dataclass(frozen=True)
class Decision:
    state: str
    reason: str
    #: for an option (e.g. ``sampled_tokens``): the feature that owns it
    option_of: str | None = None

    def as_dict(self) -> dict[str, str]:
        return {"state": self.state, "reason": self.reason}


#: () -> (backend name, why it cannot be used or ""); called at most once, only when needed
BackendProbe = Callable[[], "tuple[str, str]"]


def plan(requested: Sequence[str], features: Mapping[str, Feature] | str, profile: ProfileInfo,
         backend: BackendProbe) -> dict[str, Decision]:
    """The decision for every requested name (features and options), in the order requested.

    ``features``: the installed features by name, or a string saying why none could be loaded
    (e.g. Paddle is not importable).
    """
    if isinstance(features, str):
        return {name: Decision(SKIPPED, features) for name in requested}
    owners = {option: f.name for f in features.values() for option in f.options}
    backend_state = functools.cache(backend)  # probed at most once, only when a feature gets that far
    decisions: dict[str, Decision] = {}
    for name in requested:
        if name not in owners:  # an option is decided with its feature, below
            feature = features.get(name)
            decisions[name] = (_decide(feature, profile, backend_state) if feature is not None
                               else Decision(SKIPPED, "no installed patch set provides this feature"))
    for name, decision in list(decisions.items()):
        if decision.state == APPLY:
            decisions[name] = requirement_decision(features[name], decisions, profile.profile) or decision
    for name in requested:
        owner = owners.get(name)
        if owner is not None:
            decisions[name] = (option_decision(features[owner], name, decisions[owner]) if owner in decisions
                               else Decision(SKIPPED, f"an option of {owner}: request {owner} too", owner))
    return {name: decisions[name] for name in requested}


def requirement_decision(feature: Feature, decisions: Mapping[str, Decision], profile: str) -> Decision | None:
    """``skipped`` when a feature ``feature`` builds on is not requested or will not run (None: it may)."""
    for required in feature.required(profile):
        other = decisions.get(required)
        if other is None:
            return Decision(SKIPPED, f"needs {required}: request it too (FD_ASYNC_COPY_FEATURES)")
        if other.state not in (APPLY, APPLIED, PENDING):
            return Decision(SKIPPED, f"needs {required}, which is {other.state}: {other.reason}")
    return None


def option_decision(feature: Feature, option: str, owner: Decision) -> Decision:
    """An option has its feature's state; the reason says what it adds, or why it is not used."""
    if owner.state in (APPLY, APPLIED):
        return Decision(owner.state, feature.options[option], feature.name)
    if owner.state in (PENDING, NATIVE):
        return Decision(owner.state, owner.reason, feature.name)
    return Decision(owner.state, f"needs {feature.name}, which is {owner.state}: {owner.reason}", feature.name)


def _decide(feature: Feature, profile: ProfileInfo, backend_state: Callable[[], tuple[str, str]]) -> Decision:
    if profile.profile in ("absent", "unknown"):
        what = "FastDeploy not found" if profile.profile == "absent" else "unrecognised FastDeploy"
        return Decision(SKIPPED, f"{what}: {profile.reason or profile.profile}; nothing patched")
    served = feature.profiles.get(profile.profile)
    if served is None:
        known = ", ".join(sorted(feature.profiles))
        return Decision(SKIPPED, f"not for profile {profile.profile!r} (serves: {known}); FastDeploy left as is")
    if served.startswith("native"):
        return Decision(NATIVE, served.partition(":")[2].strip() or "FastDeploy already does this")
    name, problem = backend_state()
    problem = f"backend stands down: {problem}" if problem else feature.unavailable(name)
    if problem:
        return Decision(SKIPPED, problem)
    mirrors = feature.mirrors_in(profile.profile)
    return Decision(APPLY, f"mirrors {mirrors}" if mirrors else "apply")


def strict_violations(decisions: Mapping[str, Decision]) -> str:
    """"" when strict mode accepts these decisions; else one line naming every refused one."""
    refused = ((n, d) for n, d in decisions.items() if d.state in REFUSED_IN_STRICT_MODE)
    return "; ".join(f"{n}: {d.state} ({d.reason})" for n, d in refused)
