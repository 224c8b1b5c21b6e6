#!/usr/bin/env python3
"""Check a real FastDeploy tree against this plugin: profile detection and replica fidelity.

Usage::

    python tools/check_real_fastdeploy.py --fd-src /path/to/FastDeploy [--json] [--strict]
                                          [--replica auto|fd24|fd25|none|<dotted.module>]
                                          [--no-behaviour] [--keep-scratch]

``--fd-src`` is a FastDeploy source checkout (the folder that holds ``fastdeploy/``) or the
``fastdeploy`` package folder itself; without it the installed ``fastdeploy`` is used. The tool
never fetches FastDeploy: you point it at a tree you already have.

What it reports:

1. ``profile``: ``fd_async_copy_plugin.profile.detect_profile()`` (structural markers read from
   source), next to the same markers measured by importing FastDeploy, and the values that
   fastdeploy-surface.md §7 expects for the detected profile.
2. ``surface``: for each patch point (module relative to the root package + qualified name), the
   real FastDeploy against our replica (``fd_async_copy_plugin.reference.fd24`` / ``.fd25``):
   existence and ``inspect.signature`` parameter names, kinds and defaults; dataclass and
   NamedTuple fields in order; the op names ``pre_and_post_process`` imports from ``ops.gpu``;
   the names the runners import from ``pre_and_post_process``; the ``share_inputs`` keys created
   at start-up with their dtype, shape and placement where the source states them.
3. ``behaviour``: the state-free patch points (``Sampler.compute_logprobs``/``gather_logprobs``,
   ``LogprobsTensors`` helpers) run on both sides with the same small inputs, compared bitwise.

FastDeploy's own share_inputs keys and import lists are listed (``fd share_inputs``,
``fd imports``) even without a replica.

FastDeploy needs its compiled custom ops to import its GPU modules. When they are absent (a CPU
machine) the tool calls FastDeploy's own ``ops.gpu.tolerant_import_error()`` first, which turns
every op into ``None`` - enough for imports and signatures. A module that still fails to import is
listed, and read with ``ast`` instead, so every check still runs.

Statuses: OK, MISMATCH (both sides have it, they differ), MISSING (FastDeploy has it, the replica
does not), EXTRA (the replica has something FastDeploy lacks), INFO, SKIP. ``--strict`` exits 1
when any MISMATCH, MISSING or EXTRA is reported.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FD_ROOT = "fastdeploy"
REPLICA_PACKAGE = "fd_async_copy_plugin.reference"

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

    def problems(self) -> list[Row]:
        return [r for r in self.rows if r.status in PROBLEMS]


# --------------------------------------------------------------------------------------------
# Reading one side (real FastDeploy or the replica): imported objects first, source AST second.
# --------------------------------------------------------------------------------------------


class Side:
    """One package tree - ``fastdeploy`` or a replica root - seen through imports and its source."""

    def __init__(self, root: str, label: str):
        self.root = root
        self.label = label
        self.modules: dict[str, object] = {}
        self.import_errors: dict[str, str] = {}
        self.resolved: dict[str, str | None] = {}
        self._trees: dict[str, ast.Module | None] = {}

    # -- locating -------------------------------------------------------------------------
    def resolve(self, rel: str) -> str | None:
        """Dotted name of the module for ``rel`` on this side, or None when no such module exists."""
        if rel not in self.resolved:
            name = f"{self.root}.{rel}"
            try:
                found = name if importlib.util.find_spec(name) is not None else None
            except (ImportError, ValueError, AttributeError):
                # A parent package failed to import: look for the file instead.
                found = name if self._file_for(name) is not None else None
            self.resolved[rel] = found
        return self.resolved[rel]

    def _file_for(self, dotted: str) -> str | None:
        top = dotted.split(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        base = list(spec.submodule_search_locations)[0]
        parts = dotted.split(".")[1:]
        for candidate in (os.path.join(base, *parts) + ".py", os.path.join(base, *parts, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
        return None

    def path(self, rel: str) -> str | None:
        name = self.resolve(rel)
        if name is None:
            return None
        module = self.modules.get(rel)
        origin = getattr(module, "__file__", None)
        return origin or self._file_for(name)

    # -- importing ------------------------------------------------------------------------
    def load(self, rel: str):
        if rel in self.modules:
            return self.modules[rel]
        if rel in self.import_errors:
            return None
        name = self.resolve(rel)
        if name is None:
            return None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                module = importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - FD import errors are findings, not crashes
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.import_errors[rel] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            return None
        self.modules[rel] = module
        return module

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            source_path = self.path(rel)
            tree = None
            if source_path:
                try:
                    with open(source_path, encoding="utf-8") as handle:
                        tree = ast.parse(handle.read(), filename=source_path)
                except (OSError, SyntaxError, ValueError):
                    tree = None
            self._trees[rel] = tree
        return self._trees[rel]

    # -- objects --------------------------------------------------------------------------
    def obj(self, rel: str, qualname: str):
        module = self.load(rel)
        if module is None:
            return None
        current = module
        for part in qualname.split("."):
            try:
                current = inspect.getattr_static(current, part)
            except AttributeError:
                return None
        return current

    def ast_def(self, rel: str, qualname: str):
        tree = self.tree(rel)
        if tree is None:
            return None
        node: ast.AST = tree
        for part in qualname.split("."):
            found = None
            for child in getattr(node, "body", []):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == part:
                    found = child  # the last definition wins, as at runtime
            if found is None:
                return None
            node = found
        return node


# --------------------------------------------------------------------------------------------
# Normalised descriptions that compare equal across the import and AST routes.
# --------------------------------------------------------------------------------------------

_SIMPLE = (type(None), bool, int, float, str, bytes)


def _default_text(value) -> str:
    if isinstance(value, _SIMPLE) or (
        isinstance(value, (tuple, list)) and all(isinstance(v, _SIMPLE) for v in value)
    ):
        return repr(value)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return f"<{name or type(value).__name__}>"


def _ast_default_text(node: ast.expr) -> str:
    try:
        return _default_text(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return f"<{ast.unparse(node)}>"


def _wrapper_kind(raw) -> str:
    if isinstance(raw, staticmethod):
        return "staticmethod"
    if isinstance(raw, classmethod):
        return "classmethod"
    if isinstance(raw, property):
        return "property"
    return "function"


def signature_from_object(raw) -> tuple[str, list[tuple[str, str, str]]] | None:
    """(wrapper kind, [(name, kind, default)]) from an object found with getattr_static."""
    kind = _wrapper_kind(raw)
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if isinstance(raw, property):
        func = raw.fget
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    params = [
        (p.name, p.kind.name, "-" if p.default is inspect.Parameter.empty else _default_text(p.default))
        for p in sig.parameters.values()
    ]
    return kind, params


def signature_from_ast(node) -> tuple[str, list[tuple[str, str, str]]] | None:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    kind = "function"
    for deco in node.decorator_list:
        name = deco.id if isinstance(deco, ast.Name) else getattr(deco, "attr", None)
        if name in ("staticmethod", "classmethod", "property"):
            kind = name
    a = node.args
    positional = list(a.posonlyargs) + list(a.args)
    defaults: list = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = []
    for index, arg in enumerate(positional):
        pkind = "POSITIONAL_ONLY" if index < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        default = defaults[index]
        params.append((arg.arg, pkind, "-" if default is None else _ast_default_text(default)))
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", "-"))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append((arg.arg, "KEYWORD_ONLY", "-" if default is None else _ast_default_text(default)))
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", "-"))
    return kind, params


def describe_signature(side: Side, rel: str, qualname: str):
    """(signature or None, route) where route says how it was read ("import", "ast", "absent")."""
    if side.load(rel) is not None:
        raw = side.obj(rel, qualname)
        if raw is None:
            return None, "import"
        described = signature_from_object(raw)
        if described is not None:
            return described, "import"
    node = side.ast_def(rel, qualname)
    if node is None:
        return None, "ast" if side.tree(rel) is not None else "absent"
    return signature_from_ast(node), "ast"


def _format_params(params) -> str:
    out = []
    for name, kind, default in params:
        prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "")
        text = prefix + name
        if kind == "KEYWORD_ONLY":
            text = "kw:" + text
        if kind == "POSITIONAL_ONLY":
            text = text + "/"
        if default != "-":
            text += "=" + default
        out.append(text)
    return "(" + ", ".join(out) + ")"


def missing_and_extra(real_names, replica_names) -> list[str]:
    """Notes on the names FastDeploy has that the replica lacks, and the reverse (empty if none)."""
    notes = []
    missing = [n for n in real_names if n not in replica_names]
    extra = [n for n in replica_names if n not in real_names]
    if missing:
        notes.append("replica lacks " + ", ".join(missing))
    if extra:
        notes.append("replica adds " + ", ".join(extra))
    return notes


def compare_signatures(real, replica) -> str:
    """Empty when equal, else a human-readable difference."""
    (rkind, rparams), (pkind, pparams) = real, replica
    notes = []
    if rkind != pkind:
        notes.append(f"FD is a {rkind}, replica a {pkind}")
    if rparams != pparams:
        rnames = [p[0] for p in rparams]
        pnames = [p[0] for p in pparams]
        if rnames != pnames:
            name_notes = missing_and_extra(rnames, pnames)
            notes.extend(name_notes or ["parameter order differs"])
        for rp, pp in zip(rparams, pparams):
            if rp[0] == pp[0] and rp != pp:
                if rp[1] != pp[1]:
                    notes.append(f"{rp[0]}: kind {rp[1]} vs {pp[1]}")
                if rp[2] != pp[2]:
                    notes.append(f"{rp[0]}: default {rp[2]} vs {pp[2]}")
        notes.append(f"FD {_format_params(rparams)} | replica {_format_params(pparams)}")
    return "; ".join(notes)


def record_fields(side: Side, rel: str, cls_name: str):
    """([(field, has_default)], route) for a dataclass or NamedTuple; None when absent."""
    if side.load(rel) is not None:
        cls = side.obj(rel, cls_name)
        if cls is None:
            return None, "import"
        if dataclasses.is_dataclass(cls):
            fields = [
                (f.name, f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
                for f in dataclasses.fields(cls)
            ]
            return fields, "import"
        if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
            defaults = getattr(cls, "_field_defaults", {})
            return [(name, name in defaults) for name in cls._fields], "import"
    node = side.ast_def(rel, cls_name)
    if not isinstance(node, ast.ClassDef):
        return None, "ast"
    fields = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = ast.unparse(stmt.annotation)
            if annotation.startswith(("ClassVar", "typing.ClassVar")):
                continue
            fields.append((stmt.target.id, stmt.value is not None))
    return fields, "ast"


# --------------------------------------------------------------------------------------------
# AST readers: import lists, share_inputs keys, call arities.
# --------------------------------------------------------------------------------------------


def _guarded_nodes(body, guard=()):
    """Yield (node, guard) for every statement, with the chain of `if` conditions around it."""
    for node in body:
        yield node, guard
        if isinstance(node, ast.If):
            cond = ast.unparse(node.test)
            yield from _guarded_nodes(node.body, guard + (cond,))
            yield from _guarded_nodes(node.orelse, guard + (f"not ({cond})",))
        elif isinstance(node, (ast.Try,)):
            yield from _guarded_nodes(node.body, guard + ("try",))
            for handler in node.handlers:
                yield from _guarded_nodes(handler.body, guard + ("except",))
            yield from _guarded_nodes(node.orelse, guard)
            yield from _guarded_nodes(node.finalbody, guard)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            yield from _guarded_nodes(node.body, guard)


def _is_cuda_guard(guard) -> bool:
    """True when no condition in the chain positively selects a non-CUDA platform."""
    for cond in guard:
        if cond.startswith("not ("):
            continue
        if "current_platform.is_" in cond and "is_cuda" not in cond:
            return False
    return True


def imports_from(tree: ast.Module | None, module_suffixes: tuple[str, ...]):
    """[(names, guard)] of `from X import names` at module level where X ends with a suffix."""
    if tree is None:
        return []
    found = []
    for node, guard in _guarded_nodes(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            if any(module == s or module.endswith("." + s) for s in module_suffixes):
                found.append(([a.name for a in node.names], guard))
    return found


def cuda_import_names(tree, suffixes) -> list[str]:
    names: list[str] = []
    for group, guard in imports_from(tree, suffixes):
        if _is_cuda_guard(guard):
            names.extend(n for n in group if n not in names)
    return names


@dataclass
class TensorSpec:
    dtype: str | None
    shape: str | None
    place: str | None
    guard: str

    def text(self) -> str:
        return f"{self.dtype or '?'} {self.shape or '?'} {self.place or '?'}"


_CONSTRUCTORS = {"full", "zeros", "ones", "empty", "to_tensor", "full_like", "zeros_like", "ones_like",
                 "empty_like", "arange", "clone", "assign"}


def _norm_shape(node: ast.expr) -> str:
    """Shape text with attribute chains reduced to their last name (self.model_config.x -> x)."""

    class Strip(ast.NodeTransformer):
        def visit_Attribute(self, node):  # noqa: N802 - ast API
            return ast.copy_location(ast.Name(id=node.attr, ctx=ast.Load()), node)

    return ast.unparse(Strip().visit(ast.parse(ast.unparse(node), mode="eval")).body)


def tensor_spec(value: ast.expr, guard: str) -> TensorSpec:
    """dtype / shape / placement of `paddle.full([..], v, dtype=..)[.cpu()|.pin_memory()]`."""
    place = None
    node = value
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
        "cpu", "pin_memory", "cuda"
    ):
        place = place or {"cpu": "cpu", "pin_memory": "pinned", "cuda": "device"}[node.func.attr]
        node = node.func.value
    dtype = shape = None
    if isinstance(node, ast.Call):
        fname = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if fname in _CONSTRUCTORS:
            for kw in node.keywords:
                if kw.arg == "dtype":
                    dtype = _dtype_text(kw.value)
                elif kw.arg == "shape":
                    shape = _norm_shape(kw.value)
                elif kw.arg in ("place", "device") and place is None:
                    text = ast.unparse(kw.value).lower()
                    place = "cpu" if "cpu" in text else ("pinned" if "pinned" in text else text)
            if fname in ("full", "zeros", "ones", "empty") and node.args and shape is None:
                shape = _norm_shape(node.args[0])
            if fname == "full" and len(node.args) >= 3 and dtype is None:
                dtype = _dtype_text(node.args[2])
            if fname in ("zeros", "ones", "empty") and len(node.args) >= 2 and dtype is None:
                dtype = _dtype_text(node.args[1])
            if place is None and fname in ("full", "zeros", "ones", "empty"):
                place = "device"
    return TensorSpec(dtype, shape, place, guard)


def _dtype_text(node: ast.expr) -> str:
    text = ast.unparse(node).strip("'\"")
    return text.rsplit(".", 1)[-1]


def share_input_specs(func, style: str) -> dict[str, list[TensorSpec]]:
    """What a share_inputs initialiser creates, with the dtype/shape/placement the source states.

    ``style="dict"`` (2.4 ``GPUModelRunner._init_share_inputs``): keys are ``share_inputs["k"] = ...``
    (also through a local alias such as ``si = self.share_inputs = {}``); other ``self.x = ...``
    assignments are runner attributes, recorded as ``self.x``. ``style="attr"`` (2.5+
    ``InputBatch.init_share_inputs``): every ``self.k = ...`` is a key.
    """
    specs: dict[str, list[TensorSpec]] = {}
    if func is None:
        return specs
    containers = {"self.share_inputs", "share_inputs"}
    for node, _guard in _guarded_nodes(func.body):
        if isinstance(node, ast.Assign) and any(ast.unparse(t) in containers for t in node.targets):
            containers.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node, guard in _guarded_nodes(func.body):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        condition = " and ".join(guard)
        for target in targets:
            text = ast.unparse(target)
            if text in containers:
                if isinstance(node.value, ast.Dict):
                    for k, v in zip(node.value.keys, node.value.values):
                        if isinstance(k, ast.Constant) and isinstance(k.value, str):
                            specs.setdefault(k.value, []).append(tensor_spec(v, condition))
                continue
            key = None
            if (
                isinstance(target, ast.Subscript)
                and ast.unparse(target.value) in containers
                and isinstance(target.slice, ast.Constant)
                and isinstance(target.slice.value, str)
            ):
                key = target.slice.value
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                key = target.attr if style == "attr" else f"self.{target.attr}"
            if key is not None:
                specs.setdefault(key, []).append(tensor_spec(_unwrap_placement_helper(node.value), condition))
    return specs


def _unwrap_placement_helper(value: ast.expr) -> ast.expr:
    """``as_device(paddle.full(...))``-style one-argument wrappers: read the constructor inside."""
    if (
        isinstance(value, ast.Call)
        and len(value.args) == 1
        and not value.keywords
        and isinstance(value.args[0], ast.Call)
        and isinstance(value.func, ast.Name)
    ):
        return value.args[0]
    return value


def call_args(tree, func_name: str) -> list[list[str]]:
    """Argument lists (unparsed) of every call to `func_name(...)` in a module."""
    calls = []
    if tree is None:
        return calls
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name == func_name:
                args = [ast.unparse(a) for a in node.args]
                args += [f"{k.arg}={ast.unparse(k.value)}" for k in node.keywords]
                calls.append(args)
    return calls


_OP_FILES = {"update_inputs_v1": ("update_inputs_v1.cu",), "save_output": ("save_with_output_msg.cc",)}


def op_registered_inputs(fd_src: str | None, op: str) -> list[str] | None:
    """Input names in `PD_BUILD_STATIC_OP(op).Inputs({...})` from custom_ops/gpu_ops, or None."""
    if not fd_src:
        return None
    base = os.path.join(_checkout(fd_src), "custom_ops", "gpu_ops")
    if not os.path.isdir(base):
        return None
    files = [os.path.join(base, f) for f in _OP_FILES.get(op, ())]
    for folder, _dirs, names in os.walk(base):
        files.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith((".cc", ".cu")))
    pattern = re.compile(r"PD_BUILD_(?:STATIC_)?OP\(\s*" + re.escape(op) + r"\s*\)\s*\.Inputs\(\{(.*?)\}\)", re.S)
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        match = pattern.search(text)
        if match:
            return re.findall(r'"([^"]+)"', match.group(1))
    return None


def _checkout(fd_src: str) -> str:
    """The checkout folder for --fd-src given as either the checkout or its fastdeploy/ package."""
    path = os.path.abspath(fd_src).rstrip(os.sep)
    if os.path.basename(path) == FD_ROOT and os.path.isfile(os.path.join(path, "__init__.py")):
        return os.path.dirname(path)
    return path


# --------------------------------------------------------------------------------------------
# Environment: FastDeploy first on sys.path, compiled ops stubbed when missing.
# --------------------------------------------------------------------------------------------


def prepare_environment(fd_src: str | None, report: Report) -> None:
    if fd_src:
        path = _checkout(fd_src)
        if not os.path.isfile(os.path.join(path, FD_ROOT, "__init__.py")):
            raise SystemExit(f"error: no {FD_ROOT}/__init__.py under {fd_src}")
        sys.path.insert(0, path)
        report.facts["fd_search_path"] = path
    # Our plugin: the installed one, else this checkout.
    if importlib.util.find_spec("fd_async_copy_plugin") is None:
        sys.path.insert(1 if fd_src else 0, REPO_ROOT)
    # FastDeploy writes logs under ./log and a Prometheus folder under /tmp at import time:
    # keep both in a scratch folder removed at exit, unless the user chose their own.
    scratch = tempfile.mkdtemp(prefix="fd-check-")
    report.facts["scratch_dir"] = scratch
    os.environ.setdefault("FD_LOG_DIR", os.path.join(scratch, "log"))
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", os.path.join(scratch, "prom"))
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)


def import_fastdeploy(fd: Side, report: Report) -> None:
    spec = importlib.util.find_spec(FD_ROOT)
    if spec is None:
        report.add("environment", "import fastdeploy", "MISMATCH", "fastdeploy is not importable")
        return
    report.facts["fastdeploy_location"] = os.path.dirname(spec.origin or "")
    fd_search = report.facts.get("fd_search_path")
    if fd_search and not (spec.origin or "").startswith(fd_search + os.sep):
        report.add("environment", "import fastdeploy", "MISMATCH",
                   f"fastdeploy resolves to {spec.origin}, not under {fd_search}")
    try:
        import paddle

        report.facts["paddle"] = paddle.__version__
        report.facts["paddle_cuda"] = bool(paddle.is_compiled_with_cuda())
        if not paddle.is_compiled_with_cuda():
            paddle.set_device("cpu")
    except Exception as exc:  # noqa: BLE001
        report.add("environment", "import paddle", "INFO", f"{type(exc).__name__}: {exc}")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            fastdeploy = importlib.import_module(FD_ROOT)
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        report.add("environment", "import fastdeploy", "INFO",
                   f"failed ({type(exc).__name__}: {exc}); every check falls back to source (AST)")
        return
    report.facts["fastdeploy___version__"] = str(getattr(fastdeploy, "__version__", None))
    # fastdeploy.__getattr__ answers None for unknown names (surface §7): hasattr is always True.
    with contextlib.redirect_stdout(sys.stderr):
        report.facts["fastdeploy_hasattr_always_true"] = hasattr(fastdeploy, "no_such_attribute_fd_check")
    ops_name = f"{FD_ROOT}.model_executor.ops.gpu"
    try:
        with contextlib.redirect_stdout(sys.stderr):
            ops = importlib.import_module(ops_name)
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        report.facts["ops_gpu"] = f"import failed: {type(exc).__name__}: {exc}"
        return
    compiled = f"{ops_name}.fastdeploy_ops" in sys.modules
    if compiled:
        report.facts["ops_gpu"] = "compiled fastdeploy_ops present"
    elif hasattr(ops, "tolerant_import_error"):
        ops.tolerant_import_error()
        report.facts["ops_gpu"] = "not compiled: stubbed with ops.gpu.tolerant_import_error()"
    else:
        report.facts["ops_gpu"] = "not compiled and no tolerant_import_error(): GPU modules may not import"


# --------------------------------------------------------------------------------------------
# Section 1: profile detection and markers.
# --------------------------------------------------------------------------------------------


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
        cpp = os.path.join(_checkout(fd_src), "custom_ops", "gpu_ops", "cpp_extensions.cc")
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


# --------------------------------------------------------------------------------------------
# Section 2: replica fidelity.
# --------------------------------------------------------------------------------------------


def choose_replica(requested: str, profile: str | None, report: Report) -> str | None:
    if requested == "none":
        return None
    if requested in ("fd24", "fd25"):
        return f"{REPLICA_PACKAGE}.{requested}"
    if requested != "auto":
        return requested
    mapping = {"fastdeploy-2.4": "fd24", "fastdeploy-2.5": "fd25", "fastdeploy-2.6+": "fd25"}
    if profile not in mapping:
        report.add("surface", "replica", "SKIP", f"no replica for profile {profile!r}; pass --replica")
        return None
    if profile == "fastdeploy-2.6+":
        report.add("surface", "replica", "INFO", "2.6+/develop tree: compared with the 2.5 replica (closest)")
    return f"{REPLICA_PACKAGE}.{mapping[profile]}"


def check_signatures(fd: Side, rep: Side, report: Report) -> None:
    for rel, qualname in SIGNATURE_POINTS:
        item = f"{rel}:{qualname}"
        real, real_route = describe_signature(fd, rel, qualname)
        mine, mine_route = describe_signature(rep, rel, qualname)
        if real is None and mine is None:
            continue  # absent on both sides: this point belongs to another FastDeploy line
        if real is None:
            report.add("signature", item, "EXTRA", f"replica defines it, FastDeploy does not ({mine_route})")
        elif mine is None:
            where = "module absent" if rep.resolve(rel) is None else "not defined"
            report.add("signature", item, "MISSING", f"replica: {where}; FD {_format_params(real[1])}")
        else:
            diff = compare_signatures(real, mine)
            route = f"[{real_route}/{mine_route}]"
            if diff:
                report.add("signature", item, "MISMATCH", f"{diff} {route}")
            else:
                report.add("signature", item, "OK", f"{_format_params(real[1])} {route}")


def check_fields(fd: Side, rep: Side, report: Report) -> None:
    for rel, cls_name in FIELD_POINTS:
        item = f"{rel}:{cls_name} fields"
        real, real_route = record_fields(fd, rel, cls_name)
        mine, mine_route = record_fields(rep, rel, cls_name)
        if real is None and mine is None:
            continue
        if real is None:
            report.add("fields", item, "EXTRA", "replica defines it, FastDeploy does not")
            continue
        if mine is None:
            report.add("fields", item, "MISSING", "replica does not define it; FD: " + ", ".join(n for n, _ in real))
            continue
        rnames, pnames = [n for n, _ in real], [n for n, _ in mine]
        notes = []
        if rnames != pnames:
            notes.extend(missing_and_extra(rnames, pnames))
            common_r = [n for n in rnames if n in pnames]
            common_p = [n for n in pnames if n in rnames]
            if common_r != common_p:
                notes.append("order differs: FD " + ", ".join(common_r) + " | replica " + ", ".join(common_p))
        rdef = {n for n, d in real if d}
        pdef = {n for n, d in mine if d}
        shared = set(rnames) & set(pnames)
        if (rdef & shared) != (pdef & shared):
            only_fd = sorted((rdef - pdef) & shared)
            only_rep = sorted((pdef - rdef) & shared)
            if only_fd:
                notes.append("default in FD only: " + ", ".join(only_fd))
            if only_rep:
                notes.append("default in replica only: " + ", ".join(only_rep))
        route = f"[{real_route}/{mine_route}]"
        if notes:
            report.add("fields", item, "MISMATCH", "; ".join(notes) + f" {route}")
        else:
            report.add("fields", item, "OK", f"{len(rnames)} fields in order {route}")


def check_import_lists(fd: Side, rep: Side, report: Report) -> None:
    # Op names the modules take from ops.gpu (the CUDA branch of FastDeploy's platform switch).
    for rel in OPS_IMPORTERS:
        item = f"{rel}: from ops.gpu import"
        real = cuda_import_names(fd.tree(rel), ("ops.gpu",))
        if rep.tree(rel) is None:
            report.add("imports", item, "MISSING", f"replica module absent; FD imports {len(real)}: {', '.join(real)}")
            continue
        # The replica may name its op module differently; accept any `...ops` / `...gpu` source.
        mine = cuda_import_names(rep.tree(rel), ("ops.gpu", "ops", "gpu", "ops_gpu", "gpu_ops"))
        missing = [n for n in real if n not in mine]
        extra = [n for n in mine if n not in real]
        if missing or extra:
            detail = []
            if missing:
                detail.append("replica lacks " + ", ".join(missing))
            if extra:
                detail.append("replica adds " + ", ".join(extra))
            report.add("imports", item, "MISMATCH", "; ".join(detail))
        else:
            report.add("imports", item, "OK", f"{len(real)} names: {', '.join(real)}")
        other = [(names, guard) for names, guard in imports_from(fd.tree(rel), ("ops.gpu",))
                 if not _is_cuda_guard(guard)]
        for names, guard in other:
            positive = [c for c in guard if not c.startswith("not (")] or ["else"]
            report.add("imports", f"{rel}: ops.gpu if {' and '.join(positive)}", "INFO", ", ".join(names))

    # Names the runners take from pre_and_post_process: patched where imported (surface §2.7).
    replica_post = rep.tree(POSTPROC)
    replica_defs = set()
    if replica_post is not None:
        for node in replica_post.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                replica_defs.add(node.name)
            elif isinstance(node, ast.Assign):
                replica_defs.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.ImportFrom, ast.Import)):
                replica_defs.update((a.asname or a.name).split(".")[0] for a in node.names)
    for rel in POSTPROC_IMPORTERS:
        real_groups = imports_from(fd.tree(rel), ("pre_and_post_process",))
        real = [n for names, _ in real_groups for n in names]
        if not real:
            continue
        item = f"{rel}: from pre_and_post_process import"
        undefined = [n for n in real if replica_post is not None and n not in replica_defs]
        if replica_post is None:
            report.add("imports", item, "MISSING", "replica has no pre_and_post_process; FD: " + ", ".join(real))
            continue
        if rep.tree(rel) is None:
            status = "MISSING" if undefined else "INFO"
            detail = f"FD imports {', '.join(real)}; replica has no {rel.rsplit('.', 1)[1]}"
            if undefined:
                detail += "; replica pre_and_post_process lacks " + ", ".join(undefined)
            else:
                detail += " (all names exist in the replica's pre_and_post_process)"
            report.add("imports", item, status, detail)
            continue
        mine = [n for names, _ in imports_from(rep.tree(rel), ("pre_and_post_process",)) for n in names]
        missing = [n for n in real if n not in mine]
        extra = [n for n in mine if n not in real]
        if missing or extra or undefined:
            detail = []
            if missing:
                detail.append("replica runner lacks " + ", ".join(missing))
            if extra:
                detail.append("replica runner adds " + ", ".join(extra))
            if undefined:
                detail.append("replica pre_and_post_process lacks " + ", ".join(undefined))
            report.add("imports", item, "MISMATCH", "; ".join(detail))
        else:
            report.add("imports", item, "OK", ", ".join(real))


def _share_inputs_function(side: Side):
    """The function that creates share_inputs on this side, and where it was found."""
    for rel, qualname, style in (
        (RUNNER, "GPUModelRunner._init_share_inputs", "dict"),
        (INPUT_BATCH, "InputBatch.init_share_inputs", "attr"),
    ):
        node = side.ast_def(rel, qualname)
        if node is not None:
            return share_input_specs(node, style), f"{rel}:{qualname}"
    return None, None


def fd_share_inputs(fd: Side, report: Report):
    """FastDeploy's share_inputs keys with dtype/shape/placement; core keys listed as facts."""
    real, real_where = _share_inputs_function(fd)
    if real is None:
        report.add("fd share_inputs", "initialiser", "INFO",
                   "no GPUModelRunner._init_share_inputs / InputBatch.init_share_inputs found")
        return None, None
    report.facts["share_inputs_keys_fd"] = {
        "where": real_where,
        "count": len(real),
        "keys": {k: [s.text() + (f" if {s.guard}" if s.guard else "") for s in v] for k, v in real.items()},
    }
    report.add("fd share_inputs", "initialiser", "INFO", f"{real_where}: {len(real)} keys")
    for core in CORE_SHARE_INPUT_KEYS:
        present = [k for k in (core, f"self.{core}") if k in real]
        for key in present:
            text = " | ".join(s.text() + (f" [if {s.guard}]" if s.guard else "") for s in real[key])
            report.add("fd share_inputs", key, "INFO", text)
        if not present:
            report.add("fd share_inputs", core, "INFO", "absent")
    return real, real_where


