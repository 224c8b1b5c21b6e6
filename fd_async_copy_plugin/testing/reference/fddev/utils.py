"""Mirrors ``fill_paddle_tensor`` of ``fastdeploy/utils.py`` (unchanged in develop)."""

from ..fd25.utils import fill_failures, fill_paddle_tensor  # noqa: F401
