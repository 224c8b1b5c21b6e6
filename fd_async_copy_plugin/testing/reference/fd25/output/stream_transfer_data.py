"""Mirrors ``fastdeploy/output/stream_transfer_data.py`` (unchanged in 2.5)."""

from ...fd24.output.stream_transfer_data import DecoderState, StreamTransferData  # noqa: F401