def fd_import_lists(fd: Side, report: Report) -> None:
    """FastDeploy's own import lists at the patch points (reported with or without a replica)."""
    for rel in OPS_IMPORTERS:
        names = cuda_import_names(fd.tree(rel), ("ops.gpu",))
        report.add("fd imports", f"{rel}: from ops.gpu import", "INFO", f"{len(names)}: {', '.join(names)}")
    for rel in POSTPROC_IMPORTERS:
        names = [n for group, _ in imports_from(fd.tree(rel), ("pre_and_post_process",)) for n in group]
        if names:
            report.add("fd imports", f"{rel}: from pre_and_post_process import", "INFO", ", ".join(names))


def check_share_inputs(fd: Side, rep: Side, report: Report) -> None:
    real, real_where = _share_inputs_function(fd)
    mine, mine_where = _share_inputs_function(rep)
    if real is None:
        report.add("share_inputs", "initialiser", "SKIP",
                   "FastDeploy: no _init_share_inputs / InputBatch.init_share_inputs")
        return
    if mine is None:
        report.add("share_inputs", "initialiser", "MISSING",
                   f"replica has no {real_where.split(':')[1]}; FD creates {len(real)} keys there")
        return
    if real_where != mine_where:
        report.add("share_inputs", "initialiser", "MISMATCH", f"FD {real_where}, replica {mine_where}")
    else:
        report.add("share_inputs", "initialiser", "OK", f"{real_where}: FD {len(real)} keys, replica {len(mine)}")
    for key in sorted(mine):
        if key not in real:
            report.add("share_inputs", key, "EXTRA", "replica creates it, FastDeploy does not: " + mine[key][0].text())
            continue
        notes = []
        for attr in ("dtype", "shape", "place"):
            real_values = {getattr(s, attr) for s in real[key] if getattr(s, attr)}
            mine_values = {getattr(s, attr) for s in mine[key] if getattr(s, attr)}
            if real_values and mine_values and not mine_values <= real_values:
                notes.append(f"{attr} FD {sorted(real_values)} vs replica {sorted(mine_values)}")
        fd_text = " | ".join(s.text() + (f" [if {s.guard}]" if s.guard else "") for s in real[key])
        if notes:
            report.add("share_inputs", key, "MISMATCH", "; ".join(notes) + f" (FD: {fd_text})")
        else:
            report.add("share_inputs", key, "OK", fd_text)
    absent = sorted(k for k in real if k not in mine)
    def is_core(key: str) -> bool:
        return key.removeprefix("self.") in CORE_SHARE_INPUT_KEYS

    for key in (k for k in absent if is_core(k)):
        report.add("share_inputs", key, "MISSING", "FD: " + " | ".join(s.text() for s in real[key]))
    rest = [k for k in absent if not is_core(k)]
    if rest:
        # '*' marks keys FastDeploy creates only under a condition (speculative decoding, EP, ...).
        names = [k + ("*" if all(s.guard for s in real[k]) else "") for k in rest]
        report.add("share_inputs", "other FD keys", "INFO",
                   f"{len(rest)} not in the replica (* = conditional in FD): " + ", ".join(names))


