"""The built-in patch sets of fd-async-copy, one module per feature.

Installed as ``fd_async_copy_plugin.patches`` and registered through the ``fd_async_copy``
entry-point group (``builtin``), the same way a third-party patch set registers.

One module per feature (its switch, its targets, its per-runner part), and one package per
FastDeploy line (``fd24/``, ``fd25/``; develop uses ``fd25/``): there, one function per FastDeploy
method, reading top to bottom what the features do around FastDeploy's original.

| module | features | mirrors | FastDeploy versions that need it |
|---|---|---|---|
| ``logprobs.py`` | ``logprobs`` | FD PR #6362 | 2.4 (backport); 2.5+ (fixes per-step pinned allocations) |
| ``sync_scope.py`` | ``sync_scope`` | fixes #6362's device-wide sync and ``slice_rows`` copies | 2.5+ |
| ``stop_flag.py`` | ``stop_flag`` (option ``sampled_tokens``) | FD PR #6176 | 2.4 only (native on 2.5+) |
| ``step_syncs.py`` (+ ``fd24/``, ``fd25/``) | ``step_syncs`` (needs ``stop_flag`` on 2.4) | FD #6765/#6668, #5440/#6170, #5548, #6172, #6356 | 2.4 only (native on 2.5+) |
| ``flag_race.py`` | ``flag_race`` | hardening of #6259 (insert-time ``set_stop`` after the flag copy) | 2.5 (native elsewhere) |
| ``overlap.py`` | ``overlap`` (opt-in; needs ``stop_flag`` and ``step_syncs``) | FD PR #6259 | 2.4 only (native on 2.5+) |
"""

from __future__ import annotations

from fd_async_copy_plugin.registry.hookspecs import hookimpl


@hookimpl
def fd_async_copy_catalog():
    # the order ``all`` expands to (and ``status()`` lists); overlap changes the step schedule: opt-in
    return {"logprobs": "default", "stop_flag": "default", "sampled_tokens": "option", "sync_scope": "default",
            "step_syncs": "default", "flag_race": "default", "overlap": "opt-in"}


@hookimpl
def fd_async_copy_features():
    from . import logprobs, step_syncs, sync_scope
    from .fd24 import overlap, stop_flag
    from .fd25 import flag_race

    # Any order: what runs around each FastDeploy method is its line's function (fd24/, fd25/), and
    # a feature that builds on another is applied after it (``Feature.requires``).
    return [f for m in (logprobs, sync_scope, stop_flag, step_syncs, overlap, flag_race) for f in m.FEATURES]

