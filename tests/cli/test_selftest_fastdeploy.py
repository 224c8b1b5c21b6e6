"""``fd-async-copy selftest`` against an installed FastDeploy (``fd_async_copy_plugin/selftest_fd``).

CI has no FastDeploy tree: the reference replica is made importable as ``fastdeploy`` (an alias
import hook, below) and plays the installed FastDeploy. The same code was run against the real
FastDeploy 2.4, 2.5 and develop trees on CPU Paddle (``docs/real-fastdeploy-checks.md``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.reference import ROOTS
from fd_async_copy_plugin.selftest_fd import checks, kernel_compare

VOCAB = 64  # small logits keep the checks fast; widths are still 0, 1, 20 and the whole vocabulary


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``fastdeploy.X`` as the replica's ``<root>.X`` (the very same module objects)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def find_spec(self, name, path=None, target=None):
        if name == "fastdeploy" or name.startswith("fastdeploy."):
            real = self.target + name[len("fastdeploy"):]
            if importlib.util.find_spec(real) is None:
                return None
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(self.target + spec.name[len("fastdeploy"):])

    def exec_module(self, module):
        return None


@pytest.fixture
def installed_replica(monkeypatch):
    """``installed_replica("fd24")``: the replica importable as ``fastdeploy`` for this test."""
    finders = []

    def install(version: str):
        root = ROOTS[version]
        finder = _Alias(root)
        sys.meta_path.insert(0, finder)
        finders.append(finder)
        monkeypatch.setitem(sys.modules, "fastdeploy", importlib.import_module(root))
        return root

    yield install
    fd_async_copy_plugin.disable()
    for finder in finders:
        sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n.startswith("fastdeploy.")]:
        del sys.modules[name]


def _by_name(report: dict) -> dict:
    return {(c["name"].split(":")[0], c["backend"]): c for c in report["checks"]}


# --- the framework-neutral kernel comparison core ------------------------------------------------


@pytest.mark.parametrize("variant", ["v1", "v0"])
def test_kernel_compare_core_agrees_with_itself_on_every_branch(variant):
    ref = kernel_compare.reference_runner(variant)
    report = kernel_compare.compare(variant, ref, ref, min_slots=3000, max_num_seqs=256, min_batches=40)
    assert report["mismatching_batches"] == 0 and report["slots"] >= 3000
    assert report["max_bsz"] == 256 and report["partial_batches"] > 0
    if variant == "v1":
        assert all(n > 0 for n in report["branches"].values()), report["branches"]


def test_kernel_compare_core_names_every_differing_array_and_the_flag():
    ref = kernel_compare.reference_runner("v1")

    def wrong(batch):
        flag = ref(batch)
        if len(batch["seq_lens_this_time"]):
            batch["seq_lens_decoder"][0] += 1
        return not flag

    report = kernel_compare.compare("v1", ref, wrong, min_slots=200, max_num_seqs=32, min_batches=5)
    assert report["mismatching_batches"] > 0
    assert any("seq_lens_decoder differs" in m and "not_need_stop" in m for m in report["mismatches"])


def test_kernel_compare_core_reports_an_implementation_that_raises():
    ref = kernel_compare.reference_runner("v0")

    def broken(batch):
        raise RuntimeError("launch failed")

    report = kernel_compare.compare("v0", ref, broken, min_slots=10, max_num_seqs=8, min_batches=1)
    assert report["mismatching_batches"] == report["batches"] > 0
    assert "actual raised RuntimeError: launch failed" in report["mismatches"][0]


# --- against the replica installed as ``fastdeploy`` ----------------------------------------------


def test_without_fastdeploy_only_the_replica_is_checked_and_it_says_so():
    assert importlib.util.find_spec("fastdeploy") is None  # the test venv has no FastDeploy
    report = checks.run(["host"])
    assert report["present"] is False and report["ok"] is True and report["checks"] == []
    assert "only the reference replica was checked" in "\n".join(checks.format_lines(report))


@pytest.mark.parametrize("version", ["fd24", "fd25"])
def test_checks_pass_on_the_installed_replica_through_the_patched_path(version, installed_replica):
    installed_replica(version)
    report = checks.run(["host", "sim"], vocab=VOCAB, kernel_slots=1500, max_num_seqs=128, cost=True)
    assert report["ok"], json.dumps(report["checks"], indent=1, default=str)
    assert report["profile"] == ("fastdeploy-2.4" if version == "fd24" else "fastdeploy-2.5")
    found = _by_name(report)
    for backend in ("host", "sim"):
        logprobs = found[("logprobs", backend)]
        assert logprobs["status"] == "pass"
        # 12 gathers, 3 non-blocking copies each: the patched path ran every time; all held to the end.
        assert logprobs["figures"]["async_copies"] == 3 * logprobs["figures"]["cases"] == 36
        assert logprobs["figures"]["held_results"] == 12 and logprobs["figures"]["ring_slots"] >= 12
        prompt = found[("prompt logprobs", backend)]
        assert prompt["status"] == "pass" and prompt["figures"]["async_copies"] >= 3
    slice_check = found[("sync_scope", "host")]
    assert slice_check["status"] == ("skipped" if version == "fd24" else "pass")
    kernels = [c for c in report["checks"] if c["name"].startswith("stop_flag")]
    if version == "fd24":  # the replica's ops stand in for FastDeploy's compiled ones
        assert [c["status"] for c in kernels] == ["pass", "pass"]
        assert all(c["figures"]["slots"] >= 1500 and c["figures"]["max_bsz"] == 128 for c in kernels)
    else:
        assert [c["status"] for c in kernels] == ["skipped"] and "native" in kernels[0]["reason"]
    accessors = found[("paddle accessors (startup probe of the CUDA layer)", "host")]
    assert accessors["status"] == "skipped"  # no probe in this build, or (issue 10 merged) no CUDA device
    assert accessors["reason"] == "not available in this build" or accessors["reason"].startswith("needs a CUDA")
    cost = found[("cost", "host")]["figures"]
    assert cost["fastdeploy_median_us"] > 0 and cost["plugin_median_us"] > 0
    assert not fd_async_copy_plugin.status()["enabled"] or all(
        f["state"] != "applied" for f in fd_async_copy_plugin.status()["features"].values())


def test_a_planted_gather_logprobs_bug_fails_the_selftest(installed_replica, monkeypatch):
    """The plugin's gather_logprobs hands out wrong ranks: the check fails and says where."""
    from fd_async_copy_plugin.patches import logprobs as logprobs_patch

    installed_replica("fd24")
    real = logprobs_patch.LogprobsCopier.copy

    def planted(self, sampler, indices, top_logprobs, token_ranks):
        return real(self, sampler, indices, top_logprobs, token_ranks + 1)

    monkeypatch.setattr(logprobs_patch.LogprobsCopier, "copy", planted)
    report = checks.run(["host"], vocab=VOCAB, kernel_slots=200, max_num_seqs=16, cost=False)
    found = _by_name(report)
    assert report["ok"] is False
    assert found[("logprobs", "host")]["status"] == "fail"
    assert "selected_token_ranks" in found[("logprobs", "host")]["reason"]
    assert found[("prompt logprobs", "host")]["status"] == "fail"


