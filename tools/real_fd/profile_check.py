"""Section 1: profile detection and the structural markers of fastdeploy-surface.md section 7."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import os

from .common import (
    DOC_MARKERS,
    ENGINE_ARGS,
    FD_ROOT,
    INPUT_BATCH,
    OUTPUT,
    POSTPROC,
    RUNNER,
    Report,
    SAMPLER,
)
from .side import Side
from .signatures import record_fields
from .source import call_args, checkout, cuda_import_names, op_registered_inputs


def measured_markers(fd: Side, fd_src: str | None) -> dict:
    """fastdeploy-surface.md §7 markers, measured on the imported modules (AST where import failed)."""
    markers: dict = {}

    def method(name: str):
        if fd.load(RUNNER) is not None:
            cls = fd.obj(RUNNER, "GPUModelRunner")
            return None if cls is None else hasattr(cls, name)
        cls = fd.ast_def(RUNNER, "GPUModelRunner")
        if cls is None:
            return None
        return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in cls.body)

    try:
        markers["input_batch_module"] = importlib.util.find_spec(f"{FD_ROOT}.{INPUT_BATCH}") is not None
    except (ImportError, ValueError):
        markers["input_batch_module"] = fd.path(INPUT_BATCH) is not None
    markers["runner_init_share_inputs"] = method("_init_share_inputs")
    markers["runner_execute_model_overlap"] = method("execute_model_overlap")
    post, save = method("_postprocess"), method("_save_model_output")
    markers["runner_postprocess_and_save"] = None if post is None else bool(post and save)
    markers["runner_preprocess_and_execute_model"] = method("_preprocess_and_execute_model")
    markers["runner_execute"] = method("_execute")
    markers["runner_not_need_stop_method"] = method("not_need_stop")

    if fd.load(POSTPROC) is not None:
        markers["save_output_normal"] = hasattr(fd.modules[POSTPROC], "save_output_normal")
    else:
        tree = fd.tree(POSTPROC)
        markers["save_output_normal"] = None if tree is None else fd.ast_def(POSTPROC, "save_output_normal") is not None

    fields, _route = record_fields(fd, OUTPUT, "ModelOutputData")
    markers["model_output_not_need_stop_device"] = None if fields is None else any(
        name == "not_need_stop_device" for name, _ in fields
    )

    # get_stop / set_stop: compiled ops are stubbed here, so read the pybind registration and the
    # runner's import list instead.
    runner_ops = cuda_import_names(fd.tree(RUNNER), ("ops.gpu",))
    cpp_registers = None
    if fd_src:
        cpp = os.path.join(checkout(fd_src), "custom_ops", "gpu_ops", "cpp_extensions.cc")
        if os.path.isfile(cpp):
            with open(cpp, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            cpp_registers = '"get_stop"' in text and '"set_stop"' in text
    markers["ops_get_stop_set_stop"] = ("get_stop" in runner_ops and "set_stop" in runner_ops) or bool(cpp_registers)
    markers["ops_get_stop_set_stop_detail"] = (
        f"runner imports get_stop/set_stop: {'get_stop' in runner_ops}/{'set_stop' in runner_ops}; "
        f"cpp_extensions.cc registers them: {cpp_registers if cpp_registers is not None else 'no custom_ops source'}"
    )

    gather = None
    if fd.load(SAMPLER) is not None:
        sampler_cls = fd.obj(SAMPLER, "Sampler")
        if sampler_cls is not None and hasattr(sampler_cls, "gather_logprobs"):
            try:
                gather = inspect.getsource(sampler_cls.gather_logprobs)
            except (OSError, TypeError):
                gather = None
    if gather is None:
        node = fd.ast_def(SAMPLER, "Sampler.gather_logprobs")
        gather = ast.unparse(node) if node is not None else None
    markers["gather_logprobs_pin_memory"] = None if gather is None else "pin_memory" in gather

    markers["engine_args_enable_overlap_schedule_default"] = _overlap_default(fd)

    # The trap of surface §2.1/§7: 2.4's reset_share_inputs already names the 2.5 keys, so a
    # plain-text search of the runner cannot tell the versions apart.
    runner_path = fd.path(RUNNER)
    if runner_path:
        with open(runner_path, encoding="utf-8", errors="replace") as handle:
            markers["runner_source_mentions_not_need_stop_device"] = "not_need_stop_device" in handle.read()

    # Tensor inputs of the update/save ops: the op registration (.Inputs) when the custom_ops
    # source is at hand; the Python call sites pass attributes too, so they only go in the detail.
    tree = fd.tree(POSTPROC)
    for marker, op in (("update_inputs_v1_tensor_inputs", "update_inputs_v1"), ("save_output_inputs", "save_output")):
        inputs = op_registered_inputs(fd_src, op)
        if inputs is None:
            markers[marker] = None
        else:
            markers[marker] = len(inputs) if marker.endswith("tensor_inputs") else ", ".join(inputs)
        calls = call_args(tree, op)
        markers[f"{marker}_detail"] = (
            f"registered .Inputs: {', '.join(inputs) if inputs is not None else 'no custom_ops source'}; "
            f"pre_and_post_process call: {op}(" + ("; ".join(", ".join(c) for c in calls) or "no call") + ")"
        )
    return markers


def _overlap_default(fd: Side):
    if fd.load(ENGINE_ARGS) is not None:
        cls = fd.obj(ENGINE_ARGS, "EngineArgs")
        if cls is not None and dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                if f.name == "enable_overlap_schedule":
                    return f.default if f.default is not dataclasses.MISSING else "no default"
            return "absent"
    node = fd.ast_def(ENGINE_ARGS, "EngineArgs")
    if node is None:
        return None
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", None) == "enable_overlap_schedule":
            if stmt.value is None:
                return "no default"
            try:
                return ast.literal_eval(stmt.value)
            except (ValueError, TypeError, SyntaxError):
                return ast.unparse(stmt.value)
    return "absent"


def check_profile(fd: Side, fd_src: str | None, report: Report) -> str | None:
    section = "profile"
    info = None
    try:
        from fd_async_copy_plugin import profile as profile_module
    except ImportError as exc:
        report.add(section, "detect_profile", "SKIP", f"fd_async_copy_plugin.profile not importable: {exc}")
        profile_module = None
    if profile_module is not None and hasattr(profile_module, "detect_profile"):
        info = profile_module.detect_profile(root=FD_ROOT)
        report.facts["detect_profile"] = {
            "profile": info.profile,
            "version": info.version,
            "markers": dict(getattr(info, "markers", {}) or {}),
            "reason": getattr(info, "reason", ""),
        }
        status = "OK" if info.profile not in ("unknown", "absent") else "MISMATCH"
        report.add(section, "detect_profile", status, f"{info.profile} (version {info.version!r}): {info.reason}")
    elif profile_module is not None:
        report.add(section, "detect_profile", "SKIP", "fd_async_copy_plugin.profile has no detect_profile()")

    # Without --fd-src, the custom_ops source may still sit next to the imported package.
    location = report.facts.get("fastdeploy_location")
    checkout = fd_src or (os.path.dirname(location) if location else None)
    measured = measured_markers(fd, checkout)
    report.facts["measured_markers"] = measured
    profile = info.profile if info is not None else None
    plugin_markers = dict(getattr(info, "markers", {}) or {}) if info is not None else {}
    for name, per_profile in DOC_MARKERS.items():
        value = measured.get(name)
        expected = per_profile.get(profile) if profile else None
        notes = [f"measured={value!r}"]
        status = "INFO"
        if expected is not None:
            notes.append(f"doc §7 for {profile}={expected!r}")
            if value is None:
                notes.append("not measurable here")
            else:
                status = "OK" if value == expected else "MISMATCH"
        if name in plugin_markers:
            notes.append(f"plugin AST={plugin_markers[name]!r}")
            if plugin_markers[name] != value:
                status = "MISMATCH"
                notes.append("plugin marker disagrees with the imported module")
        if f"{name}_detail" in measured:
            notes.append(measured[f"{name}_detail"])
        report.add(section, f"marker {name}", status, "; ".join(notes))
    if "runner_source_mentions_not_need_stop_device" in measured:
        report.add(section, "text 'not_need_stop_device' in gpu_model_runner.py", "INFO",
                   f"{measured['runner_source_mentions_not_need_stop_device']} (surface §7: not a version marker)")
    for name in sorted(set(plugin_markers) - set(DOC_MARKERS)):
        report.add(section, f"marker {name}", "INFO", f"plugin AST={plugin_markers[name]!r} (not in doc §7)")
    return profile
