"""``tools/real_fd/step_syncs_fd25.py`` (d25): on FastDeploy 2.5 ``step_syncs`` moves the sampling seed
to the device, which is exact only for a particular code shape - read from planted source trees (small
snippets written here, AST only; no FastDeploy needed): OK where the shape holds, and each planted
break fails its own row and no other. Also: which profiles get the rows, and the fd25 replica."""

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
from real_fd.step_syncs_fd25 import ROW_CREATE, ROW_PLACEMENT, ROW_READS, ROW_WRITERS  # noqa: E402

ROWS = (ROW_CREATE, ROW_WRITERS, ROW_READS)

RUNNER = '''
import paddle
from ..model_executor.layers.attention import allocate_buffers
from ..model_executor.layers.sample.meta_data import SamplingMetadata
from .input_batch import InputBatch

class GPUModelRunner:
    def __init__(self, fd_config):
        self.fd_config = fd_config
        self.share_inputs = InputBatch(fd_config)
        self.share_inputs.init_share_inputs()
        self.MAX_INFER_SEED = 9223372036854775806
        self.infer_seed_increment = paddle.full(shape=[4, 1], fill_value=4, dtype="int64").cpu()

    def insert_tasks_v1(self, req_dicts):
        for idx, request in enumerate(req_dicts):
            if request.get("seed") is not None:
                self.share_inputs["infer_seed"][idx : idx + 1] = request.get("seed")  # @insert

    def _prepare_inputs(self):
        pass  # @prepare
        self.sampling_metadata = SamplingMetadata(seed=self.share_inputs["infer_seed"])

    def _postprocess(self):
        self.share_inputs["infer_seed"].add_(self.infer_seed_increment)
        self.share_inputs["infer_seed"][:] %= self.MAX_INFER_SEED

    def _initialize_attn_backend(self):
        res_buffer = allocate_buffers(4)
        self.share_inputs.update(res_buffer)

    def update_share_input_block_num(self, num):
        self.share_inputs.update({"free_list": paddle.full([num], 0, dtype="int32")})  # @update

    def clear_requests(self):
        self.share_inputs.reset_share_inputs()  # @clear
'''
INPUT_BATCH = '''
import paddle

class InputBatch:
    def __getitem__(self, key):
        return getattr(self, key)

    def __setitem__(self, key, value):
        setattr(self, key, value)

    def update(self, values):
        for key, value in values.items():
            setattr(self, key, value)

    def __init__(self, fd_config):
        self.fd_config = fd_config

    def init_share_inputs(self):
        self.top_p = paddle.full([4, 1], 0.7, dtype="float32")
        self.infer_seed = paddle.full([4, 1], 0, dtype="int64").cpu()  # @create

    def swap_states(self, i1, i2):
        def swap_data(tensor, idx1, idx2):
            """Swap two rows."""
            temp = tensor[idx1].clone()  # @swap
            tensor[idx1] = tensor[idx2].clone()
            tensor[idx2] = temp

        swap_data(self.top_p, i1, i2)
        swap_data(self.infer_seed, i1, i2)  # @swapcall

    def reset_share_inputs(self):
        from ..utils import fill_paddle_tensor

        fill_paddle_tensor(self, "top_p", 0.7)
        fill_paddle_tensor(self, "infer_seed", 0)  # @reset


class ProposerInputBatch(InputBatch):
    def __init__(self, fd_config, target_model_input_batch):
        self.infer_seed = target_model_input_batch["infer_seed"]
'''
UTILS = '''
import paddle

def fill_paddle_tensor(shared_inputs_object, key, value):
    attr = getattr(shared_inputs_object, key)
    if isinstance(attr, paddle.Tensor):
        attr.fill_(value)  # @fill
'''
ATTENTION = '''
import paddle

def allocate_buffers(max_batch_size):
    res = {}
    res["decoder_batch_ids"] = paddle.full([max_batch_size], 0, dtype="int32")
    res["max_len_tensor_cpu"] = paddle.full([9], 0, dtype="int32").cpu()  # @res
    return res
'''
SAMPLER = '''
import paddle

def top_k_top_p_sampling(probs, top_p, top_k, topp_seed=None):
    return None, probs

def padding_sampling_params(top_p, infer_seed, seq_lens_this_time):
    top_p_padding = paddle.repeat_interleave(top_p[: seq_lens_this_time.shape[0]], seq_lens_this_time)
    topp_seed = paddle.repeat_interleave(infer_seed[: seq_lens_this_time.shape[0]], seq_lens_this_time)  # @pad
    return top_p_padding, topp_seed

class Sampler:
    def forward_cuda(self, probs, sampling_metadata):
        pass  # @sampler
        _, next_tokens = top_k_top_p_sampling(probs, sampling_metadata.top_p, sampling_metadata.top_k,
                                              topp_seed=sampling_metadata.seed)
        return next_tokens

class SpeculativeSampler:
    def forward_cuda(self, probs, sampling_metadata, share_inputs):
        top_p, topp_seed = padding_sampling_params(sampling_metadata.top_p, sampling_metadata.seed,
                                                   share_inputs["seq_lens_this_time"])
        return top_k_top_p_sampling(probs, top_p, None, topp_seed=topp_seed)
'''
FILES = {
    "worker/gpu_model_runner.py": RUNNER,
    "worker/input_batch.py": INPUT_BATCH,
    "utils.py": UTILS,
    "model_executor/layers/attention.py": ATTENTION,
    "model_executor/layers/sample/sampler.py": SAMPLER,
    "model_executor/layers/sample/meta_data.py": "class SamplingMetadata:\n    pass\n",
}


