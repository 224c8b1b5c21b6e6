"""Names, patch points and the report model shared by every check."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FD_ROOT = "fastdeploy"
REPLICA_PACKAGE = "fd_async_copy_plugin.testing.reference"

RUNNER = "worker.gpu_model_runner"
SAMPLER = "model_executor.layers.sample.sampler"
OUTPUT = "worker.output"
POSTPROC = "model_executor.pre_and_post_process"
INPUT_BATCH = "worker.input_batch"
METAX_RUNNER = "worker.metax_model_runner"
GCU_RUNNER = "worker.gcu_model_runner"
ENGINE_ARGS = "engine.args_utils"

# Modules imported up front, in an order that mirrors how a worker reaches them.
IMPORT_ORDER = (OUTPUT, SAMPLER, POSTPROC, INPUT_BATCH, RUNNER, METAX_RUNNER, GCU_RUNNER, ENGINE_ARGS)

# Callables whose signatures the patches depend on: (module, qualified name).
SIGNATURE_POINTS = (
    (RUNNER, "GPUModelRunner.__init__"),
    (RUNNER, "GPUModelRunner._init_share_inputs"),
    (RUNNER, "GPUModelRunner.reset_share_inputs"),
    (RUNNER, "GPUModelRunner.insert_tasks_v1"),
    (RUNNER, "GPUModelRunner.insert_prefill_inputs"),
    (RUNNER, "GPUModelRunner.execute_model"),
    (RUNNER, "GPUModelRunner.execute_model_normal"),
    (RUNNER, "GPUModelRunner.execute_model_overlap"),
    (RUNNER, "GPUModelRunner._preprocess_and_execute_model"),
    (RUNNER, "GPUModelRunner._execute"),
    (RUNNER, "GPUModelRunner._postprocess"),
    (RUNNER, "GPUModelRunner._save_model_output"),
    (RUNNER, "GPUModelRunner.not_need_stop"),
    (RUNNER, "GPUModelRunner._get_prompt_logprobs_list"),
    (RUNNER, "GPUModelRunner._dummy_run"),
    (RUNNER, "GPUModelRunner._dummy_sampler_run"),
    (INPUT_BATCH, "InputBatch.__init__"),
    (INPUT_BATCH, "InputBatch.init_share_inputs"),
    (INPUT_BATCH, "InputBatch.reset_share_inputs"),
    (INPUT_BATCH, "InputBatch.swap_states"),
    (SAMPLER, "Sampler.gather_logprobs"),
    (SAMPLER, "Sampler.compute_logprobs"),
    (SAMPLER, "Sampler.forward_cuda"),
    (SAMPLER, "SpeculativeSampler.gather_logprobs"),
    (SAMPLER, "MTPSampler.gather_logprobs"),
    (OUTPUT, "LogprobsTensors.tolists"),
    (OUTPUT, "LogprobsTensors.empty_cpu"),
    (OUTPUT, "LogprobsTensors.empty"),
    (OUTPUT, "LogprobsTensors.slice_rows"),
    (POSTPROC, "post_process"),
    (POSTPROC, "post_process_normal"),
    (POSTPROC, "post_process_pooling"),
    (POSTPROC, "post_process_specualate"),
    (POSTPROC, "save_output_normal"),
    (POSTPROC, "save_output_specualate"),
    (POSTPROC, "_build_stream_transfer_data"),
    (POSTPROC, "pre_process"),
    (POSTPROC, "rebuild_padding"),
    (POSTPROC, "step_cuda"),
)

# Record types whose field order matters (positional construction, NamedTuple unpacking).
FIELD_POINTS = ((OUTPUT, "LogprobsTensors"), (OUTPUT, "SamplerOutput"), (OUTPUT, "ModelOutputData"))

# Modules whose `from ...ops.gpu import (...)` lists are compared.
OPS_IMPORTERS = (POSTPROC, RUNNER)
# Modules whose `from ...pre_and_post_process import (...)` lists are compared ("patch where imported").
POSTPROC_IMPORTERS = (RUNNER, METAX_RUNNER, GCU_RUNNER)

# share_inputs keys the async-copy patches read or write (fastdeploy-surface.md §2.1, §5.1, §9.1).
# A real key in this set that the replica lacks is MISSING; other absent keys are listed as INFO.
CORE_SHARE_INPUT_KEYS = (
    "not_need_stop", "not_need_stop_device", "sampled_token_ids", "stop_flags", "stop_nums",
    "next_tokens", "is_block_step", "is_block_step_cpu", "seq_lens_this_time_buffer",
    "seq_lens_this_time_cpu", "seq_lens_encoder", "seq_lens_decoder", "step_seq_lens_decoder",
    "prompt_lens", "input_ids", "block_tables", "step_idx", "pre_ids", "infer_seed",
)

# fastdeploy-surface.md §7 "Structural markers", per profile. None = the doc gives no value.
DOC_MARKERS = {
    "input_batch_module": {"fastdeploy-2.4": False, "fastdeploy-2.5": True, "fastdeploy-2.6+": True},
    "runner_init_share_inputs": {"fastdeploy-2.4": True, "fastdeploy-2.5": False, "fastdeploy-2.6+": False},
    "runner_execute_model_overlap": {"fastdeploy-2.4": False, "fastdeploy-2.5": True, "fastdeploy-2.6+": True},
    "runner_postprocess_and_save": {"fastdeploy-2.4": False, "fastdeploy-2.5": True, "fastdeploy-2.6+": True},
    "runner_preprocess_and_execute_model": {
        "fastdeploy-2.4": False, "fastdeploy-2.5": True, "fastdeploy-2.6+": False},
    "runner_execute": {"fastdeploy-2.4": None, "fastdeploy-2.5": None, "fastdeploy-2.6+": True},
    "runner_not_need_stop_method": {"fastdeploy-2.4": True, "fastdeploy-2.5": True, "fastdeploy-2.6+": False},
    "save_output_normal": {"fastdeploy-2.4": False, "fastdeploy-2.5": True, "fastdeploy-2.6+": True},
    "model_output_not_need_stop_device": {
        "fastdeploy-2.4": False, "fastdeploy-2.5": True, "fastdeploy-2.6+": True},
    "ops_get_stop_set_stop": {"fastdeploy-2.4": False, "fastdeploy-2.5": True, "fastdeploy-2.6+": False},
    "gather_logprobs_pin_memory": {"fastdeploy-2.4": False, "fastdeploy-2.5": True, "fastdeploy-2.6+": True},
    "engine_args_enable_overlap_schedule_default": {
        "fastdeploy-2.4": "absent", "fastdeploy-2.5": False, "fastdeploy-2.6+": True},
    "update_inputs_v1_tensor_inputs": {"fastdeploy-2.4": 13, "fastdeploy-2.5": 12, "fastdeploy-2.6+": 12},
    "save_output_inputs": {
        "fastdeploy-2.4": "x, not_need_stop",
        "fastdeploy-2.5": "x, not_need_stop, preempted_idx",
        "fastdeploy-2.6+": "x, not_need_stop, preempted_idx",
    },
}

PROBLEMS = ("MISMATCH", "MISSING", "EXTRA")


@dataclass
class Row:
    section: str
    item: str
    status: str
    detail: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Report:
    fd_src: str | None
    rows: list[Row] = field(default_factory=list)
    facts: dict = field(default_factory=dict)

    def add(self, section: str, item: str, status: str, detail: str = "") -> None:
        self.rows.append(Row(section, item, status, detail))

    def add_checked(self, section: str, item: str, problems: list[str], detail: str = "") -> None:
        """A checked row: MISMATCH with its ``problems`` (and ``detail``), else OK with ``detail``."""
        if problems:
            self.add(section, item, "MISMATCH", "; ".join(problems) + (f" | {detail}" if detail else ""))
        else:
            self.add(section, item, "OK", detail)

    def problems(self) -> list[Row]:
        return [r for r in self.rows if r.status in PROBLEMS]


def feature_section(report: Report, feature: str, profile: str | None, applied_on: str, replica: bool) -> str | None:
    """The report section of a feature's code-shape check, or None (after a SKIP row) when the
    FastDeploy side has another profile than the one the feature is applied on."""
    section = f"{feature} replica" if replica else feature
    if not replica and profile != applied_on:
        report.add(section, "profile", "SKIP", f"{feature} is applied on {applied_on} only; this tree is {profile}")
        return None
    return section

