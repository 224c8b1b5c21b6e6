"""Mirrors ``fastdeploy/inter_communicator``: only ``ZmqIpcClient``, delivering in process."""

from ...zmq_sink import ZmqIpcClient

__all__ = ["ZmqIpcClient"]