# --------------------------------------------------------------------------------------------
# Section 3: behaviour of the pure-tensor patch points, run on both sides with the same inputs.
# --------------------------------------------------------------------------------------------


def _place_kind(tensor) -> str:
    place = str(getattr(tensor, "place", "?")).lower()
    if "pinned" in place:
        return "pinned"
    if "cpu" in place:
        return "cpu"
    return "device" if "gpu" in place or "xpu" in place else place


def _tensor_summary(tensor):
    import numpy as np

    return np.asarray(tensor.numpy()), str(tensor.dtype).rsplit(".", 1)[-1], list(tensor.shape), _place_kind(tensor)


def _compare_tensors(name: str, real, mine) -> list[str]:
    import numpy as np

    r_val, r_dtype, r_shape, r_place = _tensor_summary(real)
    m_val, m_dtype, m_shape, m_place = _tensor_summary(mine)
    notes = []
    if r_dtype != m_dtype:
        notes.append(f"{name} dtype {r_dtype} vs {m_dtype}")
    if r_shape != m_shape:
        notes.append(f"{name} shape {r_shape} vs {m_shape}")
    elif not np.array_equal(r_val, m_val):
        diff = np.abs(r_val.astype("float64") - m_val.astype("float64")).max()
        notes.append(f"{name} values differ (max abs diff {diff:.3g})")
    if r_place != m_place:
        notes.append(f"{name} place {r_place} vs {m_place}")
    return notes


