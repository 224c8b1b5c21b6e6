"""Issue 37: a third-party distribution's patch set, registered through the ``fd_async_copy``
entry-point group with the same hook specs as the built-in one, gets its feature planned, enabled,
reported and reverted, and ``doctor`` lists it. The distribution is a dist-info on ``sys.path``
(``third_party_set/``), found by pluggy as an installed one would be; each check runs in a fresh
interpreter, so that no other test's process sees the set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "third_party_set"
FD24 = "fd_async_copy_plugin.testing.reference.fd24"

SCRIPT = f"""
import json, fd_async_copy_plugin as plugin, fdac_demo_set
from fd_async_copy_plugin.config import ConfigError
out = {{"plan": plugin.plan("all,call_counter", backend="host", root="{FD24}")["features"]["call_counter"]}}
out["all"] = list(plugin.plan("all", backend="host", root="{FD24}")["features"])
from fd_async_copy_plugin.registry.catalog import feature_catalog
out["opt_in"] = list(feature_catalog().opt_in)
import {FD24}.worker.gpu_model_runner as m
fd_own = m.GPUModelRunner.exist_prefill
out["status"] = plugin.enable(features=["call_counter"], backend="host", root="{FD24}")["features"]
out["replaced"] = m.GPUModelRunner.exist_prefill is not fd_own
runner = m.GPUModelRunner.__new__(m.GPUModelRunner)
try:
    m.GPUModelRunner.exist_prefill(runner)
except Exception:
    pass  # a bare runner: the link ran first
out["calls"] = list(fdac_demo_set.CALLS)
plugin.disable()
out["restored"] = m.GPUModelRunner.exist_prefill is fd_own
try:
    plugin.enable(features=["call_countr"], backend="host", root="{FD24}")
except ConfigError as exc:
    out["typo"] = str(exc)
print(json.dumps(out))
"""


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def test_a_third_party_patch_set_is_planned_enabled_reported_and_reverted():
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["plan"]["state"] == "apply"
    assert "call_counter" not in out["all"] and "logprobs" in out["all"]  # opt-in: its catalog says so
    assert out["opt_in"] == ["overlap", "call_counter"]  # the built-in set's names first
    assert out["status"]["call_counter"]["state"] == "applied", out["status"]
    assert out["replaced"] and out["calls"] == ["GPUModelRunner"]  # its link ran, not FD's method alone
    assert out["restored"]
    assert "unknown feature(s) ['call_countr']" in out["typo"] and "call_counter" in out["typo"]


def test_doctor_lists_the_third_party_feature():
    done = subprocess.run([sys.executable, "-m", "fd_async_copy_plugin.cli", "doctor", "--json", "--root", FD24],
                          env=_env(), capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    entry = report["features"]["call_counter"]
    assert entry["state"] == "not requested" and "opt-in" in entry["reason"], entry


def test_without_the_distribution_the_name_is_unknown():
    script = ("import fd_async_copy_plugin as p\ntry:\n    p.enable(features=['call_counter'], backend='host')\n"
              "except Exception as exc:\n    print(type(exc).__name__, exc)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("ConfigError") and "unknown feature(s) ['call_counter']" in done.stdout
