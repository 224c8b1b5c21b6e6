"""Mirrors ``fastdeploy/envs.py`` (develop): the same lazily read variables as the 2.4 replica."""

from ..fd24.envs import __dir__, environment_variables  # noqa: F401  (the same lazy variables)


def __getattr__(name: str):
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
