"""A simulator with several streams, and FastDeploy's current stream changed between steps (tests).

``ManyStreams`` is the race-detecting simulator (``runtime/simulated.py``) with ``stream``, the
current stream: a copy goes on it, each stream's copies land in issue order, and the streams land
in the worst order nothing forbids - the stream with the newest copy first, so an older copy of
another stream into the same buffer lands last. ``stream_wait_event`` (what
``paddle.device.current_stream().wait_event`` reaches through the replica) lands the event's
stream's copies before the current stream issues more. ``stale`` names the buffers whose copies all
landed but that hold an older copy's values. ``streams_per_step`` makes ``sim`` this backend and
moves the replica runner to the next stream at every ``execute_model``.

Used by ``tests/features/test_step_syncs_streams.py`` and the differential fuzz (issue 41). The fake
CUDA runtime of the copy-path work (``tests/runtime/``) is to cover the same with real CUDA calls.
"""

from __future__ import annotations

import contextlib
import importlib

import numpy as np

from ..runtime.simulated import SimulatedBackend
from .reference import copy_backend


class ManyStreams(SimulatedBackend):
    """The simulator with ``streams`` streams; ``stream`` is the current one (the test changes it
    between steps). Events are recorded on the current stream and cover its copies only."""

    def __init__(self, glue=None) -> None:
        super().__init__(glue)
        self.stream = 0
        self.queue: list = []  # (seq, stream, id(dst), view, data): copies not landed, issue order
        self.ordered = 0  # stream_wait_event calls
        self.newest: dict = {}  # id(dst) -> (label, data) of the newest copy issued into it
        #: buffers whose copies all landed but hold an older copy's values (the older landed last)
        self.stale: list[str] = []

    def _copy(self, dst, src, seq, label):
        super()._copy(dst, src, seq, label)  # poison now; the entry the readability checks use
        _, data, _, _, view = self._pending[id(dst)]
        self.queue.append((seq, self.stream, id(dst), view, data))
        self.newest[id(dst)] = (label, data)

    def _record_native(self, seq, label):
        return (self.stream, seq)

    def _land_where(self, keep) -> None:
        landed = [c for c in self.queue if keep(c)]
        # each stream's copies in issue order; nothing orders the streams: the stream with the newest
        # copy lands first (an older copy of another stream into the same buffer lands last)
        newest: dict = {}
        for seq, stream, *_ in landed:
            newest[stream] = max(seq, newest.get(stream, seq))
        for seq, stream, key, view, data in sorted(landed, key=lambda c: (-newest[c[1]], c[0])):
            view[...] = data
        self.queue = [c for c in self.queue if not keep(c)]
        live = {c[2] for c in self.queue}
        for seq, stream, key, view, data in landed:
            label, newest = self.newest[key]
            if key not in live and not np.array_equal(view, newest):
                self.stale.append(label)
        for key in [k for k in self._pending if k not in live]:
            del self._pending[key]

    def _wait_native(self, event) -> None:
        stream, seq = event.native
        with self._wait_lock("landing"):  # the GPU may have finished the other streams' older copies too
            self._land_where(lambda c: c[0] <= seq)

    def _drain_native(self, device: bool = False) -> None:
        with self._wait_lock("landing"):
            self._land_where(lambda c: True)

    def stream_wait_event(self, event) -> None:
        """The current stream's later work runs after ``event``'s copies (they land first)."""
        stream, seq = event.native
        self.ordered += 1
        with self._wait_lock("landing"):
            self._land_where(lambda c: c[1] == stream and c[0] <= seq)


@contextlib.contextmanager
def streams_per_step(root: str, streams: int):
    """Inside: backend ``sim`` is a new ``ManyStreams`` (the list yielded collects them), and every
    ``execute_model`` of ``root``'s runner runs on the next of ``streams`` streams."""
    from .backends import sim_made_by

    made: list = []

    def make_backend():
        made.append(ManyStreams())
        return made[-1]

    cls = importlib.import_module(f"{root}.worker.gpu_model_runner").GPUModelRunner
    had, execute = "execute_model" in vars(cls), cls.execute_model

    def execute_model(self, *args, **kwargs):
        backend = copy_backend.current()
        if isinstance(backend, ManyStreams):
            backend.stream = (backend.stream + 1) % streams
        return execute(self, *args, **kwargs)

    cls.execute_model = execute_model
    try:
        with sim_made_by(make_backend):
            yield made
    finally:
        if had:
            cls.execute_model = execute
        else:
            del cls.execute_model


