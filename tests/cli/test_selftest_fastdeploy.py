"""``fd-async-copy selftest`` against an installed FastDeploy (``fd_async_copy_plugin/testing/selftest_fd``).

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
import types
from types import SimpleNamespace

import numpy as np
import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.selftest_fd import checks, kernel_compare

VOCAB = 64  # small logits keep the checks fast; widths are still 0, 1, 20 and the whole vocabulary


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``fastdeploy.X`` as the replica's ``<root>.X`` (the very same module objects)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.aliased: list = []  # (module, its own __spec__): the import system overwrites __spec__


    def find_spec(self, name, path=None, target=None):
        if name == "fastdeploy" or name.startswith("fastdeploy."):
            real = self.target + name[len("fastdeploy"):]
            if importlib.util.find_spec(real) is None:
                return None
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(self.target + spec.name[len("fastdeploy"):])
        self.aliased.append((module, module.__spec__))
        return module

    def restore(self) -> None:
        """Give the replica's modules back their own ``__spec__`` (``importlib.reload`` needs it)."""
        for module, spec in reversed(self.aliased):
            module.__spec__ = spec

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
        finder.restore()
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
    accessors = found[(checks.ACCESSOR_CHECK, "host")]
    assert accessors["status"] == "skipped"  # no probe in this build, or (issue 10 merged) no CUDA device
    assert accessors["reason"].startswith(("not available in this build", "needs a CUDA"))
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


def test_kernel_comparison_is_skipped_when_the_plugins_ops_do_not_load(installed_replica, monkeypatch):
    """Not built is untested, not a mismatch: ``--allow-skip`` can accept it (the replica runs name
    ``stop_flag`` skipped for the same reason)."""
    import fd_async_copy_plugin.ops as ops
    from fd_async_copy_plugin.ops import OpsUnavailable

    installed_replica("fd24")

    def unavailable(*args, **kwargs):
        raise OpsUnavailable("custom ops unavailable: not built")

    monkeypatch.setattr(ops, "load_ops", unavailable)
    report = checks.run(["host"], vocab=VOCAB, cost=False)
    kernels = [c for c in report["checks"] if c["name"].startswith("stop_flag")]
    assert [c["status"] for c in kernels] == ["skipped"] and report["ok"] is True
    assert "the plugin's custom ops do not load" in kernels[0]["reason"] and "build-ops" in kernels[0]["reason"]


def test_the_result_line_names_what_was_not_checked_against_fastdeploy(installed_replica, monkeypatch, capsys):
    from fd_async_copy_plugin.cli import selftest

    installed_replica("fd24")
    real_import = checks.import_fastdeploy

    def without_compiled_ops(root="fastdeploy"):  # the replica's ops stay (its decode runs use them)
        return dict(real_import(root), compiled_ops=False, ops_reason="no update_inputs_v1 (a CPU machine)")

    monkeypatch.setattr(checks, "import_fastdeploy", without_compiled_ops)
    monkeypatch.setitem(sys.modules, checks.PROBE_MODULE, None)
    assert selftest.run(SimpleNamespace(steps=2, backend="host", json=False)) == 0
    out = capsys.readouterr().out
    (result,) = [line for line in out.splitlines() if line.startswith("  result:")]
    assert result.startswith("  result: PASS; skipped against FastDeploy: paddle accessors, stop_flag, sync_scope")
    assert "(reasons above)" in out and "compiled ops are not importable" in out
    assert all(len(line) <= 100 for line in out.splitlines())


def test_without_fastdeploy_the_result_line_says_only_the_replica_was_checked():
    from fd_async_copy_plugin.cli.selftest import result_line

    report = {"ok": True, "skipped": {}, "allow_skip": False, "seconds": 1.0,
              "fastdeploy": checks.run(["host"])}
    assert result_line(report) == "  result: PASS; reference replica only (no FastDeploy installed) (1.0 s)"
    report["fastdeploy"] = {"present": True, "checks": [{"name": "logprobs", "status": "pass"}]}
    assert result_line(report) == "  result: PASS (1.0 s)"


