"""Consumer guards shared by the features: FastDeploy functions that read copied data on the host.

A guard wraps a consumer (``save_output``, ``save_output_topk``, the ZMQ payload builder) so that
every pinned buffer argument is replaced, just before the call, by an owned pageable tensor read
after the buffer's copy event. This is the "wait as late as possible" point, and it keeps Paddle
ops off pinned memory (FastDeploy's save ops are Paddle custom ops: given a pinned tensor, Paddle
would move it to the GPU with a blocking copy and re-point the buffer there).

Features guarding the same consumer each add a link to its one junction; the outermost converts the
arguments and the others pass them on (one conversion per call). What each feature adds (e.g. the
stop flag's substitutions) is registered with ``add_substitute``.
"""

from __future__ import annotations

import threading

from fd_async_copy_plugin.registry.patch import wraps


#: Feature-provided stand-ins: ``fn(value, reader)`` returns what the consumer should get instead of
#: ``value`` (or ``value`` itself). The stop-flag feature registers one that makes FastDeploy's flag
#: current and swaps the device sampled tokens for their pinned copy.
_SUBSTITUTES: list = []


def add_substitute(fn) -> None:
    _SUBSTITUTES.append(fn)


def remove_substitute(fn) -> None:
    if fn in _SUBSTITUTES:
        _SUBSTITUTES.remove(fn)


def host_value(value, reader: str, backend):
    """What a guarded consumer receives for one argument."""
    if backend.is_pinned(value):
        return backend.to_host(value, reader)
    for substitute in _SUBSTITUTES:
        replaced = substitute(value, reader)
        if replaced is not value:
            return replaced
    return value


_guarding = threading.local()


def host_inputs_guard(consumer, reader: str, backend):
    """Wrap ``consumer`` so its arguments reach it host-ready (see ``host_value``)."""
    @wraps(consumer)
    def guarded(*args, **kwargs):
        if getattr(_guarding, "on", False):  # an outer guard link converted them already
            return consumer(*args, **kwargs)
        args = [host_value(a, reader, backend) for a in args]
        kwargs = {k: host_value(v, reader, backend) for k, v in kwargs.items()}
        _guarding.on = True
        try:
            return consumer(*args, **kwargs)
        finally:
            _guarding.on = False

    return guarded


def build_guard(reader: str):
    """A ``Patch.build`` callable: (original, ctx) -> guarded original."""

    def build(original, ctx):  # (an op that resolved to None - ops not compiled - has no link)
        return host_inputs_guard(original, reader, ctx.backend)

    return build


_prompt = threading.local()


def prompt_runner():
    """The runner whose ``_get_prompt_logprobs_list`` runs on this thread (None outside it): there
    ``logprobs`` hands back host-owned results and ``sync_scope`` scopes FD's device synchronize."""
    return getattr(_prompt, "runner", None)


def build_prompt_scope(original, ctx):
    """``GPUModelRunner._get_prompt_logprobs_list``, marking the thread (``prompt_runner``)."""

    @wraps(original)
    def _get_prompt_logprobs_list(self, hidden_states):
        outer, _prompt.runner = prompt_runner(), self
        try:
            return original(self, hidden_states)
        finally:
            _prompt.runner = outer

    return _get_prompt_logprobs_list