def test_a_planted_buffer_reuse_while_held_fails_the_selftest(installed_replica, monkeypatch):
    """The ring hands out a slot whose results are still held: the later calls overwrite them."""
    from fd_async_copy_plugin.runtime.ring import PinnedRing

    if not all(hasattr(PinnedRing, n) for n in ("_select", "_verify_unreferenced")):
        pytest.skip("the ring's reuse policy changed: plant the bug in its new form")
    installed_replica("fd24")
    monkeypatch.setattr(PinnedRing, "_select", lambda self: self.slots[self._next % len(self.slots)])
    monkeypatch.setattr(PinnedRing, "_verify_unreferenced", lambda self, slot, writer: True)
    report = checks.run(["host"], vocab=VOCAB, kernel_slots=200, max_num_seqs=16, cost=False)
    assert report["ok"] is False
    assert "held result changed by later calls" in _by_name(report)[("logprobs", "host")]["reason"]


def test_fastdeploys_fallback_for_other_platforms_is_not_taken_for_the_plugin(installed_replica, monkeypatch):
    """FastDeploy's CPU platform takes the patched path on the host backend (that is what makes the
    real-tree check on CPU possible); another non-CUDA platform keeps FastDeploy's code, and the
    selftest then refuses to call FastDeploy-vs-FastDeploy a pass."""
    root = installed_replica("fd24")
    platform = importlib.import_module(root + ".model_executor.layers.sample.sampler").current_platform
    monkeypatch.setattr(platform, "is_cuda", lambda: False)
    monkeypatch.setattr(platform, "is_cpu", lambda: True)
    report = checks.run(["host"], vocab=VOCAB, kernel_slots=200, max_num_seqs=16, cost=False)
    assert _by_name(report)[("logprobs", "host")]["status"] == "pass"
    assert _by_name(report)[("logprobs", "host")]["figures"]["async_copies"] == 36

    monkeypatch.setattr(platform, "is_cpu", lambda: False)  # e.g. XPU: FastDeploy's own code runs
    report = checks.run(["host"], vocab=VOCAB, kernel_slots=200, max_num_seqs=16, cost=False)
    logprobs = _by_name(report)[("logprobs", "host")]
    assert logprobs["status"] == "fail" and "patched path did not run" in logprobs["reason"]