def test_a_fastdeploy_the_plugin_leaves_alone_is_named_untested_not_compared_with_itself(
        installed_replica, monkeypatch, capsys):
    """FastDeploy's gather_logprobs is not the body the plugin reproduces (issue 13's identity check):
    logprobs is ``incompatible`` there, FastDeploy runs unpatched - correct, but nothing was tested.
    The logprobs checks are skipped (no FastDeploy-vs-FastDeploy "pass"), the feature is named on the
    result line, and the run fails unless --allow-skip."""
    from fd_async_copy_plugin import fd_identity
    from fd_async_copy_plugin.cli import selftest

    installed_replica("fd25")
    real_run = checks.run

    real_check = fd_identity.check

    def modified_gather(name, *rest):  # only gather_logprobs differs (slice_rows is FastDeploy's)
        if name == "Sampler.gather_logprobs.maths":
            return "Sampler.gather_logprobs.maths has digest 0123 (modified)"
        return real_check(name, *rest)

    def run_on_a_modified_fastdeploy(*args, **kwargs):  # the replica runs before keep their real body
        with monkeypatch.context() as m:
            m.setattr(fd_identity, "check", modified_gather)
            return real_run(*args, **kwargs)

    monkeypatch.setattr(checks, "run", run_on_a_modified_fastdeploy)
    report = checks.run(["host"], vocab=VOCAB, cost=True)
    found = _by_name(report)
    for name in ("logprobs", "prompt logprobs", "cost"):
        assert found[(name, "host")]["status"] == "skipped", found[(name, "host")]
        assert "logprobs is incompatible on this FastDeploy" in found[(name, "host")]["reason"]
        assert "digest 0123 (modified)" in found[(name, "host")]["reason"]
    assert report["ok"] is True and list(report["untested"]) == ["logprobs"]
    assert found[("sync_scope", "host")]["status"] == "pass"  # applied beside it: still checked

    assert selftest.run(SimpleNamespace(steps=2, backend="host", json=False)) == 1
    out = capsys.readouterr().out
    (result,) = [line for line in out.splitlines() if line.startswith("  result:")]
    assert result.startswith("  result: FAIL: not tested: logprobs (installed FastDeploy)"), result
    # named as not run here, but not untested: stop_flag is native on 2.5, this build has no probe
    assert "skipped against FastDeploy: paddle accessors, stop_flag (reasons above)" in " ".join(out.split())
    assert selftest.run(SimpleNamespace(steps=2, backend="host", json=False, allow_skip=True)) == 0
    assert "result: PASS with logprobs (installed FastDeploy) skipped (--allow-skip)" in capsys.readouterr().out


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


# What the ``cuda`` branch's ``runtime.probe.probe_accessors`` returned (commit 07ccf1b5, run on CPU
# Paddle over its HostRuntime with the CPU-as-GPU glue of its tests/runtime/test_accessor_probe.py):
# agreeing accessors with the host stop-flag library, and a data_ptr off by 8 bytes without kernels.
CUDA_PROBE_PASS = {
    "ok": True, "device": 0, "runtime": "host memory (no CUDA)", "reason": "", "seconds": 0.014163,
    "checks": [
        {"check": "current_device", "ok": True,
         "detail": "framework current device 0, CUDA current device 0, probed gpu:0"},
        {"check": "data_ptr", "ok": True, "detail": "data_ptr() 0x563427518000 (host memory): copying 2048 bytes "
         "from it gives the tensor's values: True"},
        {"check": "stream_order", "ok": True, "detail": "a copy on the reported stream after a framework op sees "
         "that op's result: True (first values [7, 7, 7, 7])"},
        {"check": "pinned_wrap", "ok": True, "detail": "wrap at the pinned address, reads back through the "
         "framework; reshaped in place: True"},
        {"check": "kernel_order", "ok": True, "detail": "kernel on the reported stream read the framework op's "
         "value: input_ids[0]=4242 (expected 4242), not_need_stop=False (expected False)"},
    ],
}
_DATA_PTR_OFF = "data_ptr() 0x563428bd2008 (host memory): copying 2048 bytes from it gives the tensor's values: False"
_STREAM_OFF = ("a copy on the reported stream after a framework op sees that op's result: False "
               "(first values [7, 7, 7, 7])")
CUDA_PROBE_FAIL = {
    "ok": False, "device": 0, "runtime": "host memory (no CUDA)", "seconds": 0.001021,
    "reason": ("Paddle's accessors disagree with the CUDA layer "
               f"(data_ptr: {_DATA_PTR_OFF}; stream_order: {_STREAM_OFF})"),
    "checks": [
        CUDA_PROBE_PASS["checks"][0],
        {"check": "data_ptr", "ok": False, "detail": _DATA_PTR_OFF},
        {"check": "stream_order", "ok": False, "detail": _STREAM_OFF},
        CUDA_PROBE_PASS["checks"][3],
    ],
}


@pytest.fixture
def stand_in_probe(monkeypatch):
    """``stand_in_probe(result)``: ``runtime.probe`` answers ``result`` (or raises it); records the calls."""
    calls = []

    def install(result):
        module = types.ModuleType(checks.PROBE_MODULE)

        def probe_accessors(device, glue=None, rt=None, ops=None, kernels=None):  # the cuda branch's signature
            calls.append({"device": device, "kernels": kernels})
            if isinstance(result, Exception):
                raise result
            return result

        module.probe_accessors = probe_accessors
        monkeypatch.setitem(sys.modules, checks.PROBE_MODULE, module)
        return calls

    return install


