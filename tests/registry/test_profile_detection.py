"""FastDeploy profile detection from structural markers (fastdeploy-surface.md §7)."""

from __future__ import annotations

import shutil
import sys

import pytest

from fd_async_copy_plugin.profile import detect_profile, root_directory
from fd_async_copy_plugin.testing.reference import ROOTS


def test_replicas_are_detected_by_structure():
    fd24, fd25 = detect_profile(ROOTS["fd24"]), detect_profile(ROOTS["fd25"])
    assert fd24.profile == "fastdeploy-2.4" and fd24.version == "2.4.0"
    assert fd25.profile == "fastdeploy-2.5"
    assert fd24.markers["runner_init_share_inputs"] and not fd24.markers["input_batch_module"]
    assert fd25.markers["input_batch_module"] and fd25.markers["gather_logprobs_pin_memory"]


def test_detection_imports_nothing(monkeypatch):
    for name in [m for m in sys.modules if m.startswith(ROOTS["fd24"] + ".")]:
        monkeypatch.delitem(sys.modules, name)
    assert detect_profile(ROOTS["fd24"]).profile == "fastdeploy-2.4"
    assert f"{ROOTS['fd24']}.worker.gpu_model_runner" not in sys.modules


def test_absent_fastdeploy():
    info = detect_profile("no_such_fastdeploy_package")
    assert info.profile == "absent" and "not installed" in info.reason


def copy_tree(tmp_path, monkeypatch, source_root: str, name: str):
    """A copy of a replica as a top-level package ``name`` whose files a test can edit."""
    target = tmp_path / name
    shutil.copytree(root_directory(source_root), target, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))
    return target


def edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    "mutation, missing_marker",
    [
        # A 2.4 tree that grew 2.5's InputBatch module but kept the rest: neither shape.
        (lambda t: (t / "worker" / "input_batch.py").write_text("class InputBatch: ...\n"), None),
        # The version string says nothing: the same 2.4 tree relabelled 2.5 is still 2.4.
        (lambda t: edit(t / "__init__.py", '__version__ = "2.4.0"', '__version__ = "2.5.0"'), "still-2.4"),
        # A patch-point file is gone.
        (lambda t: (t / "model_executor" / "layers" / "sample" / "sampler.py").unlink(), None),
    ],
    ids=["input-batch-added", "version-string-lies", "sampler-missing"],
)
def test_unknown_shapes_are_unknown_and_versions_do_not_decide(tmp_path, monkeypatch, mutation, missing_marker):
    tree = copy_tree(tmp_path, monkeypatch, ROOTS["fd24"], f"fdcopy_{abs(hash(str(tmp_path)))}")
    mutation(tree)
    info = detect_profile(tree.name)
    if missing_marker == "still-2.4":
        assert info.profile == "fastdeploy-2.4" and info.version == "2.5.0"
    else:
        assert info.profile == "unknown", info
        assert info.reason


def test_string_not_need_stop_device_in_a_24_tree_does_not_make_it_25(tmp_path, monkeypatch):
    """FD 2.4's reset_share_inputs already names not_need_stop_device: grepping for it would lie."""
    tree = copy_tree(tmp_path, monkeypatch, ROOTS["fd24"], f"fdcopy_nnsd_{abs(hash(str(tmp_path)))}")
    runner = tree / "worker" / "gpu_model_runner.py"
    assert "not_need_stop_device" in runner.read_text()
    assert detect_profile(tree.name).profile == "fastdeploy-2.4"


# ---- issue 13 defect 9: hostile FastDeploy source trees ---------------------------------------

import ast  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from fd_async_copy_plugin import profile as profile_module  # noqa: E402

SAMPLER_PY = os.path.join("model_executor", "layers", "sample", "sampler.py")


