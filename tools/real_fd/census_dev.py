"""Section ``census develop``: (dev) the host waits of develop's plain decode step, read by AST.

The census rows ``fddev-*`` of ``fd-async-copy bench`` (two host waits per plain decode step,
overlap on or off, with or without the plugin) come from the replica ``...reference.fddev``. They
hold for real FastDeploy develop only if its code has this shape (rows ``(dev)``):

1. the runner has no ``not_need_stop()`` and no ``_preprocess_and_execute_model`` (#6356), and has
   ``execute_model_normal`` / ``execute_model_overlap`` / ``_preprocess`` / ``_postprocess`` /
   ``_save_model_output``;
2. the waits: ``.synchronize()`` calls, exactly ``post_process_event`` in ``execute_model_normal``;
   ``_cached_post_process_event`` then ``token_num_event`` in ``execute_model_overlap``;
   ``token_num_event`` in ``_resolve_current_launch_token_num``; none in ``_prepare_inputs``,
   ``_preprocess``, ``_save_model_output``, and in ``_postprocess`` only under
   ``if self.speculative_decoding``; ``.numpy()`` in those methods only of the pinned
   ``seq_lens_this_time_cpu`` / ``is_block_step_cpu``; no ``.cpu()``/``.item()`` of a tensor
   (``.sum().item()`` of a numpy array is host arithmetic);
3. the seed is on the device (T gone, #6765): ``InputBatch`` makes ``infer_seed`` without
   ``.cpu()``/``.pin_memory()``, the runner's ``infer_seed_increment`` likewise;
4. ``insert_tasks_v1`` reads no device value: no ``if`` on ``is_block_step`` (I1 gone, #6356), no
   ``.numpy()``/``.item()``/``.cpu()``, no ``set_stop``;
5. ``save_output_normal``'s V1 (ZMQ) path hands ``_build_stream_transfer_data`` the pinned
   ``["sampled_token_ids"]``, not ``sampler_output.sampled_token_ids`` (a blocking copy in 2.5);
6. ``_postprocess`` copies ``["sampled_token_ids"]`` with ``copy_(..., False)`` before
   ``post_process_event.record()`` and copies no ``not_need_stop`` to the host;
7. the overlap schedule is on by default (#6668): ``EngineArgs.enable_overlap_schedule = True``
   (engine/args_utils.py), on the replica ``SchedulerConfig.enable_overlap_schedule = True``.

Checked on the FastDeploy side for ``fastdeploy-2.6+`` and on the replica ``...reference.fddev``,
which spells the save's event through the copy backend: ``current_backend().wait(<event>, ...)`` is
``<event>.synchronize()``, ``post_process_event = current_backend().record(...)`` its ``record()``,
``copy_async(dst, src, label)`` is ``dst.copy_(src, False)`` (as ``token_num_fd25`` reads it).
"""

from __future__ import annotations

import ast

from .common import ENGINE_ARGS, INPUT_BATCH, POSTPROC, RUNNER, Report
from .side import Side
from .step_syncs import _methods

SECTION = "census develop"
PROFILE = "fastdeploy-2.6+"
CLASS, BATCH = "GPUModelRunner", "InputBatch"
PINNED = ("seq_lens_this_time_cpu", "is_block_step_cpu")

ROW_SHAPE = "(dev) 1. the runner: no not_need_stop(), develop's step split"
ROW_WAITS = "(dev) 2. the step's waits: two events per step, no other host read"
ROW_SEED = "(dev) 3. infer_seed and its increment on the device (T gone)"
ROW_INSERT = "(dev) 4. insert_tasks_v1 reads no device value (I1 gone)"
ROW_ZMQ = "(dev) 5. save_output_normal's ZMQ path sends the pinned sampled ids"
ROW_COPY = "(dev) 6. _postprocess: the sampled ids' copy before post_process_event, no flag copy"
ROW_DEFAULT = "(dev) 7. the overlap schedule on by default"
ROWS = (ROW_SHAPE, ROW_WAITS, ROW_SEED, ROW_INSERT, ROW_ZMQ, ROW_COPY, ROW_DEFAULT)

#: method -> the events it waits on, in order (``.synchronize()`` receivers)
WAITS = {
    "execute_model_normal": ["post_process_event"],
    "execute_model_overlap": ["_cached_post_process_event", "token_num_event"],
    "_resolve_current_launch_token_num": ["token_num_event"],
    "_prepare_inputs": [],
    "_preprocess": [],
    "_save_model_output": [],
}
REQUIRED = ("execute_model_normal", "execute_model_overlap", "_preprocess", "_postprocess", "_save_model_output",
            "_resolve_current_launch_token_num")


def _key(node) -> str | None:
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _calls(func, attr: str) -> list[ast.Call]:
    out = [n for n in ast.walk(func)
           if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr]
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))


