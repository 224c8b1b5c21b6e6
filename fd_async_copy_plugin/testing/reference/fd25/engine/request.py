"""Mirrors ``Request`` / ``RequestType`` (unchanged at the patch points in 2.5)."""

from ...fd24.engine.request import Request, RequestType  # noqa: F401
