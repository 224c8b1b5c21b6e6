"""FastDeploy 2.5's line, which develop shares (its features there, logprobs and sync_scope, are a
subset): ``methods.py`` (what runs around each FastDeploy method) and ``step_syncs.py`` (the seed on
the device, the token-count shadow). Dropping the line is dropping this folder."""

from ..runner import LINES
from . import methods

LINES["fastdeploy-2.5"] = LINES["fastdeploy-2.6+"] = methods
