"""Mirrors ``SamplingParams`` (unchanged at the patch points in 2.5)."""

from ...fd24.engine.sampling_params import SamplingParams  # noqa: F401
