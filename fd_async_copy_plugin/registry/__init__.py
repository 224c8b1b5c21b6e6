"""The patch registry: pluggy hook specs, patch/feature objects, the manager."""

from .hookspecs import PROJECT, hookimpl, hookspec
from .manager import PatchManager, StrictModeError
from .patch import Feature, IncompatibleError, Patch, PatchContext, Target

__all__ = [
    "PROJECT",
    "Feature",
    "IncompatibleError",
    "Patch",
    "PatchContext",
    "PatchManager",
    "StrictModeError",
    "Target",
    "hookimpl",
    "hookspec",
]
