"""Mirrors ``fill_paddle_tensor`` of ``fastdeploy/utils.py`` (unchanged in 2.5)."""

from ..fd24.utils import fill_failures, fill_paddle_tensor  # noqa: F401
