"""Backends for tests and ``selftest``, registered in the ``fd_async_copy.backends`` entry-point
group (``pyproject.toml``): the runtime knows no test double, it finds these by name when asked.

``sim``: the production copy path (``RuntimeBackend``) over the race-detecting fake ``libcudart``
(``runtime/simulated.py``)."""

from __future__ import annotations


def sim():
    from fd_async_copy_plugin.runtime.simulated import SimulatedBackend

    return SimulatedBackend()
