"""``tools/real_fd/tensor_parallel.py``, rows (t): the rank rules of FastDeploy's worker loop and save
ops that the replica's TP loop (``reference/tp.py``) follows, read by AST. OK on a planted tree of
FastDeploy's shape, each row MISMATCH where its rule is broken, and (with the real trees at
``$FD24_SRC``/``$FD25_SRC``/``$FD_DEV_SRC``, default ``/tmp/fd/...``; CI has none: skipped) OK on
FastDeploy 2.4, 2.5 and develop."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from real_fd.common import Report  # noqa: E402
from real_fd.side import Side  # noqa: E402
from real_fd.tensor_parallel import check_tensor_parallel  # noqa: E402

ROWS = ("(t1) rank 0 alone asks the queue", "(t2) every rank meets at the barrier before reading",
        "(t3) every rank reads and inserts the tasks", "(t4) idle: barrier and continue",
        "(t5) _tp_barrier_wait is the tp group's barrier", "(t6) saves and the ZMQ payload on rank 0",
        "(t7) save ops return on ranks > 0", "(t8) the replica's rank loop follows FastDeploy's order")

WORKER = '''
import paddle
class Proc:
    def _tp_barrier_wait(self):
        paddle.distributed.barrier({group})
    def event_loop_normal(self):
        while True:
            {pre}
            if tp_rank == 0:
                if {ask}:
                    self.exist_task_signal.value[0] = 1
            {barrier1}
            if self.exist_task_signal.value[0] == 1{read_guard}:
                tasks, read_finish = self.task_queue.get_tasks()
                self.worker.preprocess_new_task(tasks, 1)
            if not self.worker.model_runner.not_need_stop():
                {idle}
                continue
            self.worker.execute_model(None, 1)
            self.exist_prefill_task_signal.value[0] = self.worker.exist_prefill()
'''
POSTPROC = '''
def post_process_normal(sampler_output, model_output, save_each_rank=False):
    if save_each_rank or model_output.mp_rank == 0:
        out = _build_stream_transfer_data(1)
    save_output(1, model_output.not_need_stop, {rank}, save_each_rank)
    save_output_topk(1, 2, 3, 4, model_output.not_need_stop, model_output.mp_rank)
'''
RUNNER = '''
class GPUModelRunner:
    def _build(self):
        return ModelOutputData(mp_rank=self.parallel_config.tensor_parallel_rank)
'''
OP = "void f(int64_t rank_id) {{\n  {check}\n}}\n"

GOOD = dict(pre="pass", group="self.parallel_config.tp_group", ask="self.task_queue.num_tasks() > 0",
            barrier1="self._tp_barrier_wait()", read_guard="", idle="self._tp_barrier_wait()",
            rank="model_output.mp_rank", check="if (rank_id > 0) { return; }")


def _tree(tmp_path, name, **planted):
    values = dict(GOOD, **planted)
    root = tmp_path / name
    files = {f"{name}/worker/worker_process.py": WORKER.format(**values),
             f"{name}/model_executor/pre_and_post_process.py": POSTPROC.format(**values),
             f"{name}/worker/gpu_model_runner.py": RUNNER,
             "custom_ops/gpu_ops/save_with_output_msg.cc": OP.format(**values),
             "custom_ops/gpu_ops/save_output_msg_with_topk.cc": OP.format(**GOOD)}
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for folder in (root / name, root / name / "worker", root / name / "model_executor"):
        (folder / "__init__.py").touch()
    return root


def _rows(report):
    return {row.item: row.status for row in report.rows if row.section == "tensor parallel"}


@pytest.mark.parametrize("planted, item", [
    (dict(), None),
    (dict(pre="if self.task_queue.num_tasks() > 0: self.exist_task_signal.value[0] = 1"),
     "(t1) rank 0 alone asks the queue"),
    (dict(barrier1="pass"), "(t2) every rank meets at the barrier before reading"),
    (dict(read_guard=" and tp_rank == 0"), "(t3) every rank reads and inserts the tasks"),
    (dict(idle="pass"), "(t4) idle: barrier and continue"),
    (dict(group="None"), "(t5) _tp_barrier_wait is the tp group's barrier"),
    (dict(rank="0"), "(t6) saves and the ZMQ payload on rank 0"),
    (dict(check="return;"), "(t7) save ops return on ranks > 0"),
])
def test_each_row_fails_where_its_rule_does_not_hold(tmp_path, monkeypatch, planted, item):
    name = f"fakefd_tp_{abs(hash(item)) % 10000}"
    root = _tree(tmp_path, name, **planted)
    monkeypatch.syspath_prepend(str(root))
    report = Report(fd_src=str(root))
    check_tensor_parallel(Side(name, "fake"), report, str(root))
    rows = _rows(report)
    bad = sorted(k for k, v in rows.items() if v == "MISMATCH")
    expected = [] if item is None else [item]
    if item in ("(t2) every rank meets at the barrier before reading", "(t4) idle: barrier and continue"):
        expected.append("(t8) the replica's rank loop follows FastDeploy's order")  # FD's order changed too
    assert bad == sorted(expected), rows
    assert set(rows) == {"source", *ROWS}, rows


def test_the_replica_loop_is_compared_in_order(tmp_path, monkeypatch):
    """A FastDeploy loop that inserts before the barrier is not the replica's order: (t8) says so."""
    name = "fakefd_tp_order"
    root = _tree(tmp_path, name)
    path = root / name / "worker" / "worker_process.py"
    text = path.read_text().replace("            self._tp_barrier_wait()\n            if self.exist",
                                    "            self.worker.preprocess_new_task([], 0)\n"
                                    "            self._tp_barrier_wait()\n            if self.exist")
    path.write_text(text)
    monkeypatch.syspath_prepend(str(root))
    report = Report(fd_src=str(root))
    check_tensor_parallel(Side(name, "fake"), report, str(root))
    assert _rows(report)["(t8) the replica's rank loop follows FastDeploy's order"] == "MISMATCH"


TREES = {"fd24": os.environ.get("FD24_SRC", "/tmp/fd/fd24"), "fd25": os.environ.get("FD25_SRC", "/tmp/fd/fd25"),
         "fddev": os.environ.get("FD_DEV_SRC", "/tmp/fd/fddev")}


@pytest.mark.parametrize("tree", sorted(TREES))
def test_the_real_trees_pass_every_row(tree):
    src = TREES[tree]
    if not os.path.isfile(os.path.join(src, "fastdeploy", "worker", "worker_process.py")):
        pytest.skip(f"no FastDeploy checkout at {src}")
    import subprocess

    code = ("import sys; sys.path[:0] = [%r, %r]\n"
            "from real_fd.common import Report\nfrom real_fd.side import Side\n"
            "from real_fd.tensor_parallel import check_tensor_parallel\n"
            "r = Report(fd_src=%r); check_tensor_parallel(Side('fastdeploy', 'FastDeploy'), r, %r)\n"
            "print([(x.item, x.status, x.detail) for x in r.rows if x.status not in ('OK', 'INFO')])"
            % (src, str(REPO / "tools"), src, src))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-3000:]