def test_a_planted_stop_flag_kernel_bug_fails_the_selftest(installed_replica, monkeypatch):
    from fd_async_copy_plugin.ops.stop_flag_ops import StopFlagOps

    installed_replica("fd24")
    real = StopFlagOps.update_inputs_v1_host

    def planted(self, *args, **kwargs):
        real(self, *args, **kwargs)
        decoder = args[4]
        if decoder.shape[0]:
            decoder[0] = decoder[0] + 1

    monkeypatch.setattr(StopFlagOps, "update_inputs_v1_host", planted)
    report = checks.run(["host"], vocab=VOCAB, kernel_slots=300, max_num_seqs=16, cost=False)
    kernels = {c["name"]: c for c in report["checks"] if c["name"].startswith("stop_flag")}
    v1 = next(c for n, c in kernels.items() if "update_inputs_v1" in n)
    v0 = next(c for n, c in kernels.items() if "update_inputs_v1" not in n)
    assert v1["status"] == "fail" and "seq_lens_decoder differs" in v1["reason"]
    assert v0["status"] == "pass" and report["ok"] is False


def test_kernel_comparison_is_skipped_with_the_reason_when_fastdeploys_ops_are_absent(installed_replica, monkeypatch):
    root = installed_replica("fd24")
    ops = importlib.import_module(root + ".model_executor.ops.gpu")
    monkeypatch.setattr(ops, "update_inputs_v1", None)
    report = checks.run(["host"], vocab=VOCAB, cost=False)
    kernels = [c for c in report["checks"] if c["name"].startswith("stop_flag")]
    assert report["compiled_ops"] is False and report["ok"] is True
    assert [c["status"] for c in kernels] == ["skipped"]
    assert "compiled ops are not importable" in kernels[0]["reason"]


def test_cli_selftest_json_carries_versions_profile_and_every_check(installed_replica, capsys):
    from fd_async_copy_plugin.cli import selftest

    installed_replica("fd25")
    args = SimpleNamespace(steps=2, backend="host", json=True)
    assert selftest.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["environment"]["paddle"] and "python" in report["environment"]
    assert report["fastdeploy"]["profile"] == "fastdeploy-2.5" and report["fastdeploy"]["ok"]
    assert {c["status"] for c in report["fastdeploy"]["checks"]} <= {"pass", "skipped"}


def test_cli_selftest_exits_non_zero_on_a_planted_fastdeploy_mismatch(installed_replica, monkeypatch, capsys):
    from fd_async_copy_plugin.cli import selftest
    from fd_async_copy_plugin.patches import logprobs as logprobs_patch

    installed_replica("fd25")
    real = logprobs_patch.LogprobsCopier.copy
    monkeypatch.setattr(logprobs_patch.LogprobsCopier, "copy",
                        lambda self, s, i, t, r: real(self, s, i, t * np.float32(1.0) + np.float32(1e-3), r))
    assert selftest.run(SimpleNamespace(steps=2, backend="host", json=False)) == 1
    out = capsys.readouterr().out
    assert "FAIL    logprobs" in out and "result: FAIL" in out


def test_the_accessor_probe_is_reported_check_by_check(monkeypatch):
    """The wire-up point for issue 10's probe: each of its checks appears in the figures, and a
    failed one fails the selftest (a stand-in probe, since CI has no GPU)."""
    probe = SimpleNamespace(probe_accessors=lambda device: {
        "ok": False, "device": device, "reason": "Paddle's accessors disagree with the CUDA layer (data_ptr: off)",
        "checks": [{"check": "current_device", "ok": True, "detail": ""},
                   {"check": "data_ptr", "ok": False, "detail": "off"}]})
    monkeypatch.setitem(sys.modules, "fd_async_copy_plugin.runtime.probe", probe)
    result = checks.paddle_accessor_checks("cuda", "gpu")
    assert result["status"] == "fail" and "data_ptr: off" in result["reason"]
    assert result["figures"] == {"current_device": "ok", "data_ptr": "FAILED: off"}
    assert checks.paddle_accessor_checks("host", "cpu")["status"] == "skipped"


def test_a_check_that_breaks_is_a_failed_check_not_a_crash(installed_replica, monkeypatch):
    installed_replica("fd25")

    def broken(*args, **kwargs):
        raise RuntimeError("cost check broke")

    monkeypatch.setattr(checks, "run_cost_check", broken)
    report = checks.run(["host"], vocab=VOCAB, cost=True)
    assert report["ok"] is False
    assert _by_name(report)[("cost", "host")] == {
        "name": "cost", "backend": "host", "status": "fail", "reason": "RuntimeError: cost check broke", "figures": {}}
    assert not any(f["state"] == "applied" for f in fd_async_copy_plugin.status()["features"].values())
