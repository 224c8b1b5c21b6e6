"""Environment parsing, the FastDeploy entry point, and the ``register()`` contract."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import subprocess
import sys

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.config import AsyncCopyConfig, ConfigError
from fd_async_copy_plugin.registry.catalog import feature_catalog

FEATURES = feature_catalog().default
from fd_async_copy_plugin.registry.manager import collect_features, plugin_manager


def test_defaults_mean_loaded_but_inactive():
    config = AsyncCopyConfig.from_env({}, catalog=feature_catalog())
    assert (config.enabled, config.features, config.backend, config.strict) == (False, FEATURES, "auto", False)


def test_valid_values():
    config = AsyncCopyConfig.from_env(
        {"FD_ASYNC_COPY": "1", "FD_ASYNC_COPY_FEATURES": "logprobs, stop_flag", "FD_ASYNC_COPY_BACKEND": "host", "FD_ASYNC_COPY_STRICT": "1"}
    )
    assert config.enabled and config.strict
    assert config.features == ("logprobs", "stop_flag")
    assert config.backend == "host"


@pytest.mark.parametrize(
    "name, value, allowed",
    [
        ("FD_ASYNC_COPY", "yes", "1 (on) or 0 (off)"),
        ("FD_ASYNC_COPY_FEATURES", "logprobs,bogus", "logprobs, stop_flag, sampled_tokens, sync_scope"),
        ("FD_ASYNC_COPY_FEATURES", ",", "'all'"),
        ("FD_ASYNC_COPY_BACKEND", "gpu", "auto, cuda, host"),
        ("FD_ASYNC_COPY_BACKEND", "sim", "auto, cuda, host"),
        ("FD_ASYNC_COPY_STRICT", "true", "1 (on) or 0 (off)"),
        ("FD_ASYNC_COPY_OVERLAP_COUNT", "fast", "exact (default: bit-identical to FastDeploy 2.4, the wait at"),
        ("FD_ASYNC_COPY_OVERLAP_COUNT", "fast", "prepare (the wait before the prepare) or bound (FastDeploy 2.5"),
    ],
)
def test_bad_values_name_variable_value_and_allowed(name, value, allowed):
    with pytest.raises(ConfigError) as info:
        AsyncCopyConfig.from_env({name: value}, catalog=feature_catalog())
    message = str(info.value)
    assert name in message and repr(value) in message and allowed in message


def test_entry_point_is_discoverable_in_fastdeploys_group():
    eps = importlib.metadata.entry_points(group="fastdeploy.model_register_plugins")
    ours = [ep for ep in eps if ep.name == "fd_async_copy"]
    assert len(ours) == 1
    assert ours[0].load() is fd_async_copy_plugin.register


def test_builtin_patch_sets_register_through_the_entry_point_group():
    eps = importlib.metadata.entry_points(group="fd_async_copy")
    assert "builtin" in {ep.name for ep in eps}
    features = collect_features(plugin_manager())
    options = {option for feature in features.values() for option in feature.options}
    assert set(FEATURES) <= set(features) | options
    assert set(features["stop_flag"].options) == {"sampled_tokens"}  # an option, not a feature


def test_register_inactive_by_default_logs_how_to_enable(monkeypatch, caplog):
    for name in ("FD_ASYNC_COPY", "FD_ASYNC_COPY_FEATURES", "FD_ASYNC_COPY_BACKEND", "FD_ASYNC_COPY_STRICT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(fd_async_copy_plugin, "_inactive_logged", False)
    caplog.set_level(logging.INFO, logger="fd_async_copy")
    monkeypatch.setattr(logging.getLogger("fd_async_copy"), "propagate", True)
    fd_async_copy_plugin.register()
    fd_async_copy_plugin.register()  # idempotent, logs once
    lines = [r.getMessage() for r in caplog.records if "inactive" in r.getMessage()]
    assert len(lines) == 1 and "FD_ASYNC_COPY=1" in lines[0]
    assert fd_async_copy_plugin.status()["enabled"] is False


@pytest.mark.parametrize("name, value", [("FD_ASYNC_COPY_BACKEND", "gpu"), ("FD_ASYNC_COPY_OVERLAP_COUNT", "fast")])
def test_register_with_bad_value_leaves_fastdeploy_unpatched(monkeypatch, caplog, name, value):
    monkeypatch.setenv("FD_ASYNC_COPY", "1")
    monkeypatch.setenv("FD_ASYNC_COPY_FEATURES", "all,overlap")
    monkeypatch.setenv(name, value)
    monkeypatch.delenv("FD_ASYNC_COPY_STRICT", raising=False)
    monkeypatch.setattr(logging.getLogger("fd_async_copy"), "propagate", True)
    caplog.set_level(logging.INFO, logger="fd_async_copy")
    fd_async_copy_plugin.register()
    assert any(f"{name}={value!r}" in r.getMessage() for r in caplog.records)
    assert fd_async_copy_plugin.status()["enabled"] is False


def test_register_with_bad_value_raises_in_strict_mode(monkeypatch):
    monkeypatch.setenv("FD_ASYNC_COPY", "1")
    monkeypatch.setenv("FD_ASYNC_COPY_FEATURES", "nope")
    monkeypatch.setenv("FD_ASYNC_COPY_STRICT", "1")
    with pytest.raises(ConfigError, match="FD_ASYNC_COPY_FEATURES='nope'"):
        fd_async_copy_plugin.register()


def test_enable_rejects_bad_arguments_before_touching_anything():
    with pytest.raises(ConfigError, match="backend='gpu'"):
        fd_async_copy_plugin.enable(backend="gpu")
    with pytest.raises(ConfigError, match="unknown feature"):
        fd_async_copy_plugin.enable(features=["logprobs", "nope"])
    assert fd_async_copy_plugin.status()["enabled"] is False


def test_backend_auto_stands_down_on_cpu_paddle_with_reason():
    try:
        status = fd_async_copy_plugin.enable(root="fd_async_copy_plugin.testing.reference.fd24")
        for name, entry in status["features"].items():
            if entry["state"] == "skipped":
                assert "CUDA" in entry["reason"] or "custom ops" in entry["reason"] or "not for" in entry["reason"], entry
        assert all(e["state"] != "applied" for e in status["features"].values())
    finally:
        fd_async_copy_plugin.disable()


def test_strict_mode_turns_skips_into_an_error_and_reverts():
    from fd_async_copy_plugin.registry.manager import StrictModeError

    with pytest.raises(StrictModeError, match="logprobs"):
        fd_async_copy_plugin.enable(features="logprobs", backend="auto", strict=True, root="no_such_fastdeploy")
    assert fd_async_copy_plugin.status()["enabled"] is False


def test_doctor_json_has_the_status_shape():
    out = subprocess.run(
        [sys.executable, "-m", "fd_async_copy_plugin.cli", "doctor", "--json", "--root", "fd_async_copy_plugin.testing.reference.fd24"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report = json.loads(out)
    for key in ("enabled", "fastdeploy_version", "profile", "backend", "features", "ops", "paddle", "env"):
        assert key in report, key
    assert set(report["features"]) == set(FEATURES) | {"overlap"}  # the opt-in one as "not requested"
    for entry in report["features"].values():
        assert set(entry) == {"state", "reason"}
        assert entry["state"] in ("apply", "native", "skipped", "failed", "not requested")


def test_enable_with_an_empty_feature_list_is_an_error_not_everything():
    with pytest.raises(ConfigError, match=r"features=\[\]"):
        fd_async_copy_plugin.enable(features=[])
    assert fd_async_copy_plugin.status()["enabled"] is False


def test_register_survives_an_unexpected_failure_unless_strict(monkeypatch, caplog):
    """FastDeploy calls register() at module level of its models package: only strict mode may
    stop the server; otherwise FD runs unpatched and the reason is logged."""

    def broken(*args, **kwargs):
        raise RuntimeError("planted: a broken third-party patch set")

    monkeypatch.setattr(fd_async_copy_plugin._get_manager(), "enable", broken)
    monkeypatch.setenv("FD_ASYNC_COPY", "1")
    monkeypatch.delenv("FD_ASYNC_COPY_STRICT", raising=False)
    monkeypatch.setattr(logging.getLogger("fd_async_copy"), "propagate", True)
    caplog.set_level(logging.INFO, logger="fd_async_copy")
    fd_async_copy_plugin.register()
    assert any("planted" in (r.exc_text or "") or "enabling failed" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("FD_ASYNC_COPY_STRICT", "1")
    with pytest.raises(RuntimeError, match="planted"):
        fd_async_copy_plugin.register()


def test_dependencies_apply_first_whatever_order_is_asked():
    status = fd_async_copy_plugin.enable(features="sampled_tokens,stop_flag", backend="host",
                                         root="fd_async_copy_plugin.testing.reference.fd24")
    try:
        import importlib

        importlib.import_module("fd_async_copy_plugin.testing.reference.fd24.worker.gpu_model_runner")
        states = {n: e["state"] for n, e in fd_async_copy_plugin.status()["features"].items()}
        assert states == {"sampled_tokens": "applied", "stop_flag": "applied"}, (status, states)
    finally:
        fd_async_copy_plugin.disable()


# Issue 25 item 4: values that pass str.isdigit() (or int()) but are not ASCII digits.
NON_ASCII_SIZES = ("²", "①", "١٢٣M", "1²M", "٣")


@pytest.mark.parametrize("value", NON_ASCII_SIZES)
def test_ring_max_bytes_takes_ascii_digits_only(value):
    with pytest.raises(ConfigError) as info:
        AsyncCopyConfig.from_env({"FD_ASYNC_COPY_RING_MAX_BYTES": value})
    assert f"FD_ASYNC_COPY_RING_MAX_BYTES={value!r}" in str(info.value) and "positive number of bytes" in str(info.value)
    with pytest.raises(ConfigError, match="ring_max_bytes="):
        fd_async_copy_plugin.enable(backend="host", ring_max_bytes=value, root="no_such_fastdeploy")
    assert fd_async_copy_plugin.status()["enabled"] is False


@pytest.mark.parametrize("enabled", ["0", "1", None])
@pytest.mark.parametrize("value", NON_ASCII_SIZES[:3])
def test_register_never_raises_on_a_bad_size_outside_strict_mode(monkeypatch, caplog, enabled, value):
    if enabled is None:
        monkeypatch.delenv("FD_ASYNC_COPY", raising=False)
    else:
        monkeypatch.setenv("FD_ASYNC_COPY", enabled)
    monkeypatch.setenv("FD_ASYNC_COPY_RING_MAX_BYTES", value)
    monkeypatch.delenv("FD_ASYNC_COPY_STRICT", raising=False)
    monkeypatch.setattr(logging.getLogger("fd_async_copy"), "propagate", True)
    caplog.set_level(logging.INFO, logger="fd_async_copy")
    fd_async_copy_plugin.register()
    assert any(f"FD_ASYNC_COPY_RING_MAX_BYTES={value!r}" in r.getMessage() and "unpatched" in r.getMessage()
               for r in caplog.records)
    assert fd_async_copy_plugin.status()["enabled"] is False
    monkeypatch.setenv("FD_ASYNC_COPY_STRICT", "1")
    with pytest.raises(ConfigError, match="FD_ASYNC_COPY_RING_MAX_BYTES"):
        fd_async_copy_plugin.register()


def test_register_never_raises_when_config_parsing_itself_fails(monkeypatch, caplog):
    from fd_async_copy_plugin import config

    def broken(raw, source="x"):
        raise ValueError("planted parser bug")

    monkeypatch.setattr(config, "parse_ring_max_bytes", broken)
    monkeypatch.setenv("FD_ASYNC_COPY", "1")
    monkeypatch.delenv("FD_ASYNC_COPY_STRICT", raising=False)
    monkeypatch.setattr(logging.getLogger("fd_async_copy"), "propagate", True)
    caplog.set_level(logging.INFO, logger="fd_async_copy")
    fd_async_copy_plugin.register()
    assert any("planted parser bug" in r.getMessage() for r in caplog.records)
    assert fd_async_copy_plugin.status()["enabled"] is False


@pytest.mark.parametrize("name, value", [("FD_ASYNC_COPY_BACKEND", "gpu"), ("FD_ASYNC_COPY_RING_MAX_BYTES", "²")])
def test_doctor_human_output_reports_bad_env_without_a_traceback_and_exits_non_zero(name, value):
    done = subprocess.run(
        [sys.executable, "-m", "fd_async_copy_plugin.cli", "doctor"],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, name: value},
        timeout=120,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.returncode == 1
    assert "CONFIG ERROR" in done.stdout and f"{name}={value!r}" in done.stdout


def test_enable_takes_the_settings_from_python_and_validates_them_like_the_variables(monkeypatch):
    """``enable(ring_max_bytes=..., overlap_count=...)``: no patch reads the environment; a bad value
    is a ``ConfigError`` naming the argument, before anything is touched."""
    import importlib

    from fd_async_copy_plugin.config import ConfigError
    from fd_async_copy_plugin.testing.reference import ROOTS

    root = ROOTS["fd24"]
    importlib.import_module(f"{root}.worker.gpu_model_runner")
    importlib.import_module(f"{root}.model_executor.pre_and_post_process")
    monkeypatch.setenv("FD_ASYNC_COPY_RING_MAX_BYTES", "1G")
    monkeypatch.setenv("FD_ASYNC_COPY_OVERLAP_COUNT", "exact")
    manager = fd_async_copy_plugin._get_manager()
    try:
        fd_async_copy_plugin.enable(["logprobs", "stop_flag", "step_syncs", "overlap"], backend="host", root=root,
                                    ring_max_bytes="6000", overlap_count="bound")
        assert manager.applied["logprobs"].ctx.state.ring_max_bytes == 6000
        assert manager.applied["overlap"].ctx.settings.overlap_count == "bound"  # what its runner parts use
        fd_async_copy_plugin.disable()
        fd_async_copy_plugin.enable(["logprobs", "stop_flag", "step_syncs", "overlap"], backend="host", root=root,
                                    overlap_count="launch")  # the old name of exact
        assert manager.applied["overlap"].ctx.settings.overlap_count == "exact"
        fd_async_copy_plugin.disable()
        fd_async_copy_plugin.enable(["logprobs"], backend="host", root=root)  # unset: the variables
        assert manager.applied["logprobs"].ctx.state.ring_max_bytes == 1 << 30
        fd_async_copy_plugin.disable()
        for bad, name in (({"ring_max_bytes": "²"}, "ring_max_bytes"), ({"ring_max_bytes": True}, "ring_max_bytes"),
                          ({"overlap_count": "fast"}, "overlap_count")):
            with pytest.raises(ConfigError, match=name):
                fd_async_copy_plugin.enable(["logprobs"], backend="host", root=root, **bad)
            assert not manager.enabled and not manager.applied
    finally:
        fd_async_copy_plugin.disable()
