"""Probe for ``step_syncs`` (f): a real FastDeploy 2.4 ``GPUModelRunner`` under the non-V1 scheduler.

Run in a child process (it enables the plugin, stands in for FastDeploy's compiled ops and sets
``ENABLE_V1_KVCACHE_SCHEDULER``; none of that may leak into the report's own process):

    python -m real_fd.non_v1_probe FD_ROOT [--plant own-path]

It enables the plugin (backend ``host``) the way FD's GPU worker does (hook first, runner module
imported after), with FD's ops replaced by ``enable_on_real_fastdeploy``'s stand-ins, and builds two
real runners without a model: ``GPUModelRunner.__new__`` plus the config attributes FastDeploy's own
``_init_share_inputs`` reads (small sizes), then FastDeploy's ``_init_share_inputs`` (through the
plugin's links). ``current_platform.is_cuda()`` answers True for the runner module only (the
plugin's stop_flag sets its part up on CUDA runners only; step_syncs needs that part).

- runner A with ``ENABLE_V1_KVCACHE_SCHEDULER=0``: must get no step_syncs part, be recorded as
  standing down with a reason naming the non-V1 scheduler, and ``exist_prefill()`` must give
  FastDeploy's own answer as ``seq_lens_encoder`` changes (0, 7, 0 in slot 1);
- runner B with the switch 1 (the control): must get the part (else A proves nothing).

``--plant own-path``: a planted plugin bug (``step_syncs.own_path_reason`` never finds a reason), so
runner A keeps the shadow and ``exist_prefill`` answers from it: the row must fail.

Prints one JSON object on stdout (FastDeploy's prints go to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import traceback
import types

SWITCH = "ENABLE_V1_KVCACHE_SCHEDULER"
ENCODER_VALUES = (0, 7, 0)


class _CudaPlatform:
    """``current_platform`` of the runner module, answering ``is_cuda()`` True."""

    def __init__(self, platform) -> None:
        self._platform = platform

    def is_cuda(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._platform, name)


def _runner(cls):
    N = types.SimpleNamespace
    r = cls.__new__(cls)
    r.model_config = N(
        max_model_len=64, pad_token_id=0, eos_tokens_lens=1, top_p=0.8, temperature=1.0, penalty_score=1.0,
        frequency_score=0.0, presence_score=0.0, min_length=1, max_stop_seqs_num=5, stop_seqs_max_len=8,
        vocab_size=128, head_dim=8, rope_theta=10000.0, partial_rotary_factor=1.0, model_type="ernie",
        think_truncate_prompt_ids=-1, architectures=["Ernie4_5_ForCausalLM"])
    r.cache_config = N(block_size=16, enc_dec_block_num=2, kv_cache_ratio=0.75, total_block_num=32,
                       enable_prefix_caching=False)
    r.speculative_config = N(method=None, num_speculative_tokens=0)
    r.speculative_decoding = False
    r.enable_mm = False
    r.parallel_config = N(use_ep=False, enable_expert_parallel=False)
    r.fd_config = N(structured_outputs_config=N(logits_processors=None), parallel_config=r.parallel_config,
                    model_config=r.model_config, cache_config=r.cache_config)
    return r


def probe(fd_root: str, plant: str | None = None) -> dict:
    out: dict = {"fd_root": fd_root, "plant": plant}
    scratch = tempfile.mkdtemp(prefix="fd-async-copy-nonv1-")
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", scratch)
    os.environ.setdefault("FD_LOG_DIR", scratch)
    os.chdir(scratch)  # FastDeploy writes ./log
    sys.path.insert(0, os.path.abspath(fd_root))
    with contextlib.redirect_stdout(sys.stderr):
        import paddle

        paddle.set_device("cpu")
        import fastdeploy.model_executor.ops.gpu as gpu_ops

        gpu_ops.tolerant_import_error()
        from enable_on_real_fastdeploy import _OpsStandIn

        sys.modules["fastdeploy.model_executor.ops.gpu"] = _OpsStandIn("fastdeploy.model_executor.ops.gpu")
        import fd_async_copy_plugin as plugin
        from fd_async_copy_plugin.patches import step_syncs
        from fd_async_copy_plugin.patches.runner import part
        from fd_async_copy_plugin.registry.patch import Junction

        if plant == "own-path":
            step_syncs.own_path_reason = lambda runner, runner_module: ""
        os.environ[SWITCH] = "0"
        plugin.enable(backend="host")
        import fastdeploy.worker.gpu_model_runner as module

        out["step_syncs"] = plugin.status()["features"].get("step_syncs", {}).get("state")
        module.current_platform = _CudaPlatform(module.current_platform)
        cls = module.GPUModelRunner
        runners = {}
        for label, switch in (("non_v1", "0"), ("v1", "1")):
            os.environ[SWITCH] = switch
            entry = runners[label] = {"switch": switch}
            try:
                runner = _runner(cls)
                runner._init_share_inputs(4)
            except Exception as exc:  # noqa: BLE001 - reported: the row says why it could not run
                entry["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                entry["traceback"] = traceback.format_exc()[-1500:]
                continue
            entry["stop_part"] = part(runner, "stop") is not None
            entry["syncs_part"] = part(runner, "syncs") is not None
            junction = Junction.at(cls, "exist_prefill")
            fd_exist = junction.original if junction is not None else cls.exist_prefill
            encoder = runner.share_inputs["seq_lens_encoder"]
            answers = []
            for value in ENCODER_VALUES:
                encoder[1] = value
                answers.append([bool(runner.exist_prefill()), bool(fd_exist(runner))])
            entry["exist_prefill"] = answers  # [plugin's answer, FastDeploy's] per value
            report = plugin.status()["features"].get("step_syncs", {})
            mine = [r for r in report.get("runners", []) if r.get("runner", "").endswith(f"@{id(runner):#x}")]
            entry["runner_state"] = mine[0].get("state") if mine else None
            entry["reason"] = mine[0].get("reason") if mine else None
            runner.__dict__["_probe_keep"] = runner  # kept alive (the registry holds runners weakly)
            out.setdefault("_keep", []).append(runner)
        out["runners"] = runners
        plugin.disable()
    out.pop("_keep", None)
    return out


def non_v1_row(result: dict) -> tuple[str, str]:
    """(status, detail) of the row "(f) non-V1: a real runner keeps FastDeploy's exist_prefill"."""
    if result.get("error"):
        return "SKIP", f"the probe did not run: {result['error']}"
    runners = result.get("runners", {})
    a, b = runners.get("non_v1", {}), runners.get("v1", {})
    for label, entry in (("non-V1", a), ("V1 control", b)):
        if entry.get("error"):
            return "SKIP", f"no real runner could be built ({label}): {entry['error']}"
    if not (b.get("stop_part") and b.get("syncs_part")):
        return "SKIP", (f"the control runner ({SWITCH}=1) got no step_syncs part (step_syncs "
                        f"{result.get('step_syncs')!r}, stop_flag part {b.get('stop_part')}): nothing to compare "
                        "(are the plugin's ops built? fd-async-copy build-ops --no-cuda)")
    answers = a.get("exist_prefill", [])
    wrong = []
    if a.get("syncs_part"):
        wrong.append("the runner got a step_syncs part")
    if a.get("runner_state") != "passthrough" or "non-V1 scheduler" not in (a.get("reason") or ""):
        wrong.append(f"status() has it {a.get('runner_state')!r} ({a.get('reason')!r}), not standing down for the "
                     "non-V1 scheduler")
    differ = [f"seq_lens_encoder[1]={v}: plugin {p}, FastDeploy {f}" for v, (p, f) in zip(ENCODER_VALUES, answers)
              if p != f]
    if differ or len(answers) != len(ENCODER_VALUES):
        wrong.append("exist_prefill is not FastDeploy's answer: " + ("; ".join(differ) or f"answers {answers}"))
    plant = f" [planted: {result['plant']}]" if result.get("plant") else ""
    if wrong:
        return "MISMATCH", f"{SWITCH}=0{plant}: " + "; ".join(wrong)
    shown = ", ".join(f"{v}->{p}" for v, (p, _f) in zip(ENCODER_VALUES, answers))
    return "OK", (f"real GPUModelRunner (FD's _init_share_inputs, stand-in ops, backend host): {SWITCH}=0 - no "
                  f"step_syncs part, passthrough '{a.get('reason')}', exist_prefill = FastDeploy's for "
                  f"seq_lens_encoder[1] {shown}; control {SWITCH}=1 - the part is set up")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fd_root", help="the folder that holds fastdeploy/")
    parser.add_argument("--plant", choices=["own-path"], default=None)
    parser.add_argument("--row", action="store_true", help="print the report row instead of the JSON")
    args = parser.parse_args(argv)
    try:
        result = probe(args.fd_root, args.plant)
    except Exception as exc:  # noqa: BLE001
        result = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                  "traceback": traceback.format_exc()[-1500:]}
    if args.row:
        status, detail = non_v1_row(result)
        print(f"{status:<8} {detail}")
        return 1 if status == "MISMATCH" else 0
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
