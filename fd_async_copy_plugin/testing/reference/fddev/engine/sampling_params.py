"""Mirrors ``fastdeploy/engine/sampling_params.py`` (develop): unchanged from the 2.5 replica."""

from ...fd25.engine.sampling_params import SamplingParams  # noqa: F401
