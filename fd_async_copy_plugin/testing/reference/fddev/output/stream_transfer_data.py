"""Mirrors ``fastdeploy/output/stream_transfer_data.py`` (develop): unchanged from the 2.5 replica."""

from ...fd25.output.stream_transfer_data import DecoderState, StreamTransferData  # noqa: F401