def _formatted(check: dict) -> list[str]:
    from fd_async_copy_plugin.cli.selftest import _wrapped

    report = {"present": True, "root": "fastdeploy", "fastdeploy_version": "2.4.0", "profile": "fastdeploy-2.4",
              "location": "/x", "device": "gpu", "compiled_ops": True, "ops_reason": "", "checks": [check]}
    return _wrapped(checks.format_lines(report))


def test_the_accessor_probe_is_skipped_with_the_reason_when_this_build_has_none(monkeypatch, installed_replica):
    monkeypatch.setitem(sys.modules, checks.PROBE_MODULE, None)  # absent, before and after issue 10 is merged
    for device in ("gpu", "cpu"):
        result = checks.paddle_accessor_checks("cuda", device)
        assert result["status"] == "skipped", result
        assert result["reason"].startswith("not available in this build (no fd_async_copy_plugin.runtime.probe")
    installed_replica("fd25")  # and so in a whole run, which stays ok
    report = checks.run(["host"], vocab=VOCAB, cost=False)
    accessors = _by_name(report)[(checks.ACCESSOR_CHECK, "host")]
    assert accessors["status"] == "skipped" and "not available in this build" in accessors["reason"]
    assert report["ok"] and any("skipped paddle accessors" in line for line in checks.format_lines(report))


def test_the_accessor_probe_is_skipped_without_a_cuda_device(stand_in_probe):
    calls = stand_in_probe(CUDA_PROBE_PASS)
    result = checks.paddle_accessor_checks("host", "cpu")
    assert result["status"] == "skipped" and result["reason"].startswith("needs a CUDA device")
    assert calls == []  # never called on CPU


def test_the_accessor_probe_result_is_reported_check_by_check(stand_in_probe, monkeypatch):
    """The wire-up point for issue 10's probe, on results of the cuda branch's probe: every check with
    its detail in the figures and on its own line; a failed one fails the selftest."""
    library = object()
    monkeypatch.setattr(checks, "_cuda_stop_flag_library", lambda: library)
    calls = stand_in_probe(CUDA_PROBE_PASS)
    result = checks.paddle_accessor_checks("cuda", "gpu")
    assert calls == [{"device": 0, "kernels": library}]  # the CUDA stop-flag library: kernel_order is probed
    assert result["status"] == "pass" and result["reason"] == ""
    figures = result["figures"]
    assert figures["with_kernels"] is True and figures["device"] == 0 and figures["seconds"] == 0.014163
    assert [c["check"] for c in figures["checks"]] == ["current_device", "data_ptr", "stream_order", "pinned_wrap",
                                                       "kernel_order"]
    assert json.loads(json.dumps(result)) == result  # --json carries it as is
    lines = _formatted(result)
    assert "  [cuda] ok      paddle accessors (startup probe of the CUDA layer)" in lines
    assert any(line.strip().startswith("kernel_order: ok (kernel on the reported stream") for line in lines)
    assert all(len(line) <= 100 for line in lines)

    monkeypatch.setattr(checks, "_cuda_stop_flag_library", lambda: None)
    stand_in_probe(CUDA_PROBE_FAIL)
    result = checks.paddle_accessor_checks("cuda", "gpu")
    assert result["status"] == "fail" and result["reason"] == CUDA_PROBE_FAIL["reason"]
    assert result["figures"]["with_kernels"] is False
    assert [(c["check"], c["ok"]) for c in result["figures"]["checks"]] == [
        ("current_device", True), ("data_ptr", False), ("stream_order", False), ("pinned_wrap", True)]
    text = "\n".join(_formatted(result))
    assert "FAIL    paddle accessors" in text and "no kernel_order" in text
    assert "data_ptr: FAILED (data_ptr() 0x563428bd2008" in text and "stream_order: FAILED" in text
    assert text.count("Paddle's accessors disagree") == 0  # the failed checks are listed once, not repeated


def test_an_accessor_probe_that_raises_or_answers_nonsense_is_a_failed_check(stand_in_probe, monkeypatch):
    monkeypatch.setattr(checks, "_cuda_stop_flag_library", lambda: None)
    stand_in_probe(RuntimeError("cudaGetDevice failed"))
    result = checks.paddle_accessor_checks("cuda", "gpu")
    assert result["status"] == "fail" and result["reason"] == "the probe raised RuntimeError: cudaGetDevice failed"
    for nonsense in (None, {"ok": True}, {"ok": True, "checks": []}, {"ok": True, "checks": [{"check": "x"}]}):
        stand_in_probe(nonsense)
        result = checks.paddle_accessor_checks("cuda", "gpu")
        assert result["status"] == "fail" and result["reason"].startswith("the probe returned no checks"), nonsense
    stand_in_probe(dict(CUDA_PROBE_PASS, ok=False, reason=""))  # ok False with every check ok: still a fail
    assert checks.paddle_accessor_checks("cuda", "gpu")["status"] == "fail"


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
