"""Consumer guards shared by the features: FastDeploy functions that read copied data on the host.

A guard wraps a consumer (``save_output``, ``save_output_topk``, the ZMQ payload builder) so that
every pinned buffer argument is replaced, just before the call, by an owned pageable tensor read
after the buffer's copy event. This is the "wait as late as possible" point, and it keeps Paddle
ops off pinned memory (FastDeploy's save ops are Paddle custom ops: given a pinned tensor, Paddle
would move it to the GPU with a blocking copy and re-point the buffer there).

Guards are idempotent: two features guarding the same consumer share one wrapper.
"""

from __future__ import annotations

import functools

from fd_async_copy_plugin import runtime

GUARD_MARK = "__fd_async_copy_guard__"


def host_inputs_guard(consumer, reader: str):
    """Wrap ``consumer`` so pinned tensor arguments reach it as host-ready pageable tensors."""
    if getattr(consumer, GUARD_MARK, False):
        return consumer

    @functools.wraps(consumer)
    def guarded(*args, **kwargs):
        backend = runtime.current()
        args = [backend.to_host(a, reader) if backend.is_pinned(a) else a for a in args]
        kwargs = {k: backend.to_host(v, reader) if backend.is_pinned(v) else v for k, v in kwargs.items()}
        return consumer(*args, **kwargs)

    setattr(guarded, GUARD_MARK, True)
    guarded.__wrapped_consumer__ = consumer
    return guarded


def build_guard(reader: str):
    """A ``Patch.build`` callable: (original, ctx) -> guarded original."""

    def build(original, ctx):
        if original is None:
            # FastDeploy's ops import can resolve to None (ops not compiled: CPU test runs).
            return original
        return host_inputs_guard(original, reader)

    return build
