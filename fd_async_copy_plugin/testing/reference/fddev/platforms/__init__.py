"""Mirrors ``fastdeploy/platforms``: the replica always reports CUDA (shared with the 2.4 replica)."""

from ...fd24 import platforms as _platforms


def __getattr__(name: str):
    if name == "current_platform":
        return _platforms.current_platform
    raise AttributeError(f"No attribute named '{name}' exists in {__name__}.")
