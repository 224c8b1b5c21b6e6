"""doctor predicts what enable() does: same state per feature (would-apply <-> applied)."""

from __future__ import annotations

import importlib

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.cli.doctor import diagnose
from fd_async_copy_plugin.config import AsyncCopyConfig
from fd_async_copy_plugin.reference import ROOTS


@pytest.mark.parametrize(
    "env, root",
    [
        ({}, ROOTS["fd24"]),
        ({"FD_ASYNC_COPY_BACKEND": "host"}, ROOTS["fd24"]),
        ({"FD_ASYNC_COPY_BACKEND": "cuda"}, ROOTS["fd24"]),
        ({"FD_ASYNC_COPY_BACKEND": "host", "FD_ASYNC_COPY_FEATURES": "sampled_tokens"}, ROOTS["fd24"]),
        ({"FD_ASYNC_COPY_BACKEND": "host", "FD_ASYNC_COPY_FEATURES": "sampled_tokens,stop_flag"}, ROOTS["fd24"]),
        ({"FD_ASYNC_COPY_BACKEND": "host"}, ROOTS["fd25"]),
        ({"FD_ASYNC_COPY_BACKEND": "host"}, "no_such_fastdeploy"),
    ],
)
def test_doctor_prediction_matches_enable(env, root):
    environ = {"FD_ASYNC_COPY": "1", **env}
    predicted = {n: e["state"] for n, e in diagnose(root=root, environ=environ)["features"].items()}
    config = AsyncCopyConfig.from_env(environ)
    fd_async_copy_plugin.disable()
    try:
        fd_async_copy_plugin.enable(config.features, backend=config.backend, root=root)
        if not root.startswith("no_such"):
            importlib.import_module(f"{root}.worker.gpu_model_runner")  # what FD's worker imports
        actual = {n: e["state"] for n, e in fd_async_copy_plugin.status()["features"].items()}
    finally:
        fd_async_copy_plugin.disable()
    assert {n: ("applied" if s == "would-apply" else s) for n, s in predicted.items()} == actual
