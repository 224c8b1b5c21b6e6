"""Mirrors ``fastdeploy/engine/request.py`` (develop): the replica's ``Request`` is unchanged from 2.5."""

from ...fd25.engine.request import Request, RequestType  # noqa: F401
