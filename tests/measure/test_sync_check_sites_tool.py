"""tools/sync_check_sites.py: what the sync check and the trace rely on, read by AST from an FD tree."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLICA = os.path.join(ROOT, "fd_async_copy_plugin", "testing", "reference", "fd24")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("sync_check_sites", os.path.join(ROOT, "tools", "sync_check_sites.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def by_item(rows):
    return {r["item"]: r for r in rows}


def test_the_replica_tree_has_every_hook_point(tool):
    rows = by_item(tool.check(REPLICA))
    assert rows["step hook"]["status"] == "OK"
    for phase in ("prepare", "forward launch", "logits", "sampler", "post-process", "save"):
        assert rows[f"phase {phase}"]["status"] == "OK", rows[f"phase {phase}"]
    assert rows["label S1 (get_padding_offset)"]["status"] == "OK"
    assert tool.main(["--fd-src", REPLICA]) == 0


def test_a_tree_without_execute_model_or_sampler_call_is_a_mismatch(tool, tmp_path):
    tree = tmp_path / "fd"
    shutil.copytree(REPLICA, tree)
    runner = tree / "worker" / "gpu_model_runner.py"
    text = runner.read_text()
    runner.write_text(text.replace("sampler_output = self.sampler(logits", "sampler_output = sample(logits"))
    rows = by_item(tool.check(str(tree)))
    assert rows["phase sampler"]["status"] == "MISMATCH"
    runner.write_text(text.replace("def execute_model(", "def execute_model_renamed("))
    rows = tool.check(str(tree))
    assert rows == [{"item": "step hook", "status": "MISMATCH", "detail": "GPUModelRunner does not define execute_model itself"}]
    assert tool.main(["--fd-src", str(tree)]) == 1
