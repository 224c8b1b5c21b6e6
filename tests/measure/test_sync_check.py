"""FD_ASYNC_COPY_SYNC_CHECK on the replica: host waits per decode step (execute_model), by site."""

from __future__ import annotations

import logging
import threading

import paddle
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import sync_check
from fd_async_copy_plugin.testing.harness import CENSUS_VARIANTS, host_waits, run_variant
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import DriverConfig, Request

pytestmark = pytest.mark.usefixtures("plugin_off")

PLAIN = DriverConfig(max_num_seqs=3, vocab_size=128, max_model_len=64, block_size=64)
REQUESTS = [Request(f"r{i}", [3 + i, 4, 5], max_tokens=8, eos_token_ids=[200]) for i in range(3)]
LOGPROBS = DriverConfig(max_num_seqs=3, vocab_size=128, max_model_len=64, block_size=64, enable_logprob=True)
LP_REQUESTS = [Request(f"r{i}", [3 + i, 4, 5], max_tokens=8, eos_token_ids=[200], logprobs=2) for i in range(3)]


def checked(variant, config=PLAIN, requests=REQUESTS, mode="count", warmup=2, allow=()):
    """Arm the check and hook the replica runner's execute_model before the plugin is enabled
    (as the entry point does), run the variant with device tracking as the source."""
    checker = sync_check.start(sync_check.Settings(mode, warmup, tuple(allow)))
    sync_check.install_step_hook(ROOTS[variant.split("-")[0]])
    run = run_variant(CENSUS_VARIANTS[variant], config, requests, max_steps=40, track=True)
    return checker, run


def labels(report):
    """{label: waits per step at sites with that label}."""
    out: dict = {}
    for s in report["sites"]:
        out[s["label"]] = out.get(s["label"], 0) + round(s["per_step"])
    return out


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def log_lines():
    logger = logging.getLogger("fd_async_copy")
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.parametrize("variant, config, requests, expected", [
    ("fd24-unpatched", PLAIN, REQUESTS, 7),
    ("fd24-plugin", PLAIN, REQUESTS, 1),
    ("fd24-unpatched", LOGPROBS, LP_REQUESTS, 10),
    ("fd24-plugin", LOGPROBS, LP_REQUESTS, 1),
])
def test_counts_the_census_waits_per_decode_step(variant, config, requests, expected):
    checker, run = checked(variant, config, requests)
    report = sync_check.status()
    assert report["mode"] == "count" and report["steps_counted"] >= 4
    assert report["waits_per_step"] == expected, report
    # the same sites as the bench census (device tracking over the driver's whole loop step)
    census = host_waits(run.census.steps)
    assert census["total"] == expected
    assert {(s["site"], s["what"]) for s in report["sites"]} == {(s["site"], s["what"]) for s in census["sites"]}
    if expected == 1:
        assert labels(report) == {"save event": 1}
    # and status() of the plugin carries them
    assert fd_async_copy_plugin.status()["sync_check"]["waits_per_step"] == expected


def test_fd24_plain_step_names_fd24_step_syncs_points():
    checked("fd24-unpatched")
    assert labels(sync_check.status()) == {"S1": 1, "S2": 1, "S3/S7": 2, "T": 1, "S5": 1, "S6": 1}


def test_warmup_steps_are_not_counted():
    checker, run = checked("fd24-unpatched", warmup=3)
    assert checker.steps_seen >= 6 and checker.steps_counted == checker.steps_seen - 3


