"""``tools/real_fd/step_syncs.py`` (f): under the non-V1 scheduler FastDeploy 2.4 rewrites the step
state on the device, so ``step_syncs`` must stand the runner down - read from planted source trees
(AST; no FastDeploy needed): OK where the shape holds, and each planted break fails its own row and
no other. The real-runner row (``non_v1_probe``) needs a real tree; its verdict is tested on the
probe's result shapes, the planted plugin bug (``--plant own-path``) among them."""

from __future__ import annotations

import re
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from real_fd.common import Report  # noqa: E402
from real_fd.non_v1_probe import ENCODER_VALUES, non_v1_row  # noqa: E402
from real_fd.side import Side  # noqa: E402
from real_fd.step_syncs import ENVS, SWITCH, _runner_of, check_non_v1, check_step_syncs  # noqa: E402

STEP_CUDA_ROW = "(f) non-V1: step_cuda rewrites the step state"
SWITCH_ROW = "(f) non-V1: the stand-down reads the switch"
PROBE_ROW = "(f) non-V1: a real runner keeps FastDeploy's exist_prefill"

RUNNER = '''
{envs_import}
from ..model_executor.pre_and_post_process import step_cuda

class GPUModelRunner:
    def exist_prefill(self):
        return bool((self.share_inputs["seq_lens_encoder"].numpy() > 0).any())
    def _dummy_run(self):
        step_cuda(self.share_inputs, 16, 2, None, False)
    def execute_model(self):
        self.share_inputs["infer_seed"].add_(self.infer_seed_increment)
        {guard}
            step_cuda(self.share_inputs, 16, 2, None, False)
'''
POSTPROC = '''
from .ops import step_paddle, step_system_cache

def step_cuda(share_inputs, block_size, enc_dec_block_num, speculative_config, enable_prefix_caching=False):
    if enable_prefix_caching:
        step_system_cache(share_inputs["stop_flags"], share_inputs["seq_lens_this_time"],
                          share_inputs["seq_lens_encoder"], share_inputs["block_tables"],
                          share_inputs["is_block_step"], block_size)
    else:
        step_paddle(share_inputs["stop_flags"], share_inputs["seq_lens_this_time"],
                    share_inputs["seq_lens_encoder"], share_inputs["block_tables"],
                    {last}, block_size)
'''
ENVS_PY = '''
import os
environment_variables = {{
    "{switch}": lambda: int(os.getenv("{switch}", "1")),
}}
def __getattr__(name):
    return environment_variables[name]()
'''


def _tree(tmp_path, name, envs_import="from {root} import envs", guard="if not envs.ENABLE_V1_KVCACHE_SCHEDULER:",
          last='share_inputs["is_block_step"]', switch=SWITCH):
    root = tmp_path / name
    files = {
        "worker/gpu_model_runner.py": RUNNER.format(envs_import=envs_import.format(root=name), guard=guard),
        "model_executor/pre_and_post_process.py": POSTPROC.format(last=last),
        "model_executor/ops.py": "step_paddle = step_system_cache = None\n",
        "envs.py": ENVS_PY.format(switch=switch),
    }
    for sub, text in files.items():
        path = root / sub
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for folder in (root, root / "worker", root / "model_executor"):
        (folder / "__init__.py").touch()
    return name


def _rows(report, section="step_syncs"):
    return {row.item: (row.status, row.detail) for row in report.rows if row.section == section}


@pytest.mark.parametrize("planted, item", [
    (dict(), None),
    (dict(envs_import="from {root} import envs as fd_envs"), SWITCH_ROW),  # the plugin reads <module>.envs
    (dict(envs_import="from {root}.envs import ENABLE_V1_KVCACHE_SCHEDULER"), SWITCH_ROW),
    (dict(switch="SOME_OTHER_SWITCH"), SWITCH_ROW),  # envs.py no longer declares the switch
    (dict(guard="if True:"), STEP_CUDA_ROW),  # step_cuda not under the switch
    (dict(last='share_inputs["step_lens"]'), STEP_CUDA_ROW),  # an op no longer takes is_block_step
])
def test_each_non_v1_check_fails_where_its_shape_does_not_hold(tmp_path, monkeypatch, planted, item):
    name = _tree(tmp_path, "fakefd_nonv1_" + re.sub(r"\W", "_", tmp_path.name), **planted)  # unique per case
    monkeypatch.syspath_prepend(str(tmp_path))
    side = Side(name, "fake")
    report = Report(fd_src=None)
    check_non_v1(side, _runner_of(side), report, "step_syncs")
    rows = _rows(report)
    assert set(rows) == {STEP_CUDA_ROW, SWITCH_ROW}, rows  # no real-runner row for a tree not named fastdeploy
    bad = sorted(k for k, (status, _d) in rows.items() if status == "MISMATCH")
    assert bad == ([] if item is None else [item]), rows
    if item is None:
        assert "execute_model:" in rows[STEP_CUDA_ROW][1] and "2 ops" in rows[STEP_CUDA_ROW][1]
        assert "the plugin's decision not asked" in rows[SWITCH_ROW][1]  # not imported: AST only


