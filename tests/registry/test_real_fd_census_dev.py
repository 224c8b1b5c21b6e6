"""``tools/real_fd/census_dev.py`` (dev): the ``fddev-*`` census rows (two host waits per plain decode
step) hold for FastDeploy develop only for a particular code shape - read from planted source trees
(small snippets written here, AST only): OK where the shape holds, and each planted break fails its
own row and no other. Also: the fddev replica has the shape, and (when a develop checkout is at
``$FD_DEV_SRC``, default ``/tmp/fd/fddev``; CI has none: skipped) so does the real tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _planted_tree import plant

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from real_fd.census_dev import (  # noqa: E402
    ROW_COPY, ROW_DEFAULT, ROW_INSERT, ROW_SEED, ROW_SHAPE, ROW_WAITS, ROW_ZMQ, ROWS, check_census_dev,
)
from real_fd.common import Report  # noqa: E402
from real_fd.side import Side  # noqa: E402

RUNNER = '''
import paddle


class GPUModelRunner:
    def __init__(self, fd_config):
        self.infer_seed_increment = paddle.full(shape=[4, 1], fill_value=4, dtype="int64")  # @inc

    def insert_tasks_v1(self, req_dicts, num_running_requests=None):
        for request in req_dicts:
            idx = request.idx
            async_set_value(self.share_inputs["block_tables"][idx : idx + 1, :], -1)
            pass  # @insert

    def _resolve_current_launch_token_num(self, cached_token_num, cached_real_bsz, token_num_event, dummy):
        if dummy or (not self.enable_overlap_schedule) or self.exist_prefill() or cached_token_num <= 0:
            token_num_event.synchronize()
            seq_lens_this_time_cpu = self.share_inputs["seq_lens_this_time_cpu"].numpy()
            return seq_lens_this_time_cpu.sum().item(), (seq_lens_this_time_cpu > 0).sum().item()
        return cached_token_num, cached_real_bsz

    def _predict_next_launch_token_num(self):
        is_block_step_cpu = self.share_inputs["is_block_step_cpu"].numpy()
        return (is_block_step_cpu > 0).sum().item(), 1

    def _prepare_inputs(self, cached_token_num=-1, cached_real_bsz=-1, is_dummy_or_profile_run=False):
        self.share_inputs["seq_lens_this_time_cpu"].copy_(self.share_inputs["seq_lens_this_time"], False)
        token_num_event = paddle.device.cuda.create_event()
        token_num_event.record()
        token_num, real_bsz = self._resolve_current_launch_token_num(cached_token_num, cached_real_bsz,
                                                                     token_num_event, is_dummy_or_profile_run)
        pass  # @prepare
        return token_num, token_num_event

    def _preprocess(self, model_forward_batch=None, num_running_requests=None, cached_token_num=-1,
                    cached_real_bsz=-1):
        token_num, token_num_event = self._prepare_inputs(cached_token_num, cached_real_bsz)
        return {}, [], token_num_event

    def _execute(self, model_inputs):
        return None

    def execute_model_normal(self, model_forward_batch=None, num_running_requests=None):
        model_inputs, p_done_idxs, _ = self._preprocess(model_forward_batch, num_running_requests)
        model_output = self._execute(model_inputs)
        real_bsz = (self.share_inputs["seq_lens_this_time_cpu"].numpy() > 0).sum().item()
        model_output_data, sampler_output, post_process_event = self._postprocess(model_output, p_done_idxs)
        post_process_event.synchronize()  # @normal_wait
        self._save_model_output(model_output_data, sampler_output)

    def execute_model_overlap(self, model_forward_batch=None, num_running_requests=None):
        model_inputs, p_done_idxs, token_num_event = self._preprocess(model_forward_batch, num_running_requests)
        model_output = self._execute(model_inputs)
        if self._cached_model_output_data is not None:
            self._cached_post_process_event.synchronize()
            self._save_model_output(self._cached_model_output_data, self._cached_sampler_output)
        token_num_event.synchronize()
        next_launch_token_num, next_real_bsz = self._predict_next_launch_token_num()

    def _postprocess(self, model_output, p_done_idxs, model_forward_batch=None, num_running_requests=None,
                     real_bsz=0):
        if self.speculative_decoding:
            self.output_token_num_event.synchronize()
        post_process_event = paddle.device.cuda.create_event()
        self.share_inputs["sampled_token_ids"].copy_(sampler_output.sampled_token_ids, False)  # @copy
        post_process_event.record()
        pass  # @post
        return None, None, post_process_event

    def _save_model_output(self, model_output_data, sampler_output):
        save_output_normal(model_output=model_output_data, sampler_output=sampler_output)
'''
POSTPROC = '''
from fastdeploy import envs


def save_output_normal(model_output, sampler_output, share_inputs, async_output_queue=None, save_each_rank=False):
    if envs.FD_USE_GET_SAVE_OUTPUT_V1:
        recover_share_inputs_map = recover_batch_index_for_output(share_inputs, None, False, ["sampled_token_ids"])
        output = _build_stream_transfer_data(recover_share_inputs_map["sampled_token_ids"])  # @zmq
        async_output_queue.put(output)
    else:
        save_output(share_inputs["sampled_token_ids"], model_output.not_need_stop)
'''
INPUT_BATCH = '''
import paddle


class InputBatch:
    def init_share_inputs(self):
        self.infer_seed = paddle.full([4, 1], 0, dtype="int64")  # @seed
        self.sampled_token_ids = paddle.full([4, 1], -1, dtype="int64").pin_memory()
'''
ENGINE_ARGS = '''
from dataclasses import dataclass


@dataclass
class EngineArgs:
    enable_overlap_schedule: bool = True  # @default
'''
FILES = {"worker/gpu_model_runner.py": RUNNER, "model_executor/pre_and_post_process.py": POSTPROC,
         "worker/input_batch.py": INPUT_BATCH, "engine/args_utils.py": ENGINE_ARGS}


def _check(name) -> dict:
    report = Report(fd_src=None)
    check_census_dev(Side(name, "fake"), report, "fastdeploy-2.6+")
    return {row.item: (row.status, row.detail) for row in report.rows}


def test_the_planted_develop_shape_is_ok(tmp_path, monkeypatch):
    rows = _check(plant(tmp_path, monkeypatch, "fakefd_dev_", FILES))
    assert all(rows[r][0] == "OK" for r in ROWS), rows
    assert "post_process_event" in rows[ROW_WAITS][1] and "token_num_event" in rows[ROW_WAITS][1]


@pytest.mark.parametrize("planted, row", [
    # 1. 2.5's shape: a not_need_stop() method
    (dict(post="pass\n\n    def not_need_stop(self):\n        return True"), ROW_SHAPE),
    # 2. another wait (T-like: the host reads a device tensor) and a missing one
    (dict(prepare='n = self.share_inputs["seq_lens_this_time"].numpy()'), ROW_WAITS),
    (dict(normal_wait="pass"), ROW_WAITS),
    (dict(post="paddle.device.synchronize()"), ROW_WAITS),
    # 3. the seed back on the host (2.5)
    (dict(seed='self.infer_seed = paddle.full([4, 1], 0, dtype="int64").cpu()'), ROW_SEED),
    (dict(inc='self.infer_seed_increment = paddle.full(shape=[4, 1], fill_value=4, dtype="int64").cpu()'), ROW_SEED),
    # 4. I1: an insert reading the block-step flag
    (dict(insert='if self.share_inputs["is_block_step"][idx]:\n                pass'), ROW_INSERT),
    # 5. 2.5's ZMQ path: the device sampled ids
    (dict(zmq="output = _build_stream_transfer_data(sampler_output.sampled_token_ids)"), ROW_ZMQ),
    # 6. the flag copied to the host again, or the ids' copy blocking
    (dict(post='self.share_inputs["not_need_stop"].copy_(self.share_inputs["not_need_stop_device"], False)'), ROW_COPY),
    (dict(copy='self.share_inputs["sampled_token_ids"].copy_(sampler_output.sampled_token_ids, True)'), ROW_COPY),
    # 7. overlap off by default (2.5)
    (dict(default="enable_overlap_schedule: bool = False"), ROW_DEFAULT),
])
def test_each_wrong_assumption_fails_its_own_row(tmp_path, monkeypatch, planted, row):
    rows = _check(plant(tmp_path, monkeypatch, "fakefd_dev_", FILES, **planted))
    bad = sorted(r for r in ROWS if rows[r][0] != "OK")
    assert bad == [row], rows
    assert rows[row][0] == "MISMATCH"


def test_the_fddev_replica_has_the_shape():
    report = Report(fd_src=None)
    check_census_dev(Side("fd_async_copy_plugin.testing.reference.fddev", "replica"), report, None, replica=True)
    rows = {row.item: (row.status, row.detail) for row in report.rows if row.section == "census develop replica"}
    assert all(rows[r][0] == "OK" for r in ROWS), rows


def test_other_profiles_get_a_skip():
    report = Report(fd_src=None)
    check_census_dev(Side("fd_async_copy_plugin.testing.reference.fd25", "replica"), report, "fastdeploy-2.5")
    assert [(r.item, r.status) for r in report.rows] == [("profile", "SKIP")]


DEV_SRC = os.environ.get("FD_DEV_SRC", "/tmp/fd/fddev")


@pytest.mark.skipif(not os.path.isfile(os.path.join(DEV_SRC, "fastdeploy", "worker", "gpu_model_runner.py")),
                    reason=f"no FastDeploy develop checkout at {DEV_SRC} (set FD_DEV_SRC)")
def test_the_real_develop_tree_and_the_replica_pass_every_dev_row():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "check_real_fastdeploy.py"), "--fd-src", DEV_SRC,
                           "--no-behaviour", "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    rows = json.loads(proc.stdout)["rows"]
    dev = [(r["section"], r["item"], r["status"]) for r in rows if r["item"].startswith("(dev)")]
    assert {(s, i) for s, i, _ in dev} == {(s, i) for s in ("census develop", "census develop replica") for i in ROWS}
    assert all(status == "OK" for _, _, status in dev), dev