def test_a_planted_extra_sync_is_counted_and_raise_fails_on_it(monkeypatch):
    from fd_async_copy_plugin.testing.reference.fd24.worker import gpu_model_runner as module

    original = module.GPUModelRunner._prepare_inputs

    def planted(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        int(self.share_inputs["seq_lens_this_time"].sum())  # a host read of a device value
        return out

    monkeypatch.setattr(module.GPUModelRunner, "_prepare_inputs", planted)
    checked("fd24-plugin")
    report = sync_check.status()
    assert report["waits_per_step"] == 2
    extra = [s for s in report["sites"] if s["label"] != "save event"]
    assert len(extra) == 1 and "test_sync_check.py" in extra[0]["site"] and extra[0]["what"] == "int()"

    sync_check.uninstall_step_hooks()
    with pytest.raises(sync_check.SyncCheckError, match="test_sync_check.py.*planted"):
        checked("fd24-plugin", mode="raise", allow=("save event",))


def test_raise_passes_when_every_site_is_allowed():
    checker, run = checked("fd24-plugin", mode="raise", allow=("save event",))
    assert checker.steps_counted >= 4


def test_raise_on_unpatched_fd24_names_the_first_site():
    with pytest.raises(sync_check.SyncCheckError, match=r"S3/S7 d2h at reference/fd24/worker/gpu_model_runner.py:\d+ exist_prefill"):
        checked("fd24-unpatched", mode="raise", allow=("save event",))


def test_warn_logs_each_new_site_once(log_lines):
    checker, _ = checked("fd24-unpatched", mode="warn")
    warnings = [line for line in log_lines if "sync check: decode step" in line]
    sites = sync_check.status()["sites"]
    assert checker.steps_counted >= 4 and len(warnings) == len(sites) == 6, warnings  # S3/S7 twice at one site
    assert all(any(s["site"] in w for w in warnings) for s in sites)


def test_waits_on_another_thread_are_not_the_step():
    checker = sync_check.start(sync_check.Settings("count", 0))
    checker.step_begin()
    worker = threading.Thread(target=sync_check.observe, args=("d2h", "x.py:1 f", "int()"))
    worker.start()
    worker.join()
    sync_check.observe("d2h", "y.py:2 g", ".numpy()")
    checker.step_end()
    report = sync_check.status()
    assert report["waits_per_step"] == 1 and [s["site"] for s in report["sites"]] == ["y.py:2 g"]
    assert report["waits_outside_steps"] == 1


def test_count_logs_a_line_every_k_steps(log_lines):
    checker = sync_check.start(sync_check.Settings("count", 0, (), 2))
    for _ in range(5):
        checker.step_begin()
        sync_check.observe("event", "patches/fd24/stop_flag.py:9 _save_model_output", "event wait save")
        checker.step_end()
    lines = [line for line in log_lines if "decode step: 1 host wait" in line]
    assert len(lines) == 2 and "save event at patches/fd24/stop_flag.py:9" in lines[0], lines


@pytest.mark.parametrize("env, message", [
    ({"FD_ASYNC_COPY_SYNC_CHECK": "yes"}, "FD_ASYNC_COPY_SYNC_CHECK='yes': expected one of off, count, warn, raise"),
    ({"FD_ASYNC_COPY_SYNC_CHECK": "count", "FD_ASYNC_COPY_SYNC_CHECK_WARMUP": "-1"},
     "FD_ASYNC_COPY_SYNC_CHECK_WARMUP='-1': expected an integer >= 0"),
    ({"FD_ASYNC_COPY_SYNC_CHECK": "count", "FD_ASYNC_COPY_SYNC_CHECK_LOG_EVERY": "x"},
     "FD_ASYNC_COPY_SYNC_CHECK_LOG_EVERY='x': expected an integer >= 1"),
    # issue 41: ASCII digits only, as FD_ASYNC_COPY_RING_MAX_BYTES (int() takes both)
    ({"FD_ASYNC_COPY_SYNC_CHECK": "count", "FD_ASYNC_COPY_SYNC_CHECK_WARMUP": "\u0663"},
     "FD_ASYNC_COPY_SYNC_CHECK_WARMUP='\u0663': expected an integer >= 0"),
    ({"FD_ASYNC_COPY_SYNC_CHECK": "count", "FD_ASYNC_COPY_SYNC_CHECK_LOG_EVERY": "1_0"},
     "FD_ASYNC_COPY_SYNC_CHECK_LOG_EVERY='1_0': expected an integer >= 1"),
])
def test_a_bad_value_is_an_error_and_the_check_stays_off(env, message):
    with pytest.raises(sync_check.SyncCheckConfigError, match=message.replace("(", r"\(")):
        sync_check.Settings.from_env(env)
    assert sync_check.install_from_env(environ=env) is None
    assert sync_check.status()["mode"] == "off" and message in sync_check.status()["config_error"]


def test_off_installs_nothing():
    before = (paddle.Tensor.numpy, paddle.Tensor.__int__, paddle.device.synchronize)
    assert sync_check.install_from_env(root=ROOTS["fd24"], environ={}) is None
    assert (paddle.Tensor.numpy, paddle.Tensor.__int__, paddle.device.synchronize) == before
    from fd_async_copy_plugin.testing.reference.fd24.worker import gpu_model_runner as module

    assert not hasattr(module.GPUModelRunner.execute_model, "__fd_sync_check_original__")
    assert sync_check.status() == {"mode": "off"}


def test_gpu_source_counts_host_reads_of_device_tensors_only_inside_a_step(monkeypatch):
    """The shipped wrappers, on CPU Paddle, with a predicate that calls some tensors "device"."""
    device = paddle.to_tensor([3, 4])
    host = paddle.to_tensor([5])
    copies = []

    def copy_(self, src, blocking=True):  # CPU Paddle has no host<-device copy_: a stand-in
        copies.append(blocking)

    monkeypatch.setattr(paddle.Tensor, "copy_", copy_)
    monkeypatch.setattr(paddle.device, "synchronize", lambda device=None: None)  # CPU Paddle refuses it
    checker = sync_check.start(sync_check.Settings("count", 0))
    sync_check.install_gpu_source(is_device=lambda t: t is device)
    try:
        device.numpy()  # outside a step: not counted
        checker.step_begin()
        device.tolist()
        host.numpy()
        dst = paddle.zeros([2], dtype=device.dtype)
        dst.copy_(device, True)
        dst.copy_(device, False)  # non-blocking: not a wait
        paddle.device.synchronize()
        checker.step_end()
    finally:
        sync_check.uninstall_gpu_source()
    assert copies == [True, False]
    report = sync_check.status()
    assert report["waits_per_step"] == 3, report
    whats = sorted(s["what"] for s in report["sites"])
    assert whats == [".tolist()", "copy_ into host memory", "paddle.device.synchronize"]
    assert all("test_sync_check.py" in s["site"] for s in report["sites"])
    assert paddle.Tensor.numpy.__name__ == "numpy" and not hasattr(paddle.Tensor.numpy, "__wrapped__")


def test_doctor_json_reports_the_sync_check_settings():
    from fd_async_copy_plugin.cli.doctor import diagnose

    report = diagnose(environ={"FD_ASYNC_COPY_SYNC_CHECK": "warn", "FD_ASYNC_COPY_SYNC_CHECK_WARMUP": "5"})
    assert report["sync_check"] == {"mode": "warn", "warmup": 5, "allow": [], "log_every": 100}
    bad = diagnose(environ={"FD_ASYNC_COPY_SYNC_CHECK": "on"})
    assert "expected one of off, count, warn, raise" in bad["sync_check"]["config_error"]


def test_register_arms_the_check_with_the_plugin_inactive(monkeypatch):
    hooked = []
    monkeypatch.setattr(sync_check, "install_step_hook", hooked.append)
    monkeypatch.setattr(sync_check, "install_gpu_source", lambda: None)
    monkeypatch.delenv("FD_ASYNC_COPY", raising=False)
    monkeypatch.setenv("FD_ASYNC_COPY_SYNC_CHECK", "count")
    fd_async_copy_plugin.register()
    assert hooked == ["fastdeploy"] and fd_async_copy_plugin.status()["sync_check"]["mode"] == "count"
    assert not fd_async_copy_plugin.status()["enabled"]
    sync_check.stop()
    monkeypatch.setenv("FD_ASYNC_COPY_SYNC_CHECK", "on")
    fd_async_copy_plugin.register()  # a bad value: logged, the check stays off, FD starts
    assert "expected one of off, count, warn, raise" in fd_async_copy_plugin.status()["sync_check"]["config_error"]


# ---- the shipped GPU source, as it runs on a GPU, on the replica (tracking marks tensors only) ----

TOP_P_MODULE = "fd_async_copy_plugin.testing.reference.fd24.model_executor.layers.sample.ops.top_k_top_p_sampling"


def gpu_source_run(variant, config=PLAIN, requests=REQUESTS, mode="count", allow=(), monkeypatch=None):
    """The GPU source's wrappers count (device tracking only marks which tensors are on the device).
    The replica's stand-in for ``paddle.tensor.top_p_sampling`` gets the wrapper that Paddle's op
    gets on a GPU."""
    import importlib

    from fd_async_copy_plugin.testing.reference import device_tracking

    module = importlib.import_module(TOP_P_MODULE)
    monkeypatch.setattr(module, "top_p_sampling", sync_check.wrap_pageable_input("top_p_sampling", module.top_p_sampling))
    checker = sync_check.start(sync_check.Settings(mode, 2, tuple(allow)))
    sync_check.install_gpu_source(is_device=device_tracking.on_device_for_host_code)
    sync_check.install_step_hook(ROOTS["fd24"])  # with it, FD 2.4's compiled ops of OP_WAITS
    run = run_variant(CENSUS_VARIANTS[variant], config, requests, max_steps=40, track="marks")
    return checker, run


@pytest.mark.parametrize("variant, config, requests, expected", [
    ("fd24-unpatched", PLAIN, REQUESTS, 7),
    ("fd24-plugin", PLAIN, REQUESTS, 1),
    ("fd24-unpatched", LOGPROBS, LP_REQUESTS, 10),
    ("fd24-plugin", LOGPROBS, LP_REQUESTS, 1),
])
def test_gpu_source_counts_what_the_census_counts(variant, config, requests, expected, monkeypatch):
    checker, _ = gpu_source_run(variant, config, requests, monkeypatch=monkeypatch)
    report = sync_check.status()
    assert report["waits_per_step"] == expected, report
    census = run_variant(CENSUS_VARIANTS[variant], config, requests, max_steps=40, track=True)
    census_labels: dict = {}
    for s in host_waits(census.census.steps)["sites"]:
        census_labels[s["label"]] = census_labels.get(s["label"], 0) + round(s["per_step"])
    assert labels(report) == census_labels
    if variant == "fd24-unpatched":  # a compiled op's wait is named by the op, at its FD caller
        op = next(s for s in report["sites"] if s["label"] == "S1")
        assert op["what"].startswith("get_padding_offset (op: token_num to the host, get_padding_offset.cu:80")
        assert op["site"].endswith("pre_and_post_process.py:70 pre_process")


def test_gpu_source_finds_a_planted_sync_and_raise_fails_on_it(monkeypatch):
    from fd_async_copy_plugin.testing.reference.fd24.worker import gpu_model_runner as module

    original = module.GPUModelRunner._prepare_inputs

    def planted(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        self.share_inputs["seq_lens_this_time"].tolist()  # a host read of a device value
        return out

    monkeypatch.setattr(module.GPUModelRunner, "_prepare_inputs", planted)
    gpu_source_run("fd24-plugin", monkeypatch=monkeypatch)
    assert sync_check.status()["waits_per_step"] == 2
    sync_check.uninstall_step_hooks()
    sync_check.uninstall_gpu_source()
    with pytest.raises(sync_check.SyncCheckError, match=r"d2h at .*test_sync_check.py:\d+ planted \(.tolist\(\)\)"):
        gpu_source_run("fd24-plugin", mode="raise", allow=("save event",), monkeypatch=monkeypatch)


def test_with_the_check_off_register_does_not_even_import_it():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FD_ASYNC_COPY")}
    code = ("import sys, fd_async_copy_plugin as p; p.register(); "
            "print('fd_async_copy_plugin.sync_check' in sys.modules, 'fd_async_copy_plugin.trace' in sys.modules, "
            "p.status()['sync_check'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False False {'mode': 'off'}", out.stderr[-2000:]


def test_the_measure_host_backend_fixture_makes_the_host_backend_current(host_backend):
    """issue 41: the fixture called the removed ``runtime.use`` (an AttributeError at setup)."""
    from fd_async_copy_plugin import runtime
    from fd_async_copy_plugin.testing.reference import copy_backend

    assert isinstance(host_backend, runtime.HostBackend) and copy_backend.current() is host_backend


# ---- issue 41: the check armed after enable() (FD imported, the plugin applied, then the check) ----

def _arm_after_enable(monkeypatch, mode="count", is_device=None):
    """run_variant with the check armed right after enable(): its op hooks and Paddle wrappers go
    onto attributes the plugin's junctions already hold."""
    import contextlib
    import importlib

    from fd_async_copy_plugin.testing import harness
    from fd_async_copy_plugin.testing.reference import device_tracking

    module = importlib.import_module(TOP_P_MODULE)
    monkeypatch.setattr(module, "top_p_sampling", sync_check.wrap_pageable_input("top_p_sampling", module.top_p_sampling))
    original_state = harness.plugin_state
    seen = {}

    @contextlib.contextmanager
    def state_then_check(variant, backend):
        with original_state(variant, backend) as status:
            sync_check.start(sync_check.Settings(mode, 2))
            sync_check.install_gpu_source(is_device=is_device or device_tracking.on_device_for_host_code)
            sync_check.install_step_hook(variant.root)
            seen["after_arming"] = fd_async_copy_plugin.status()
            yield status
            seen["after_run"] = fd_async_copy_plugin.status()

    monkeypatch.setattr(harness, "plugin_state", state_then_check)
    return seen


@pytest.mark.parametrize("config, requests", [(PLAIN, REQUESTS), (LOGPROBS, LP_REQUESTS)], ids=["plain", "logprobs"])
def test_arming_the_check_after_enable_leaves_every_feature_applied(config, requests, monkeypatch):
    seen = _arm_after_enable(monkeypatch)
    run = run_variant(CENSUS_VARIANTS["fd24-plugin"], config, requests, max_steps=40, track="marks")
    for when in ("after_arming", "after_run"):  # pending: until FD imports the sampler's module
        states = {name: e["state"] for name, e in seen[when]["features"].items()}
        ok = ("applied", "native", "pending") if when == "after_arming" else ("applied", "native")
        assert all(s in ok for s in states.values()), (when, seen[when]["features"])
    # the patched paths ran: one wait a step (the save event), as with the check armed first
    assert sync_check.status()["waits_per_step"] == 1, sync_check.status()
    baseline = run_variant(CENSUS_VARIANTS["fd24-unpatched"], config, requests, max_steps=40)
    run.result.assert_same(baseline.result)


def test_disable_keeps_the_checks_wrappers_and_stop_leaves_paddle_as_it_was(monkeypatch):
    names = ("numpy", "__getitem__", "__setitem__", "tolist", "item")
    originals = {name: paddle.Tensor.__dict__.get(name) for name in names}
    sync_before = paddle.device.synchronize
    device = paddle.to_tensor([1, 2, 3])
    _arm_after_enable(monkeypatch, is_device=lambda t: t is device)
    run_variant(CENSUS_VARIANTS["fd24-plugin"], PLAIN, REQUESTS, max_steps=40)
    assert not fd_async_copy_plugin.status()["enabled"]  # run_variant's disable() ran
    checker = sync_check.checker()
    checker._local.waits = None
    checker.step_begin()
    device.numpy()  # the check's wrapper still counts this host read of a "device" tensor
    assert [w.what for w in checker._local.waits] == [".numpy()"]
    checker.step_end()
    sync_check.uninstall_step_hooks()
    sync_check.stop()
    after = {name: paddle.Tensor.__dict__.get(name) for name in names}
    assert after == originals  # no dead junction (nor wrapper) left on Paddle's methods
    assert paddle.device.synchronize is sync_before