def _describe_value_difference(name: str, real, mine) -> str:
    import numpy as np

    try:
        r, m = np.asarray(real, dtype="float64"), np.asarray(mine, dtype="float64")
    except (TypeError, ValueError):
        return f"{name}: {real!r} vs {mine!r}"
    if r.shape != m.shape:
        return f"{name} shape {list(r.shape)} vs {list(m.shape)}"
    return f"{name} values differ (max abs diff {np.abs(r - m).max():.3g})"


def _behaviour_inputs():
    import numpy as np
    import paddle

    rng = np.random.default_rng(20240601)
    logits = paddle.to_tensor(rng.standard_normal((4, 64)).astype("float32"))
    token_ids = paddle.to_tensor(np.array([1, 5, 7, 63], dtype="int64"))
    return logits, token_ids


def check_behaviour(fd: Side, rep: Side, report: Report) -> None:
    """Same inputs through FastDeploy's and the replica's Sampler/LogprobsTensors; bitwise compare.

    Only the methods that need no runner state are run (on a ``Sampler.__new__`` instance), which
    is what FastDeploy's own CPU tests do. Everything is small: 4 rows, vocabulary 64.
    """
    section = "behaviour"
    if importlib.util.find_spec("paddle") is None:
        report.add(section, "paddle", "SKIP", "paddle is not importable")
        return
    sides = {}
    for side in (fd, rep):
        sampler = side.obj(SAMPLER, "Sampler") if side.load(SAMPLER) is not None else None
        tensors = side.obj(OUTPUT, "LogprobsTensors") if side.load(OUTPUT) is not None else None
        sides[side.label] = (sampler, tensors)
    (fd_sampler, fd_tensors), (rep_sampler, rep_tensors) = sides[fd.label], sides[rep.label]

    def run_both(item: str, call):
        """call(sampler_cls, tensors_cls) -> list of (name, tensor) or other comparable value."""
        results = []
        for sampler, tensors in ((fd_sampler, fd_tensors), (rep_sampler, rep_tensors)):
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    results.append(("ok", call(sampler, tensors)))
            except Exception as exc:  # noqa: BLE001 - a failing call is the finding
                results.append(("error", f"{type(exc).__name__}: {exc}".splitlines()[0][:200]))
        (fd_state, fd_value), (rep_state, rep_value) = results
        if fd_state == "error" and rep_state == "error":
            report.add(section, item, "SKIP", f"fails on both sides: FD {fd_value}; replica {rep_value}")
            return
        if fd_state == "error":
            report.add(section, item, "INFO", f"FastDeploy call fails here ({fd_value}); replica runs")
            return
        if rep_state == "error":
            report.add(section, item, "MISMATCH", f"replica raises {rep_value}; FastDeploy runs")
            return
        notes = []
        for (name, real), (_name, mine) in zip(fd_value, rep_value):
            if hasattr(real, "numpy") and hasattr(mine, "numpy"):
                notes.extend(_compare_tensors(name, real, mine))
            elif real != mine:
                notes.append(_describe_value_difference(name, real, mine))
        if len(fd_value) != len(rep_value):
            notes.append(f"{len(fd_value)} results vs {len(rep_value)}")
        if notes:
            report.add(section, item, "MISMATCH", "; ".join(notes))
        else:
            report.add(section, item, "OK", "bitwise equal: " + ", ".join(n for n, _ in fd_value))

    logits, token_ids = _behaviour_inputs()

    def fields(result):
        return [(n, getattr(result, n)) for n in ("logprob_token_ids", "logprobs", "selected_token_ranks")]

    for label, side, rel, obj in ((fd.label, fd, SAMPLER, fd_sampler), (rep.label, rep, SAMPLER, rep_sampler),
                                  (fd.label, fd, OUTPUT, fd_tensors), (rep.label, rep, OUTPUT, rep_tensors)):
        if obj is None:
            why = side.import_errors.get(rel, "not defined")
            report.add(section, f"{label} {rel}", "SKIP", f"not importable ({why}): its probes are skipped")
    if fd_sampler is not None and rep_sampler is not None:
        run_both("Sampler.compute_logprobs(logits)",
                 lambda S, T: [("logprobs", S.__new__(S).compute_logprobs(logits.clone()))])
        for k in (0, 3):
            for label, ids in (("[N]", token_ids), ("[N,1]", token_ids.unsqueeze(-1))):
                run_both(
                    f"Sampler.gather_logprobs(k={k}, token_ids {label})",
                    lambda S, T, k=k, ids=ids: fields(
                        S.__new__(S).gather_logprobs(S.__new__(S).compute_logprobs(logits.clone()), k, ids.clone())
                    ),
                )
    if fd_tensors is not None and rep_tensors is not None:
        run_both("LogprobsTensors.empty_cpu(2, 3)", lambda S, T: [
            (n, (str(t.dtype).rsplit(".", 1)[-1], list(t.shape), _place_kind(t)))
            for n, t in fields(T.empty_cpu(2, 3))
        ])

        def sliced(S, T):
            result = S.__new__(S).gather_logprobs(S.__new__(S).compute_logprobs(logits.clone()), 3, token_ids.clone())
            return fields(result.slice_rows(1, 3))

        def listed(S, T):
            result = S.__new__(S).gather_logprobs(S.__new__(S).compute_logprobs(logits.clone()), 3, token_ids.clone())
            lists = result.tolists()
            return [(n, getattr(lists, n)) for n in ("logprob_token_ids", "logprobs", "sampled_token_ranks")]

        if fd_sampler is not None and rep_sampler is not None:
            run_both("LogprobsTensors.slice_rows(1, 3)", sliced)
            run_both("LogprobsTensors.tolists()", listed)