def _backend_call(call: ast.Call, attr: str) -> bool:
    """The replica's ``current_backend().<attr>(...)``."""
    return (isinstance(call.func, ast.Attribute) and call.func.attr == attr
            and ast.unparse(call.func.value) in ("current_backend()", "backend"))


def _waits(func) -> list[ast.Call]:
    """``<event>.synchronize()`` and the replica's ``current_backend().wait(<event>, ...)``."""
    out = [c for c in _calls(func, "synchronize") if not _backend_call(c, "synchronize")]
    out += [c for c in _calls(func, "wait") if _backend_call(c, "wait") and c.args]
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))


def _receiver(call: ast.Call) -> str:
    value = call.args[0] if _backend_call(call, "wait") else call.func.value
    return value.attr if isinstance(value, ast.Attribute) else ast.unparse(value)


def _under_speculative(func, node) -> bool:
    """``node`` sits in the body of an ``if self.speculative_decoding`` of ``func``."""
    for branch in ast.walk(func):
        if (isinstance(branch, ast.If) and ast.unparse(branch.test) == "self.speculative_decoding"
                and any(node is n for stmt in branch.body for n in ast.walk(stmt))):
            return True
    return False


def _check_shape(methods) -> tuple[list, str]:
    problems = [f"has {name}()" for name in ("not_need_stop", "_preprocess_and_execute_model") if name in methods]
    problems += [f"no {name}()" for name in REQUIRED if name not in methods]
    return problems, ", ".join(REQUIRED)


def _check_waits(methods, file: str) -> tuple[list, str]:
    problems, seen = [], []
    for name, expected in WAITS.items():
        func = methods.get(name)
        if func is None:
            problems.append(f"no {name}()")
            continue
        got = [_receiver(c) for c in _waits(func)]
        if got != expected:
            problems.append(f"{name} waits on {got or 'nothing'}, expected {expected or 'nothing'}")
        seen += [f"{file}:{c.lineno} {_receiver(c)}" for c in _waits(func)]
    post = methods.get("_postprocess")
    if post is not None:
        for call in _waits(post):
            if not _under_speculative(post, call):
                problems.append(f"_postprocess :{call.lineno} waits on {_receiver(call)} outside speculative decoding")
    for name in (*WAITS, "_predict_next_launch_token_num"):
        func = methods.get(name)
        if func is None:
            continue
        for call in _calls(func, "numpy"):
            if _key(call.func.value) not in PINNED:
                problems.append(f"{name} :{call.lineno} {ast.unparse(call)[:80]}")
        for attr in ("cpu", "item"):
            for call in _calls(func, attr):
                inner = call.func.value
                host_sum = (attr == "item" and isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                            and inner.func.attr == "sum")
                if not host_sum:
                    problems.append(f"{name} :{call.lineno} {ast.unparse(call)[:80]}")
    return problems, "; ".join(seen)


def _creates_on_host(value) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("cpu", "pin_memory")
               for n in ast.walk(value))


def _assigns(tree, attr: str) -> list[ast.Assign]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == attr and ast.unparse(t.value) == "self" for t in n.targets)]


def _check_seed(methods, batch) -> tuple[list, str]:
    problems, where = [], []
    seeds = [] if batch is None else _assigns(batch, "infer_seed")
    creations = [a for a in seeds if isinstance(a.value, ast.Call)]
    if batch is None:
        problems.append(f"{BATCH} not found (source)")
    elif not creations:
        problems.append(f"{BATCH} creates no infer_seed")
    increments = [a for f in methods.values() for a in _assigns(f, "infer_seed_increment")]
    if not increments:
        problems.append(f"{CLASS} creates no infer_seed_increment")
    for label, found in (("infer_seed", creations), ("infer_seed_increment", increments)):
        for node in found:
            if _creates_on_host(node.value):
                problems.append(f"{label} :{node.lineno} on the host: {ast.unparse(node.value)[:80]}")
            else:
                where.append(f"{label} :{node.lineno}")
    return problems, ", ".join(where)


