"""What every FastDeploy line's functions share: the consumer guard, and the prompt-logprobs scope.

The consumer guard (``consume``): a FastDeploy function that reads copied data on the host
(``save_output``, ``save_output_topk``, the ZMQ payload builder) gets every pinned buffer argument
replaced, just before the call, by an owned pageable tensor read after the buffer's copy event.
This is the "wait as late as possible" point, and it keeps Paddle ops off pinned memory
(FastDeploy's save ops are Paddle custom ops: given a pinned tensor, Paddle would move it to the
GPU with a blocking copy and re-point the buffer there). What a feature adds (the stop flag's substitutions) is
registered with ``add_substitute``.
"""

from __future__ import annotations

from .step import opened

#: Feature-provided stand-ins: ``fn(value, reader)`` returns what the consumer should get instead of
#: ``value`` (or ``value`` itself). The stop-flag feature registers one that makes FastDeploy's flag
#: current and swaps the device sampled tokens for their pinned copy.
_SUBSTITUTES: list = []
#: argument types no feature hands out or substitutes (FastDeploy's ranks, flags, names): passed as they are
_PLAIN = frozenset((int, bool, float, str, type(None)))


def add_substitute(fn) -> None:
    _SUBSTITUTES.append(fn)


def remove_substitute(fn) -> None:
    if fn in _SUBSTITUTES:
        _SUBSTITUTES.remove(fn)


def host_value(value, reader: str, backend):
    """What a guarded consumer receives for one argument (``to_host`` hands anything but a pinned buffer back)."""
    if (host := backend.to_host(value, reader)) is not value:
        return host
    for substitute in _SUBSTITUTES:
        if (replaced := substitute(value, reader)) is not value:
            return replaced
    return value


def consume(fd, on, reader: str, *args, **kwargs):
    """FastDeploy's consumer ``fd`` with its arguments host-ready (``host_value``) where a feature
    that hands out pinned data (``stop_flag``, ``logprobs``) is applied."""
    if (ctx := on.get("stop_flag") or on.get("logprobs")) is not None:
        args = [a if type(a) in _PLAIN else host_value(a, reader, ctx.backend) for a in args]
        kwargs = {k: v if type(v) in _PLAIN else host_value(v, reader, ctx.backend) for k, v in kwargs.items()}
    return fd(*args, **kwargs)


def _get_prompt_logprobs_list(fd, on, self, hidden_states):
    """GPUModelRunner._get_prompt_logprobs_list, every line: FastDeploy's, inside a step marked
    ``prompt`` - there logprobs hands back host-owned results and sync_scope scopes FastDeploy's
    device synchronize (``step.prompt_runner()``)."""
    with opened(self, prompt=True):
        return fd(self, hidden_states)
