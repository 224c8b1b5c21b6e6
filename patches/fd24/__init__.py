"""FastDeploy 2.4's line: ``methods.py`` (what runs around each FastDeploy method),
``step_syncs.py`` (its host shadow of the step state) and the features only this line gets,
``stop_flag.py`` (the backport of PR #6176) and ``overlap.py`` (the save one step later). Dropping
the line is dropping this folder (and its names in the catalog, ``patches/__init__.py``)."""

from ..runner import LINES
from . import methods

LINES["fastdeploy-2.4"] = methods
