"""``tools/real_fd/overlap.py``, the check of the FD 2.4 code shapes ``overlap`` relies on: OK on the
replica, and each check fails on a tree where the shape does not hold (it reads source by AST)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from real_fd.common import Report  # noqa: E402
from real_fd.overlap import SAVE_OPS, check_overlap  # noqa: E402
from real_fd.side import Side  # noqa: E402


def _rows(report, section="overlap replica"):
    return {row.item: row.status for row in report.rows if row.section == section}


def test_the_tool_and_the_patch_agree_on_the_flag_positions():
    from fd_async_copy_plugin.patches.fd24 import overlap

    assert SAVE_OPS == overlap.SAVE_OPS


def test_replica_has_every_shape():
    report = Report(fd_src=None)
    check_overlap(Side("fd_async_copy_plugin.testing.reference.fd24", "replica"), report, None, replica=True)
    rows = _rows(report)
    assert [rows[k] for k in ("(a) hook after the forward", "(a) no not_need_stop() before the forward",
                              "(b) save_output", "(b) save_output_topk")] == ["OK"] * 4, rows
    assert rows["(c) worker loop"] == "SKIP"


RUNNER = '''
class GPUModelRunner:
    def _prepare_inputs(self):
        {early}
    def not_need_stop(self):
        return True
    def execute_model(self, batch=None, n=None):
        self._prepare_inputs()
        out = self.model(1)
        if not self.not_need_stop():
            return None
        s = self.sampler(out)
        post_process(s)
'''
POSTPROC = '''
from .ops import save_output, save_output_topk
def post_process(s, not_need_stop=None):
    save_output(s, {flag}, 0, False)
    save_output_topk(s, 1, 2, 3, not_need_stop, 0)
'''
WORKER = '''
from fakefd.inter_communicator import EngineWorkerQueue as TaskQueue
class Proc:
    def __init__(self):
        self.task_queue = TaskQueue()
    def event_loop_normal(self):
        while True:
            {loop}
'''
LOOP_OK = "tasks = self.task_queue.get_tasks(); self.worker.preprocess_new_task(tasks); " \
          "self.worker.model_runner.not_need_stop(); self.worker.execute_model(tasks)"


def _tree(tmp_path, name, early="pass", flag="model_output.not_need_stop", loop=LOOP_OK):
    root = tmp_path / name
    for sub, text in {"worker/gpu_model_runner.py": RUNNER.format(early=early),
                      "model_executor/pre_and_post_process.py": POSTPROC.format(flag=flag),
                      "worker/worker_process.py": WORKER.format(loop=loop),
                      "inter_communicator/engine_worker_queue.py": "class EngineWorkerQueue:\n    def get_tasks(self):\n        return []\n"}.items():
        path = root / sub
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for folder in (root, root / "worker", root / "model_executor", root / "inter_communicator"):
        (folder / "__init__.py").touch()
    return name


@pytest.mark.parametrize("planted, item", [
    (dict(), None),
    (dict(early="self.not_need_stop()"), "(a) no not_need_stop() before the forward"),
    (dict(flag="True"), "(b) save_output"),
    (dict(loop="self.worker.preprocess_new_task([]); tasks = self.task_queue.get_tasks(); "
               "self.worker.model_runner.not_need_stop(); self.worker.execute_model(tasks)"),
     "(c) get_tasks, then insert, gate, execute"),
])
def test_each_shape_check_fails_where_the_shape_does_not_hold(tmp_path, monkeypatch, planted, item):
    name = _tree(tmp_path, f"fakefd_{uuid.uuid4().hex}", **planted)  # a name no earlier case imported
    monkeypatch.syspath_prepend(str(tmp_path))
    report = Report(fd_src=None)
    check_overlap(Side(name, "fake"), report, "fastdeploy-2.4")
    rows = _rows(report, "overlap")
    bad = sorted(k for k, v in rows.items() if v == "MISMATCH")
    assert bad == ([] if item is None else [item]), rows
