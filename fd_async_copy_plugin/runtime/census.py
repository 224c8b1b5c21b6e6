"""Sync census: counts what a decode step makes the host wait for.

The census is the measuring instrument of this project. Every backend (and the reference
replica of FastDeploy's ops) reports host<->device interactions here; a test or the CLI opens a
census, runs decode steps, and reads per-step counts. When no census is active, recording costs
one context-variable lookup.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

#: The kinds of interaction the census counts, with a short description used in reports.
KINDS: dict[str, str] = {
    "blocking_d2h": "blocking D2H copies", "async_d2h": "non-blocking D2H copies",
    "async_h2d": "non-blocking H2D copies from pinned memory",
    "device_sync": "device-wide synchronizes", "stream_sync": "stream synchronizes", "event_wait": "event waits",
    "pinned_alloc": "pinned allocations", "pinned_free": "pinned frees",
    "op_on_pinned": "Paddle ops on pinned tensors", "host_read": "host reads of copied data",
    # Recorded by device-value tracking (reference/device_tracking.py, tests and bench only):
    # every blocking point, whoever causes it; the site is ``device_tracking.encode_host_wait(...)``.
    "host_wait": "host waits (tracked)"}


@dataclass
class StepRecord:
    """Everything recorded during one decode step, in order."""

    index: int
    events: list[tuple[str, str]] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.events if k == kind)

    def counts(self) -> dict[str, int]:
        return {kind: self.count(kind) for kind in KINDS}

    def sites(self, kind: str) -> list[str]:
        return [site for k, site in self.events if k == kind]


class SyncCensus:
    """Per-step record of host<->device interactions."""

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        #: interactions recorded before the first ``begin_step()`` (set-up, warm-up)
        self.setup = self._current = StepRecord(index=-1)

    def begin_step(self) -> StepRecord:
        self._current = StepRecord(index=len(self.steps))
        self.steps.append(self._current)
        return self._current

    def record(self, kind: str, site: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown census kind {kind!r}; known: {sorted(KINDS)}")
        self._current.events.append((kind, site))

    def totals(self, steps: list[StepRecord] | None = None) -> dict[str, int]:
        steps = self.steps if steps is None else steps
        return {kind: sum(step.count(kind) for step in steps) for kind in KINDS}

    def per_step(self, skip: int = 0) -> dict[str, float]:
        """Mean count per step over the steps after the first ``skip`` (warm-up) steps."""
        steps = self.steps[skip:]
        totals = self.totals(steps)
        return {kind: totals[kind] / max(1, len(steps)) for kind in KINDS}  # (0.0 each without steps)


# Process-wide on purpose: FastDeploy's output thread (the ZMQ path) must report into the same
# census as the decode loop, and context variables do not cross into threads.
_ACTIVE: SyncCensus | None = None


def active() -> SyncCensus | None:
    return _ACTIVE


def record(kind: str, site: str) -> None:
    """Record one interaction in the active census, if any."""
    if (census := _ACTIVE) is not None:
        census.record(kind, site)


def begin_step() -> None:
    if (census := _ACTIVE) is not None:
        census.begin_step()


@contextlib.contextmanager
def collecting(census: SyncCensus | None = None) -> Iterator[SyncCensus]:
    """Activate a census for the duration of the block (one at a time per process)."""
    global _ACTIVE
    census = census or SyncCensus()
    previous, _ACTIVE = _ACTIVE, census
    try:
        yield census
    finally:
        _ACTIVE = previous
