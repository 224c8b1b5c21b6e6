"""Backends for tests and ``selftest``, registered in the ``fd_async_copy.backends`` entry-point
group (``pyproject.toml``): the runtime knows no test double, it finds these by name when asked.

``sim``: the production copy path (``RuntimeBackend``) over the race-detecting fake ``libcudart``
(``runtime/simulated.py``); inside ``sim_made_by(factory)`` the plugin's ``sim`` is ``factory()``
(tensor-parallel ranks, several streams).
"""

from __future__ import annotations

import contextlib

_factory = None


def sim():
    if _factory is not None:
        return _factory()
    from fd_async_copy_plugin.runtime.simulated import SimulatedBackend

    return SimulatedBackend()


@contextlib.contextmanager
def sim_made_by(factory):
    global _factory
    previous, _factory = _factory, factory
    try:
        yield
    finally:
        _factory = previous
