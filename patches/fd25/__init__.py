"""FastDeploy 2.5's line, which develop shares (its features there, logprobs and sync_scope, are a
subset): ``methods.py`` (what runs around each FastDeploy method) and ``step_syncs.py`` (the seed on
the device, the token-count shadow) and the feature only this line gets, ``flag_race.py``.
Dropping the line is dropping this folder (and its names in the catalog, ``patches/__init__.py``)."""

from ..runner import LINES
from . import methods

LINES["fastdeploy-2.5"] = LINES["fastdeploy-2.6+"] = methods
