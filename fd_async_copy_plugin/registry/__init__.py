"""The patch registry: pluggy hook specs, patch/feature objects, the planner, the manager."""

from .hookspecs import PROJECT, hookimpl, hookspec
from .manager import PatchManager, StrictModeError
from .patch import Feature, IncompatibleError, Patch, PatchContext, Target, wraps
from .plan import STATES, Decision, plan

__all__ = ["PROJECT", "STATES", "Decision", "Feature", "IncompatibleError", "Patch", "PatchContext",
           "PatchManager", "StrictModeError", "Target", "hookimpl", "hookspec", "plan", "wraps"]