def _check_insert(methods) -> tuple[list, str]:
    func = methods.get("insert_tasks_v1")
    if func is None:
        return ["no insert_tasks_v1()"], ""
    problems = []
    for node in ast.walk(func):
        if isinstance(node, ast.If) and any(_key(n) == "is_block_step" for n in ast.walk(node.test)):
            problems.append(f":{node.lineno} if {ast.unparse(node.test)[:80]}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("numpy", "item", "cpu")):
            problems.append(f":{node.lineno} {ast.unparse(node)[:80]}")
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("set_stop"):
            problems.append(f":{node.lineno} {ast.unparse(node)[:80]}")
    return problems, ""


def _check_zmq(side: Side) -> tuple[list, str]:
    func = side.ast_def(POSTPROC, "save_output_normal")
    if func is None:
        return [f"{POSTPROC}:save_output_normal not found (source)"], ""
    v1 = [n for n in ast.walk(func) if isinstance(n, ast.If) and "FD_USE_GET_SAVE_OUTPUT_V1" in ast.unparse(n.test)]
    if not v1:
        return ["no `if envs.FD_USE_GET_SAVE_OUTPUT_V1` branch"], ""
    builds = [n for stmt in v1[0].body for n in ast.walk(stmt)
              if isinstance(n, ast.Call) and ast.unparse(n.func) == "_build_stream_transfer_data"]
    if len(builds) != 1 or not builds[0].args:
        return [f"{len(builds)} _build_stream_transfer_data calls in the V1 branch, expected 1"], ""
    first = builds[0].args[0]
    if _key(first) != "sampled_token_ids":
        return [f":{builds[0].lineno} sends {ast.unparse(first)[:80]}"], ""
    return [], f":{builds[0].lineno} {ast.unparse(first)}"


def _check_copy(methods) -> tuple[list, str]:
    func = methods.get("_postprocess")
    if func is None:
        return ["no _postprocess()"], ""
    copies = [c for c in _calls(func, "copy_") if _key(c.func.value) == "sampled_token_ids"]
    replica_copies = [n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                      and n.func.id == "copy_async" and n.args and _key(n.args[0]) == "sampled_token_ids"]
    records = [c for c in _calls(func, "record") if _receiver(c) == "post_process_event"]
    records += [a.value for a in ast.walk(func) if isinstance(a, ast.Assign) and len(a.targets) == 1
                and ast.unparse(a.targets[0]) == "post_process_event" and isinstance(a.value, ast.Call)
                and _backend_call(a.value, "record")]
    problems = []
    if copies and (len(copies[0].args) < 2 or ast.unparse(copies[0].args[1]) != "False"):
        problems.append(f":{copies[0].lineno} a blocking copy: {ast.unparse(copies[0])[:80]}")
    copies = sorted(copies + replica_copies, key=lambda n: (n.lineno, n.col_offset))
    records.sort(key=lambda n: (n.lineno, n.col_offset))
    if not copies:
        problems.append('no ["sampled_token_ids"].copy_(...)')
    if not records:
        problems.append("no post_process_event.record()")
    elif copies and (copies[0].lineno, copies[0].col_offset) > (records[0].lineno, records[0].col_offset):
        problems.append(f"the copy :{copies[0].lineno} comes after the record :{records[0].lineno}")
    for call in _calls(func, "copy_"):
        if _key(call.func.value) == "not_need_stop":
            problems.append(f":{call.lineno} {ast.unparse(call)[:80]}")
    for call in ast.walk(func):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "copy_async"
                and call.args and _key(call.args[0]) == "not_need_stop"):
            problems.append(f":{call.lineno} {ast.unparse(call)[:80]}")
    detail = f"copy :{copies[0].lineno}, record :{records[0].lineno}" if copies and records else ""
    return problems, detail


def _default(side: Side, replica: bool) -> tuple[list, str]:
    rel, cls = ("config", "SchedulerConfig") if replica else (ENGINE_ARGS, "EngineArgs")
    node = side.ast_def(rel, cls)
    if node is None:
        return [f"{rel}:{cls} not found (source)"], ""
    for stmt in node.body:
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and stmt.target.id == "enable_overlap_schedule"):
            value = ast.unparse(stmt.value) if stmt.value is not None else "(no default)"
            if value != "True":
                return [f":{stmt.lineno} enable_overlap_schedule = {value}"], ""
            return [], f"{rel.replace('.', '/')}.py:{stmt.lineno} {cls}.enable_overlap_schedule = True"
    return [f"{cls} has no enable_overlap_schedule field"], ""


def check_census_dev(side: Side, report: Report, profile: str | None, *, replica: bool = False) -> None:
    section = f"{SECTION} replica" if replica else SECTION
    if not replica and profile != PROFILE:
        report.add(section, "profile", "SKIP", f"the develop census rows are for {PROFILE}; this tree is {profile}")
        return
    cls = side.ast_def(RUNNER, CLASS)
    if not isinstance(cls, ast.ClassDef):
        report.add(section, ROW_SHAPE, "MISMATCH", f"{side.root}.{RUNNER}:{CLASS} not found (source)")
        return
    methods = _methods(cls)
    file = RUNNER.replace(".", "/") + ".py"
    for row, (problems, detail) in (
            (ROW_SHAPE, _check_shape(methods)),
            (ROW_WAITS, _check_waits(methods, file)),
            (ROW_SEED, _check_seed(methods, side.ast_def(INPUT_BATCH, BATCH))),
            (ROW_INSERT, _check_insert(methods)),
            (ROW_ZMQ, _check_zmq(side)),
            (ROW_COPY, _check_copy(methods)),
            (ROW_DEFAULT, _default(side, replica))):
        report.add_checked(section, row, problems, detail)
