"""``tools/real_fd/token_num_fd25.py`` (t25): on FastDeploy 2.5 ``step_syncs`` answers the two
``token_num_event`` reads from a host shadow, which is exact only for a particular code shape - read
from planted source trees (small snippets written here, AST only): OK where the shape holds, and each
planted break fails its own row and no other. Also: the fd25 replica, and that the 2.5 profile gets
the rows from ``check_step_syncs``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _planted_tree import plant

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from real_fd.common import Report  # noqa: E402
from real_fd.side import Side  # noqa: E402
from real_fd.step_syncs import check_step_syncs  # noqa: E402
from real_fd.token_num_fd25 import ROW_INSERT, ROW_POST, ROW_PREPARE, ROW_SNAP, ROWS, check_token_num_fd25  # noqa: E402

RUNNER = '''
import paddle
from ..model_executor.ops.gpu import recover_decode_task
from ..model_executor.pre_and_post_process import post_process


class GPUModelRunner:
    def insert_tasks_v1(self, req_dicts, num_running_requests=None):
        for request in req_dicts:
            idx = self.share_inputs.get_index_by_batch_id(request.idx)
            self.share_inputs["block_tables"][idx : idx + 1, :] = -1
            self.share_inputs["seq_lens_this_time_buffer"][idx : idx + 1] = 3
            self.share_inputs["seq_lens_encoder"][idx : idx + 1] = 3  # @enc
            self.share_inputs["step_seq_lens_decoder"][idx : idx + 1] = 0
            self.share_inputs["is_block_step"][idx : idx + 1] = False
            if self.share_inputs["is_block_step"][idx]:
                pass
        self.share_inputs["seq_lens_this_time"] = self.share_inputs["seq_lens_this_time_buffer"][:num_running_requests]

    def _prepare_inputs(self, last_token_num=-1, is_dummy_or_profile_run=False):
        recover_decode_task(self.share_inputs["stop_flags"], self.share_inputs["seq_lens_this_time"])
        self.share_inputs["seq_lens_this_time_cpu"].copy_(self.share_inputs["seq_lens_this_time"], False)  # @copy
        self.share_inputs["is_block_step_cpu"].copy_(self.share_inputs["is_block_step"], False)
        token_num_event = paddle.device.cuda.create_event()  # @create
        token_num_event.record()
        if is_dummy_or_profile_run or last_token_num <= 0:
            token_num_event.synchronize()
            token_num = self.share_inputs["seq_lens_this_time_cpu"].numpy().sum().item()  # @read
        else:
            token_num = last_token_num
        return token_num_event

    def _postprocess(self, model_output, p_done_idxs, token_num_event):
        token_num_event.synchronize()
        if not self.enable_overlap_schedule:
            token_num = -1
        else:
            token_num = (
                self.share_inputs["seq_lens_this_time_cpu"].numpy().sum().item()
                + self.share_inputs["is_block_step_cpu"].numpy().sum().item()
            )
        post_process(share_inputs=self.share_inputs)
        post_process_event = paddle.device.cuda.create_event()
        post_process_event.record()  # @record
        return None, None, post_process_event, token_num

    def _save_model_output(self, model_output_data, sampler_output, post_process_event):
        post_process_event.synchronize()  # @save
        save_output_normal(model_output_data)

    def other(self):
        pass  # @other
'''
POSTPROC = '''
from .ops.gpu import update_inputs_v1


def post_process_normal(model_output, share_inputs):
    update_inputs_v1(model_output.stop_flags, model_output.seq_lens_this_time)  # @update


def post_process(share_inputs):
    post_process_normal(None, share_inputs)
'''
INPUT_BATCH = '''
import paddle


class InputBatch:
    def init_share_inputs(self):
        self.seq_lens_this_time_cpu = paddle.full([4, 1], 0, dtype="int32").pin_memory()
        self.is_block_step_cpu = paddle.full([4], False, dtype="bool").pin_memory()
'''
FILES = {"worker/gpu_model_runner.py": RUNNER, "model_executor/pre_and_post_process.py": POSTPROC,
         "worker/input_batch.py": INPUT_BATCH, "model_executor/ops/gpu.py": "def update_inputs_v1(*a):\n    pass\n"}


def _plant(tmp_path, monkeypatch, **replace) -> str:
    return plant(tmp_path, monkeypatch, "fakefd_t25_", FILES, **replace)


def _check(name) -> dict:
    report = Report(fd_src=None)
    check_token_num_fd25(Side(name, "fake"), report, "s")
    return {row.item: (row.status, row.detail) for row in report.rows}


def test_the_planted_fd25_shape_is_ok(tmp_path, monkeypatch):
    rows = _check(_plant(tmp_path, monkeypatch))
    assert all(rows[r][0] == "OK" for r in ROWS), rows
    assert "wait + read :" in rows[ROW_PREPARE][1] and "2 read(s)" in rows[ROW_POST][1]


@pytest.mark.parametrize("planted, row", [
    # 1. _prepare_inputs
    (dict(read='token_num = int(self.share_inputs["seq_lens_this_time_cpu"].numpy()[0])'), ROW_PREPARE),
    (dict(create="token_num_event = make_event()"), ROW_PREPARE),
    (dict(copy='self.share_inputs["seq_lens_this_time_cpu"].copy_(self.share_inputs["seq_lens_this_time"], True)'),
     ROW_PREPARE),
    # 2. another reader of the pinned counts
    (dict(other='n = self.share_inputs["is_block_step_cpu"].numpy()'), ROW_POST),
    # 3. the snapshot point
    (dict(update="paddle_update(model_output.stop_flags)"), ROW_SNAP),
    (dict(save="save_output_normal(model_output_data)"), ROW_SNAP),
    # 4. an insert writing a shadowed tensor another way than by item
    (dict(enc='self.share_inputs["seq_lens_encoder"].fill_(0)'), ROW_INSERT),
])
def test_each_wrong_assumption_fails_its_own_row(tmp_path, monkeypatch, planted, row):
    rows = _check(_plant(tmp_path, monkeypatch, **planted))
    bad = sorted(r for r in ROWS if rows[r][0] != "OK")
    assert bad == [row], rows
    assert rows[row][0] == "MISMATCH"


def test_the_fd25_replica_has_the_shape_and_the_25_profile_gets_the_rows():
    report = Report(fd_src=None)
    check_step_syncs(Side("fd_async_copy_plugin.testing.reference.fd25", "replica"), report, None, replica=True)
    rows = {row.item: (row.status, row.detail) for row in report.rows if row.section == "step_syncs replica"}
    assert all(rows[r][0] == "OK" for r in ROWS), rows


def test_fd24_trees_get_no_t25_rows():
    report = Report(fd_src=None)
    check_step_syncs(Side("fd_async_copy_plugin.testing.reference.fd24", "replica"), report, None, replica=True)
    assert not any(r.item.startswith("(t25)") for r in report.rows)