def _plant(tmp_path, monkeypatch, **replace) -> str:
    return plant(tmp_path, monkeypatch, "fakefd_d25_", FILES, **replace)


def _rows(report, section="step_syncs"):
    return {row.item: (row.status, row.detail) for row in report.rows if row.section == section}


def _check(name, profile="fastdeploy-2.5"):
    report = Report(fd_src=None)
    check_step_syncs(Side(name, "fake"), report, profile)
    return _rows(report)


def test_the_planted_fd25_shape_is_ok(tmp_path, monkeypatch):
    rows = _check(_plant(tmp_path, monkeypatch))
    assert all(rows[r][0] == "OK" for r in ROWS), rows
    assert rows["profile"][0] == "INFO" and "(a)" not in " ".join(rows)  # no FD 2.4 rows on 2.5
    create, writers, reads = (rows[r][1] for r in ROWS)
    assert "input_batch.py:" in create and "(InputBatch.init_share_inputs)" in create and ".cpu()" in create
    assert "allocate_buffers(...)" in create and "keys read" in create and "ProposerInputBatch" in create
    for form in ('setitem request.get("seed") at gpu_model_runner.py:', "add_(increment) at",
                 "[:] %= MAX_INFER_SEED at", 'fill_paddle_tensor(self, "infer_seed", 0) at', "in place",
                 "swap_data(infer_seed, i1, i2) at", "clone + setitem"):
        assert form in writers, writers
    assert "SamplingMetadata(seed=...)" in reads and "(Sampler.forward_cuda)" in reads
    assert "padding_sampling_params(infer_seed)" in reads


