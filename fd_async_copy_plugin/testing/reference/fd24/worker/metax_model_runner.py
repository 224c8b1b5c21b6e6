"""Mirrors the imports of ``fastdeploy/worker/metax_model_runner.py`` (2.4, :60-64): an independent
runner that binds ``post_process``, ``pre_process``, ``rebuild_padding`` and ``step_cuda`` by name,
so patching ``pre_and_post_process`` must rebind them here too. The runner itself is not modelled."""

from ..model_executor.pre_and_post_process import (  # noqa: F401
    post_process,
    pre_process,
    rebuild_padding,
    step_cuda,
)