def check_imports_status(side: Side, report: Report, section: str) -> None:
    for rel in IMPORT_ORDER:
        if side.resolve(rel) is None:
            continue
        side.load(rel)
        if rel in side.import_errors:
            report.add(section, f"import {side.root}.{rel}", "INFO",
                       f"{side.import_errors[rel]} - checked from source (AST)")
        else:
            report.add(section, f"import {side.root}.{rel}", "OK", "imported")


# --------------------------------------------------------------------------------------------
# Output.
# --------------------------------------------------------------------------------------------


def render(report: Report) -> str:
    lines = []
    lines.append(f"FastDeploy: {report.facts.get('fastdeploy_location', '?')}")
    for key in ("paddle", "paddle_cuda", "ops_gpu", "fastdeploy___version__", "fastdeploy_hasattr_always_true",
                "replica_root"):
        if key in report.facts:
            lines.append(f"  {key}: {report.facts[key]}")
    width = max((len(r.item) for r in report.rows), default=10)
    width = min(width, 70)
    section = None
    for row in report.rows:
        if row.section != section:
            section = row.section
            lines.append("")
            lines.append(f"== {section}")
        lines.append(f"  {row.status:<8} {row.item:<{width}}  {row.detail}")
    counts: dict[str, int] = {}
    for row in report.rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    lines.append("")
    lines.append("summary: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def run(args) -> Report:
    report = Report(fd_src=args.fd_src)
    prepare_environment(args.fd_src, report)
    try:
        fd = Side(FD_ROOT, "FastDeploy")
        import_fastdeploy(fd, report)
        check_imports_status(fd, report, "environment")
        profile = check_profile(fd, args.fd_src, report)
        fd_share_inputs(fd, report)
        fd_import_lists(fd, report)
        replica_root = choose_replica(args.replica, profile, report)
        if replica_root is not None:
            report.facts["replica_root"] = replica_root
            try:
                present = importlib.util.find_spec(replica_root) is not None
            except (ImportError, ValueError):
                present = False
            if not present:
                report.add("surface", "replica", "SKIP", f"{replica_root} does not exist (yet)")
            else:
                rep = Side(replica_root, "replica")
                check_imports_status(rep, report, "replica")
                check_signatures(fd, rep, report)
                check_fields(fd, rep, report)
                check_import_lists(fd, rep, report)
                check_share_inputs(fd, rep, report)
                if not args.no_behaviour:
                    check_behaviour(fd, rep, report)
    finally:
        scratch = report.facts.get("scratch_dir")
        if scratch and not args.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd-src", help="FastDeploy checkout (holds fastdeploy/) or the fastdeploy package folder; "
                                         "default: the installed fastdeploy")
    parser.add_argument("--replica", default="auto",
                        help="auto (by detected profile), fd24, fd25, none, or a dotted module root")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 on any MISMATCH, MISSING or EXTRA")
    parser.add_argument("--no-behaviour", action="store_true",
                        help="skip running Sampler/LogprobsTensors methods on both sides")
    parser.add_argument("--keep-scratch", action="store_true", help="keep FastDeploy's log/metrics scratch folder")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        out = {
            "fd_src": report.fd_src,
            "facts": report.facts,
            "rows": [r.as_dict() for r in report.rows],
            "problems": len(report.problems()),
        }
        print(json.dumps(out, indent=2, default=str))
    else:
        print(render(report))
    if args.strict and report.problems():
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
