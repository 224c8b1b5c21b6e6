"""Mirrors ``fastdeploy/envs.py`` (2.4): environment variables read lazily at attribute access.

Only the variables the patch points read are replicated; defaults match 2.4.
"""

from __future__ import annotations

import os
from typing import Any, Callable

environment_variables: dict[str, Callable[[], Any]] = {
    # Recover disabled (step_reschedule instead of step_paddle) on the non-V1 path.
    "FD_DISABLED_RECOVER": lambda: os.getenv("FD_DISABLED_RECOVER", "0"),
    # The V1 KV-cache scheduler: update_inputs_v1, insert_tasks_v1. On by default in 2.4.
    "ENABLE_V1_KVCACHE_SCHEDULER": lambda: int(os.getenv("ENABLE_V1_KVCACHE_SCHEDULER", "1")),
    "FD_PLUGINS": lambda: None if "FD_PLUGINS" not in os.environ else os.environ["FD_PLUGINS"].split(","),
    # The ZMQ output path (_build_stream_transfer_data + the output thread) instead of save_output.
    "FD_USE_GET_SAVE_OUTPUT_V1": lambda: bool(int(os.getenv("FD_USE_GET_SAVE_OUTPUT_V1", "0"))),
}


def __getattr__(name: str):
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return list(environment_variables.keys())
