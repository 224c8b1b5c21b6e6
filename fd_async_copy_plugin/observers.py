"""The decode step's events, for the diagnostics: who emits them and who listens are apart.

Emitters: the step boundary (``sync_check.wrap_execute_model``, the outermost link of the runner's
``execute_model``) calls ``step_begin``/``step_end``; the wait sources (the sync check's wrappers of
Paddle's host reads on a GPU, device tracking on the replica) call ``wait_begin`` before a host
wait and ``wait_end`` after it. Observers: the sync check's ``Checker`` and the step trace's
``StepTracer`` subscribe (``subscribe``) and unsubscribe themselves. This module imports nothing of
the package: every diagnostic depends on it, it depends on none of them (no import cycle).

Order: observers are kept by rank (the check ``CHECK`` before the trace ``TRACE``). ``step_begin``
and ``wait_end`` go in rank order, ``step_end`` and ``wait_begin`` in reverse: the trace opens its
wait span before the check may raise on that wait (mode ``raise``), and closes its step before the
check counts it.
"""

from __future__ import annotations

import threading

CHECK, TRACE = 0, 1

_lock = threading.Lock()
_observers: tuple = ()  # (rank, observer), by rank; replaced, never changed in place


def subscribe(observer, rank: int) -> None:
    """``observer`` gets ``step_begin(runner)``, ``step_end(runner)``, ``wait_begin(mechanism,
    where, what)`` and ``wait_end()`` from now on."""
    global _observers
    with _lock:
        kept = [entry for entry in _observers if entry[1] is not observer]
        _observers = tuple(sorted([*kept, (rank, observer)], key=lambda entry: entry[0]))


def unsubscribe(observer) -> None:
    global _observers
    with _lock:
        _observers = tuple(entry for entry in _observers if entry[1] is not observer)


def observers() -> list:
    return [observer for _, observer in _observers]


def step_begin(runner=None) -> None:
    """The runner starts a decode step (``execute_model`` entered)."""
    for _, observer in _observers:
        observer.step_begin(runner)


def step_end(runner=None) -> None:
    """The runner's decode step is over (``execute_model`` returned or raised)."""
    for _, observer in reversed(_observers):
        observer.step_end(runner)


def wait_begin(mechanism: str, where: str, what: str) -> None:
    """A source sees a host wait (``mechanism``: d2h, h2d, event, sync) at ``where``, before waiting."""
    for _, observer in reversed(_observers):
        observer.wait_begin(mechanism, where, what)


def wait_end() -> None:
    """The host wait announced last on this thread is over."""
    for _, observer in _observers:
        observer.wait_end()
