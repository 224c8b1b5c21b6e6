"""The sync check's figures as Prometheus metrics, with FastDeploy's conventions.

Where ``prometheus_client`` is importable (FastDeploy depends on it and serves ``/metrics`` from
it), an armed sync check exports two counters, named as FD names its own (``fastdeploy:...``):

- ``fastdeploy:async_copy_decode_steps_total``: decode steps counted (after the warm-up);
- ``fastdeploy:async_copy_host_waits_total{label, mechanism, site}``: host waits in those steps,
  by site (``label``: S1, T, ``save event`` ...; ``site``: ``file:line function``).

Counters are what FD's multiprocess set-up collects from a worker: FD's API server sets
``PROMETHEUS_MULTIPROC_DIR`` before it starts the workers, which inherit it, and its ``/metrics``
merges every process's files (``fastdeploy/metrics/metrics.py``, ``get_filtered_metrics``). Without
``prometheus_client`` nothing is exported and ``status()["sync_check"]["metrics"]`` says why.
The waits per step divided by the steps is the sync check's mean.
"""

from __future__ import annotations

import logging

log = logging.getLogger("fd_async_copy")

STEPS = "fastdeploy:async_copy_decode_steps_total"
WAITS = "fastdeploy:async_copy_host_waits_total"


def export(checker, registry=None) -> str:
    """Feed ``checker``'s counted steps to Prometheus counters; returns what was done (for
    ``status()``). ``registry``: prometheus_client's default one (FD's) unless given."""
    try:
        import prometheus_client
    except ImportError as exc:
        return f"not exported: prometheus_client is not importable ({exc})"
    kwargs = {} if registry is None else {"registry": registry}
    try:
        steps = prometheus_client.Counter(STEPS, "Decode steps counted by the fd-async-copy sync check", **kwargs)
        waits = prometheus_client.Counter(WAITS, "Host waits in decode steps counted by the fd-async-copy sync check, by site",
                                          ["label", "mechanism", "site"], **kwargs)
    except ValueError as exc:  # already registered in this process (a second enable)
        return f"not exported: {exc}"

    def on_step(step_waits) -> None:
        steps.inc()
        for wait in step_waits:
            waits.labels(wait.label or "-", wait.mechanism, wait.where).inc()

    checker.step_listeners.append(on_step)
    log.info("fd_async_copy sync check: exporting %s and %s", STEPS, WAITS)
    return f"exported: {STEPS}, {WAITS}"
