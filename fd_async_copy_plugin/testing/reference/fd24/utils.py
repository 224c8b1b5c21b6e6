"""Mirrors ``fill_paddle_tensor`` of ``fastdeploy/utils.py`` (2.4, :1167): skips missing keys,
logs (here: swallows into ``fill_failures``) any exception."""

from __future__ import annotations

import paddle

#: (key, error) of every failed fill, where FastDeploy logs a warning.
fill_failures: list[tuple[str, str]] = []


def fill_paddle_tensor(shared_inputs, key, value):
    try:
        if key not in shared_inputs:
            return
        if isinstance(shared_inputs[key], paddle.Tensor):
            shared_inputs[key].fill_(value)
    except Exception as e:  # FastDeploy logs a warning and carries on
        fill_failures.append((key, str(e)))