@pytest.mark.parametrize("planted, row", [
    # 1. creation and rebinding
    (dict(create='self.infer_seed = paddle.full([4, 1], 0, dtype="int64")'), ROW_CREATE),  # already on the device
    (dict(reset='self.infer_seed = paddle.full([4, 1], 0, dtype="int64").cpu()'), ROW_CREATE),  # re-created in reset
    (dict(clear='self.infer_seed_increment = paddle.full(shape=[4, 1], fill_value=4, dtype="int64").cpu()'),
     ROW_CREATE),  # the increment rebound later
    (dict(clear="self.share_inputs.init_share_inputs()"), ROW_CREATE),  # a second init: a new host seed
    (dict(clear="self.share_inputs = InputBatch(self.fd_config)"), ROW_CREATE),  # a new batch
    (dict(update='self.share_inputs.update({"infer_seed": paddle.full([4, 1], 0, dtype="int64").cpu()})'),
     ROW_CREATE),
    (dict(res='res["infer_seed"] = paddle.full([max_batch_size, 1], 0, dtype="int64").cpu()'), ROW_CREATE),
    (dict(res='res[str(max_batch_size)] = paddle.full([1], 0, dtype="int32")'), ROW_CREATE),  # keys not known
    # 2. the writers
    (dict(prepare='self.share_inputs["infer_seed"].copy_(self.share_inputs["top_p"], False)'), ROW_WRITERS),
    (dict(prepare='self.share_inputs["infer_seed"][0:1] = 7'), ROW_WRITERS),
    (dict(fill="setattr(shared_inputs_object, key, paddle.full_like(attr, value))"), ROW_WRITERS),  # not in place
    (dict(swap="temp = tensor[idx1].numpy()"), ROW_WRITERS),  # swap through the host
    # 3. host reads
    (dict(prepare='seeds = self.share_inputs["infer_seed"].numpy()'), ROW_READS),
    (dict(prepare='first = int(self.share_inputs["infer_seed"][0])'), ROW_READS),
    (dict(prepare='if self.share_inputs["infer_seed"][0] > 0: pass'), ROW_READS),
    (dict(prepare="step = self.infer_seed_increment.tolist()"), ROW_READS),
    (dict(prepare='seed = self.share_inputs["infer_seed"]'), ROW_READS),  # an alias, not followed
    (dict(prepare='log(self.share_inputs["infer_seed"])'), ROW_READS),  # handed to a call not followed
    (dict(sampler="assert sampling_metadata.seed.cpu() is not None"), ROW_READS),
    (dict(pad="topp_seed = infer_seed.numpy()[: seq_lens_this_time.shape[0]]"), ROW_READS),  # speculative path
])
def test_each_wrong_assumption_fails_its_own_row(tmp_path, monkeypatch, planted, row):
    rows = _check(_plant(tmp_path, monkeypatch, **planted))
    bad = sorted(r for r in ROWS if rows[r][0] != "OK")
    assert bad == [row], rows
    assert rows[row][0] == "MISMATCH"
    if row == ROW_READS and any(w in str(planted) for w in ("numpy", "int(", "> 0")):
        assert "a host read" in rows[row][1], rows[row]


def test_fewer_writers_are_still_exact(tmp_path, monkeypatch):
    """The fd25 replica had no insert write for a while: an absent form is listed, not a mismatch."""
    rows = _check(_plant(tmp_path, monkeypatch, insert="pass", reset="pass", swapcall="pass"))
    status, detail = rows[ROW_WRITERS]
    assert status == "OK" and "absent (fewer writers: still exact)" in detail, rows
    assert 'request.get("seed")' in detail.split("absent")[1] and all(rows[r][0] == "OK" for r in ROWS)


def test_sampler_without_topp_seed_fails_reads(tmp_path, monkeypatch):
    name = _plant(tmp_path, monkeypatch)
    path = tmp_path / name / "model_executor/layers/sample/sampler.py"
    path.write_text(path.read_text().replace("topp_seed=sampling_metadata.seed", "topp_seed=None"))
    rows = _check(name)
    assert rows[ROW_READS][0] == "MISMATCH" and "top_k_top_p_sampling" in rows[ROW_READS][1], rows
    assert rows[ROW_CREATE][0] == rows[ROW_WRITERS][0] == "OK"


@pytest.mark.parametrize("profile, placement", [("fastdeploy-2.6+", "on the device"), ("fastdeploy-2.6+", "on the host")])
def test_other_profiles_skip_with_the_placement(tmp_path, monkeypatch, profile, placement):
    planted = {} if placement == "on the host" else dict(
        create='self.infer_seed = paddle.full([4, 1], 0, dtype="int64")')
    rows = _check(_plant(tmp_path, monkeypatch, **planted), profile)
    assert rows["profile"][0] == "SKIP" and "fastdeploy-2.5 for the sampling seed and the token_num reads" in rows["profile"][1]
    assert not any(r in rows for r in ROWS)
    status, detail = rows[ROW_PLACEMENT]
    assert status == "INFO" and f"infer_seed created {placement} at worker/input_batch.py:" in detail, detail


def test_fd24_trees_get_no_d25_rows():
    report = Report(fd_src=None)
    check_step_syncs(Side("fd_async_copy_plugin.testing.reference.fd24", "replica"), report, None, replica=True)
    items = [r.item for r in report.rows]
    assert not any(i.startswith("(d25)") for i in items) and any(i.startswith("(d) ") for i in items)


def test_the_fd25_replica_has_the_shape():
    report = Report(fd_src=None)
    check_step_syncs(Side("fd_async_copy_plugin.testing.reference.fd25", "replica"), report, None, replica=True)
    rows = _rows(report, "step_syncs replica")
    assert all(rows[r][0] == "OK" for r in ROWS), rows
    assert "reference.fd24.utils" in rows[ROW_WRITERS][1]  # fill_paddle_tensor followed through the re-export