def test_replica_has_the_non_v1_shapes():
    report = Report(fd_src=None)
    check_step_syncs(Side("fd_async_copy_plugin.testing.reference.fd24", "replica"), report, None, replica=True)
    rows = _rows(report, "step_syncs replica")
    assert rows[STEP_CUDA_ROW][0] == "OK" and rows[SWITCH_ROW][0] == "OK", rows
    assert PROBE_ROW not in rows  # a real runner is built from FastDeploy only


def test_the_tool_reads_the_switch_where_the_plugin_does(monkeypatch):
    """The stand-down the section vouches for: ``own_path_reason`` reads ``<runner module>.envs``, and
    ``<root>.envs`` where the runner module has no such name (a renamed import)."""
    import sys

    from fd_async_copy_plugin.patches.step_syncs import own_path_reason

    def module(value, name="fakefd.worker.gpu_model_runner"):
        return types.SimpleNamespace(__name__=name, **{ENVS: types.SimpleNamespace(**{SWITCH: value})})

    runner = types.SimpleNamespace()
    assert "non-V1 scheduler" in own_path_reason(runner, module(0))
    assert own_path_reason(runner, module(1)) == ""
    renamed = types.SimpleNamespace(__name__="fakefd.worker.gpu_model_runner", fd_envs=module(0).envs)
    monkeypatch.setitem(sys.modules, "fakefd.envs", types.SimpleNamespace(**{SWITCH: 0}))
    assert "non-V1 scheduler" in own_path_reason(runner, renamed)


def _entry(syncs, state, reason, answers):
    return {"switch": "0", "stop_part": True, "syncs_part": syncs, "runner_state": state, "reason": reason,
            "exist_prefill": answers}


FD_ANSWERS = [[bool(v), bool(v)] for v in ENCODER_VALUES]
CONTROL = {"switch": "1", "stop_part": True, "syncs_part": True, "runner_state": "applied", "reason": "",
           "exist_prefill": [[False, False], [False, True], [False, False]]}
STOOD_DOWN = _entry(False, "passthrough", "non-V1 scheduler (step_cuda rewrites the step state on the device): x",
                    FD_ANSWERS)
# what the probe gave on the real FD 2.4 tree with ``--plant own-path`` (2026-12-02)
PLANTED = _entry(True, "applied", "", [[False, False], [False, True], [False, False]])


@pytest.mark.parametrize("result, status, words", [
    ({"runners": {"non_v1": STOOD_DOWN, "v1": CONTROL}, "step_syncs": "applied"}, "OK", "no step_syncs part"),
    ({"runners": {"non_v1": PLANTED, "v1": CONTROL}, "plant": "own-path"}, "MISMATCH", "got a step_syncs part"),
    ({"runners": {"non_v1": {**STOOD_DOWN, "exist_prefill": [[False, False], [False, True], [False, False]]},
                  "v1": CONTROL}}, "MISMATCH", "plugin False, FastDeploy True"),
    ({"runners": {"non_v1": {**STOOD_DOWN, "reason": "speculative decoding"}, "v1": CONTROL}}, "MISMATCH",
     "not standing down for the non-V1 scheduler"),
    ({"runners": {"non_v1": STOOD_DOWN, "v1": {**CONTROL, "syncs_part": False}}, "step_syncs": "skipped"}, "SKIP",
     "control runner"),
    ({"runners": {"non_v1": {"error": "AttributeError: x"}, "v1": CONTROL}}, "SKIP", "no real runner"),
    ({"error": "ModuleNotFoundError: fastdeploy"}, "SKIP", "did not run"),
])
def test_the_real_runner_row(result, status, words):
    got, detail = non_v1_row(result)
    assert got == status and words in detail, detail
