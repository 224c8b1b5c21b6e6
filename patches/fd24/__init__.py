"""FastDeploy 2.4's line: ``methods.py`` (what runs around each FastDeploy method) and
``step_syncs.py`` (its host shadow of the step state). Dropping the line is dropping this folder."""

from ..runner import LINES
from . import methods

LINES["fastdeploy-2.4"] = methods
