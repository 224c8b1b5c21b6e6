"""FastDeploy profile detection from structural markers (fastdeploy-surface.md §7)."""

from __future__ import annotations

import shutil
import sys

import pytest

from fd_async_copy_plugin.profile import detect_profile, root_directory
from fd_async_copy_plugin.reference import ROOTS


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
