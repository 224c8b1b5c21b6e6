"""Replica of FastDeploy 2.4 (branch ``r3_fix_int32_bug_2.4``) at the plugin's patch points.

Module paths mirror ``fastdeploy`` (``fd24.worker.gpu_model_runner`` is
``fastdeploy.worker.gpu_model_runner``), so patches written against a configurable root apply to
this root unchanged. Mirrors ``fastdeploy/__init__.py`` only in exposing ``__version__``.
"""

__version__ = "2.4.0"
