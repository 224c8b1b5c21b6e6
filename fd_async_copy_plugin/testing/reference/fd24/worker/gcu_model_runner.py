"""Mirrors the imports of ``fastdeploy/worker/gcu_model_runner.py`` (2.4, :43-47): binds
``post_process``, ``pre_process`` and ``rebuild_padding`` by name. The runner is not modelled."""

from ..model_executor.pre_and_post_process import (  # noqa: F401
    post_process,
    pre_process,
    rebuild_padding,
)