def _detect_within(name: str, seconds: float):
    """detect_profile in a thread; fails (instead of hanging the suite) when it does not return."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("info", detect_profile(name)), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert "info" in result, f"detection did not return within {seconds}s"
    return result["info"], time.monotonic() - started


def test_a_fifo_named_like_a_source_file_does_not_hang_detection(tmp_path, monkeypatch):
    tree = copy_tree(tmp_path, monkeypatch, ROOTS["fd24"], f"fdfifo_{abs(hash(str(tmp_path)))}")
    fifo = tree / SAMPLER_PY
    fifo.unlink()
    os.mkfifo(fifo)
    try:
        info, _ = _detect_within(tree.name, 5)
    finally:
        try:  # release a reader stuck on the FIFO (the defect), so no thread is left blocked
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert info.profile == "unknown"
    assert "sampler.py: not a regular file" in info.reason, info.reason


@pytest.mark.parametrize(
    "content, cause",
    [
        (b"x = " + b"-" * 200000 + b"1\n", "too deeply nested"),  # MemoryError in the parser
        (b"def broken(:\n", "syntax error at line 1"),
        (b"x = '\xff\xfe'\n", "invalid UTF-8"),
    ],
    ids=["deep-nesting", "syntax-error", "invalid-utf8"],
)
def test_unusable_source_files_report_the_real_cause(tmp_path, monkeypatch, content, cause):
    tree = copy_tree(tmp_path, monkeypatch, ROOTS["fd24"], f"fdbad_{abs(hash(str(tmp_path)))}")
    (tree / SAMPLER_PY).write_bytes(content)
    info, _ = _detect_within(tree.name, 20)
    assert info.profile == "unknown"
    assert cause in info.reason and "not found" not in info.reason, info.reason


def test_a_huge_source_file_is_refused_quickly(tmp_path, monkeypatch):
    tree = copy_tree(tmp_path, monkeypatch, ROOTS["fd24"], f"fdhuge_{abs(hash(str(tmp_path)))}")
    path = tree / SAMPLER_PY
    path.write_text(path.read_text() + "\n" + "x = 1\n" * (profile_module.MAX_SOURCE_BYTES // 6 + 10))
    info, seconds = _detect_within(tree.name, 20)
    assert info.profile == "unknown" and "too large" in info.reason, info.reason
    assert seconds < 2.0, seconds


def test_detection_keeps_markers_not_syntax_trees(tmp_path, monkeypatch):
    tree = copy_tree(tmp_path, monkeypatch, ROOTS["fd24"], f"fdkeep_{abs(hash(str(tmp_path)))}")
    path = tree / SAMPLER_PY
    path.write_text(path.read_text() + "\n\nclass ProbeClassOnlyInThisTree:\n    pass\n")
    assert detect_profile(tree.name).profile == "fastdeploy-2.4"
    gc.collect()
    kept = [o for o in gc.get_objects() if isinstance(o, ast.ClassDef) and o.name == "ProbeClassOnlyInThisTree"]
    assert not kept, "a parsed syntax tree of the FastDeploy sources stayed alive after detection"


def test_a_duplicated_class_is_read_from_the_definition_python_binds(tmp_path, monkeypatch):
    """Python binds the last ``class GPUModelRunner``; reading the first one would call this 2.4."""
    tree = copy_tree(tmp_path, monkeypatch, ROOTS["fd24"], f"fddup_{abs(hash(str(tmp_path)))}")
    runner = tree / "worker" / "gpu_model_runner.py"
    runner.write_text(
        runner.read_text()
        + "\n\nclass GPUModelRunner:\n    def _init_share_inputs(self):\n        pass\n\n"
        "    def execute_model_overlap(self):\n        pass\n\n    def not_need_stop(self):\n        pass\n"
    )
    info = detect_profile(tree.name)
    assert info.markers["runner_execute_model_overlap"] is True
    assert info.profile == "unknown", info


def test_detection_stops_at_its_time_budget(tmp_path, monkeypatch):
    tree = copy_tree(tmp_path, monkeypatch, ROOTS["fd24"], f"fdslow_{abs(hash(str(tmp_path)))}")
    monkeypatch.setattr(profile_module, "TIME_BUDGET_S", 0.0)
    info = detect_profile(tree.name)
    assert info.profile == "unknown" and "time budget" in info.reason, info.reason
