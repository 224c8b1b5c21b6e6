"""Section ``step_syncs`` on FastDeploy 2.5: (t25) the token-count waits answered from the host shadow.

On 2.5 ``patches/step_syncs.py`` also removes the two ``token_num_event`` waits of a plain decode step
(``TokenShadow``): a host shadow of ``seq_lens_this_time_buffer``, ``seq_lens_encoder``,
``is_block_step``, ``step_seq_lens_decoder`` and ``block_tables``, whose device changes come from a
snapshot copied right after ``update_inputs_v1`` and whose host writes are watched in
``insert_tasks_v1``; ``recover_decode_task`` is replayed on it. Inside the plugin's ``_prepare_inputs``
``paddle.device.cuda.create_event()`` returns a proxy whose ``synchronize()`` is owed, not made; the
owed wait runs before a read of a pinned count the shadow does not answer. That is exact only if
FastDeploy's code has this shape, read here by AST:

1. ``_prepare_inputs``: ``recover_decode_task(...)`` first, then the two pinned copies
   ``share_inputs["seq_lens_this_time_cpu"].copy_(share_inputs["seq_lens_this_time"], False)`` and
   ``share_inputs["is_block_step_cpu"].copy_(share_inputs["is_block_step"], False)``, then
   ``token_num_event = paddle.device.cuda.create_event()`` (the method's only event),
   ``token_num_event.record()``, and the wait ``token_num_event.synchronize()`` directly followed by
   the one read ``token_num = share_inputs["seq_lens_this_time_cpu"].numpy().sum().item()``; it returns
   ``token_num_event``;
2. ``_postprocess``: ``token_num_event.synchronize()`` once, the pinned counts read only as
   ``share_inputs[...].numpy().sum().item()`` after it and before ``post_process(...)``; no other runner
   method uses the two pinned buffers (``InputBatch`` creates them, and swaps them in
   ``swap_states``: PD reorder, where the plugin keeps FastDeploy's waits - listed);
3. the snapshot point: ``post_process_normal`` calls ``update_inputs_v1`` through the module's global
   name; ``_postprocess`` calls ``post_process(...)`` before ``post_process_event.record()``, and
   ``_save_model_output`` waits ``post_process_event.synchronize()`` before anything else;
4. ``insert_tasks_v1`` uses the shadowed tensors only as ``X[key] = value`` (keys and values are
   checked at run time: a non-basic key or a device value loses the shadow), the ``is_block_step``
   if-test read, the ``seq_lens_this_time`` view rebind, or a write through that view (run time: lost).

Checked on the FastDeploy side for ``fastdeploy-2.5`` and on the replica ``...reference.fd25``.
"""

from __future__ import annotations

import ast

from .common import INPUT_BATCH, POSTPROC, RUNNER, Report
from .side import Side
from .step_syncs import _methods

CLASS, BATCH = "GPUModelRunner", "InputBatch"
PINNED = ("seq_lens_this_time_cpu", "is_block_step_cpu")
SHADOWED = ("seq_lens_this_time_buffer", "seq_lens_encoder", "is_block_step", "step_seq_lens_decoder", "block_tables")
VIEW = "seq_lens_this_time"

ROW_PREPARE = "(t25) 1. _prepare_inputs: recover, the pinned copies, token_num_event, its one read"
ROW_POST = "(t25) 2. _postprocess: the event's wait and the overlap reads; no other reader"
ROW_SNAP = "(t25) 3. the snapshot point: update_inputs_v1 before post_process_event, waited by the save"
ROW_INSERT = "(t25) 4. insert_tasks_v1: the shadowed tensors only set by item"
ROWS = (ROW_PREPARE, ROW_POST, ROW_SNAP, ROW_INSERT)


def _key(node) -> str | None:
    """``<x>["key"]`` -> ``"key"``."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _stmts(func) -> list:
    """Every statement of ``func``, in source order."""
    out = [n for n in ast.walk(func) if isinstance(n, ast.stmt) and n is not func]
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))


def _is_read(node, key: str) -> bool:
    """``<x>["key"].numpy().sum().item()``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item"
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Attribute)
            and node.func.value.func.attr == "sum" and isinstance(node.func.value.func.value, ast.Call)
            and isinstance(node.func.value.func.value.func, ast.Attribute)
            and node.func.value.func.value.func.attr == "numpy" and _key(node.func.value.func.value.func.value) == key)


def _call_named(node, dotted: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == dotted


def _pinned_uses(func) -> list:
    return [n for n in ast.walk(func) if _key(n) in PINNED]


def _is_copy(stmt, dst: str, src: str) -> bool:
    """``X[dst].copy_(X[src], False)`` (the replica: ``copy_async(X[dst], X[src], label)``, its spelling
    of the same asynchronous copy through the copy backend)."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "copy_async":
        return len(call.args) >= 2 and _key(call.args[0]) == dst and _key(call.args[1]) == src
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "copy_"
            and _key(call.func.value) == dst and len(call.args) == 2 and _key(call.args[0]) == src
            and isinstance(call.args[1], ast.Constant) and call.args[1].value is False)


def _is_event_record(stmt) -> bool:
    """``post_process_event.record()`` (the replica: ``post_process_event = backend.record(...)``)."""
    if isinstance(stmt, ast.Expr) and _call_named(stmt.value, "post_process_event.record"):
        return True
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and ast.unparse(stmt.targets[0]) == "post_process_event" and isinstance(stmt.value, ast.Call)
            and ast.unparse(stmt.value.func).endswith("backend.record"))


def _is_event_wait(stmt) -> bool:
    """``post_process_event.synchronize()`` (the replica: ``current_backend().wait(post_process_event, ...)``)."""
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return False
    call = stmt.value
    if _call_named(call, "post_process_event.synchronize"):
        return True
    return (isinstance(call.func, ast.Attribute) and call.func.attr == "wait" and bool(call.args)
            and ast.unparse(call.args[0]) == "post_process_event")


def _line_of(func, pred) -> int | None:
    for stmt in _stmts(func):
        if pred(stmt):
            return stmt.lineno
    return None


def _check_prepare(methods, file: str) -> tuple[list[str], str]:
    func = methods.get("_prepare_inputs")
    if func is None:
        return [f"{CLASS}._prepare_inputs not defined"], ""
    problems = []
    stmts = _stmts(func)
    recover = [n.lineno for n in ast.walk(func) if isinstance(n, ast.Call)
               and ast.unparse(n.func).split(".")[-1] == "recover_decode_task"]
    copy_t = _line_of(func, lambda s: _is_copy(s, PINNED[0], VIEW))
    copy_b = _line_of(func, lambda s: _is_copy(s, PINNED[1], "is_block_step"))
    events = [n for n in ast.walk(func) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("create_event")]
    create = _line_of(func, lambda s: isinstance(s, ast.Assign) and len(s.targets) == 1
                      and ast.unparse(s.targets[0]) == "token_num_event"
                      and _call_named(s.value, "paddle.device.cuda.create_event"))
    record = _line_of(func, lambda s: isinstance(s, ast.Expr) and _call_named(s.value, "token_num_event.record"))
    waits = [i for i, s in enumerate(stmts) if isinstance(s, ast.Expr) and _call_named(s.value, "token_num_event.synchronize")]
    if len(recover) != 1:
        problems.append(f"{len(recover)} recover_decode_task calls (expected one)")
    if copy_t is None or copy_b is None:
        problems.append("the pinned copies seq_lens_this_time_cpu.copy_(seq_lens_this_time, False) / "
                        "is_block_step_cpu.copy_(is_block_step, False) not found")
    if create is None or len(events) != 1:
        problems.append(f"token_num_event = paddle.device.cuda.create_event(): {len(events)} create_event call(s)")
    if record is None:
        problems.append("no token_num_event.record()")
    order = [recover[0] if recover else None, copy_t, copy_b, create, record]
    if None not in order and order != sorted(order):
        problems.append(f"order recover :{order[0]}, copies :{copy_t}/:{copy_b}, create :{create}, record :{record}")
    read_line = None
    if len(waits) != 1:
        problems.append(f"{len(waits)} token_num_event.synchronize() (expected one)")
    else:
        nxt = stmts[waits[0] + 1] if waits[0] + 1 < len(stmts) else None
        if not (isinstance(nxt, ast.Assign) and ast.unparse(nxt.targets[0]) == "token_num"
                and _is_read(nxt.value, PINNED[0])):
            problems.append("the wait is not directly followed by token_num = "
                            "share_inputs['seq_lens_this_time_cpu'].numpy().sum().item()"
                            + (f" (next: :{nxt.lineno} {ast.unparse(nxt)[:80]})" if nxt is not None else ""))
        else:
            read_line = nxt.lineno
    uses = _pinned_uses(func)
    if len(uses) != 3:
        problems.append(f"{len(uses)} uses of the pinned buffers (expected 3: two copies, one read): "
                        + ", ".join(f":{u.lineno}" for u in uses))
    returns = [n for n in ast.walk(func) if isinstance(n, ast.Return)]
    if not returns or any(ast.unparse(r.value) != "token_num_event" for r in returns if r.value is not None):
        problems.append("does not return token_num_event")
    short = file.rsplit("/", 1)[-1]
    return problems, (f"{short}: recover :{recover[0] if recover else '?'}, copies :{copy_t}/:{copy_b}, "
                      f"create_event :{create}, record :{record}, wait + read :{read_line}")


def _check_post(methods, batch_cls, file: str) -> tuple[list[str], str]:
    func = methods.get("_postprocess")
    if func is None:
        return [f"{CLASS}._postprocess not defined"], ""
    problems = []
    waits = [s.lineno for s in _stmts(func) if isinstance(s, ast.Expr) and _call_named(s.value, "token_num_event.synchronize")]
    post = [n.lineno for n in ast.walk(func) if isinstance(n, ast.Call) and ast.unparse(n.func) == "post_process"]
    reads = [n for n in ast.walk(func) if isinstance(n, ast.Call) and any(_is_read(n, k) for k in PINNED)]
    uses = _pinned_uses(func)
    if len(waits) != 1:
        problems.append(f"{len(waits)} token_num_event.synchronize() in _postprocess (expected one)")
    if len(uses) != len(reads):
        problems.append("a use of a pinned count other than .numpy().sum().item(): "
                        + ", ".join(f":{u.lineno}" for u in uses))
    if waits and post and any(not waits[0] < r.lineno < min(post) for r in reads):
        problems.append(f"a read outside the wait (:{waits[0]}) .. post_process (:{min(post)}) span")
    if not post:
        problems.append("no post_process(...) call")
    others = sorted({name for name, m in methods.items() if name not in ("_prepare_inputs", "_postprocess")
                     and _pinned_uses(m)})
    if others:
        problems.append(f"other runner methods use the pinned counts: {', '.join(others)}")
    batch_uses = []
    if isinstance(batch_cls, ast.ClassDef):
        for name, m in _methods(batch_cls).items():
            found = [n for n in ast.walk(m) if isinstance(n, ast.Attribute) and n.attr in PINNED]
            if found:
                batch_uses.append(f"{name} x{len(found)}")
    short = file.rsplit("/", 1)[-1]
    return problems, (f"{short}: wait :{waits[0] if waits else '?'}, {len(reads)} read(s) "
                      f"{', '.join(':' + str(r.lineno) for r in reads)}, post_process :{min(post) if post else '?'}; "
                      f"{BATCH} uses them in: {', '.join(batch_uses) or 'nothing'} (swap_states: PD reorder, "
                      "where the plugin keeps FastDeploy's waits)")


def _check_snapshot(side: Side, methods) -> tuple[list[str], str]:
    problems = []
    tree = side.tree(POSTPROC)
    calls = []
    if tree is None:
        problems.append(f"{POSTPROC} not found")
    else:
        normal = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "post_process_normal"), None)
        if normal is None:
            problems.append("post_process_normal not found")
        else:
            calls = [n for n in ast.walk(normal) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                     and n.func.id == "update_inputs_v1"]
            if not calls:
                problems.append("post_process_normal does not call update_inputs_v1 by its global name")
            imported = any(isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == "update_inputs_v1"
                                                                 for a in n.names) for n in ast.walk(tree)
                           if not isinstance(n, ast.FunctionDef))
            local = [f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and any(
                isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == "update_inputs_v1" for a in n.names)
                for n in ast.walk(f))]
            if not imported or local:
                problems.append("update_inputs_v1 is not imported into the module's globals"
                                + (f" (imported inside {', '.join(local)})" if local else ""))
    func = methods.get("_postprocess")
    save = methods.get("_save_model_output")
    post = [n.lineno for n in ast.walk(func) if isinstance(n, ast.Call) and ast.unparse(n.func) == "post_process"] \
        if func is not None else []
    record = _line_of(func, _is_event_record) if func is not None else None
    if not post or record is None or not max(post) < record:
        problems.append(f"_postprocess: post_process(...) :{post} not before post_process_event.record() :{record}")
    first = None
    if save is None:
        problems.append("_save_model_output not defined")
    else:
        body = [s for s in save.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        first = body[0] if body else None
        if first is None or not _is_event_wait(first):
            problems.append("_save_model_output does not start with post_process_event.synchronize()")
    return problems, (f"update_inputs_v1 in post_process_normal :{', :'.join(str(c.lineno) for c in calls)}; "
                      f"_postprocess post_process :{max(post) if post else '?'} < post_process_event.record() "
                      f":{record}; _save_model_output waits first (:{first.lineno if first is not None else '?'})")


def _check_insert(methods) -> tuple[list[str], str]:
    func = methods.get("insert_tasks_v1")
    if func is None:
        return ["insert_tasks_v1 not defined"], ""
    parents = {child: node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
    counts: dict[str, int] = {}
    problems = []
    for node in ast.walk(func):
        key = _key(node)
        if key not in SHADOWED + (VIEW,):
            continue
        p = parents.get(node)
        label = None
        if isinstance(p, ast.Subscript) and p.value is node and isinstance(p.ctx, ast.Store) \
                and isinstance(parents.get(p), ast.Assign):
            label = f"{key}[...] = ..." if key != VIEW else "write through the view (lost at run time)"
        elif isinstance(node.ctx, ast.Store) and key == VIEW and isinstance(p, ast.Assign) \
                and isinstance(p.value, ast.Subscript) and _key(p.value.value) == "seq_lens_this_time_buffer":
            label = "view rebind"
        elif key == "seq_lens_this_time_buffer" and isinstance(p, ast.Subscript) and isinstance(parents.get(p), ast.Assign) \
                and _key(parents[p].targets[0]) == VIEW:
            continue  # the rebind's right-hand side
        elif key == "is_block_step" and isinstance(p, ast.Subscript) and p.value is node \
                and isinstance(parents.get(p), ast.If) and parents[p].test is p:
            label = "if is_block_step[...]"
        if label is None:
            stmt = node
            while stmt is not None and not isinstance(stmt, ast.stmt):
                stmt = parents.get(stmt)
            problems.append(f":{node.lineno} {key}: {ast.unparse(stmt if stmt is not None else node)[:100]}")
        else:
            counts[label] = counts.get(label, 0) + 1
    return problems, ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))


def check_token_num_fd25(side: Side, report: Report, section: str) -> None:
    cls = side.ast_def(RUNNER, CLASS)
    if not isinstance(cls, ast.ClassDef):
        report.add(section, ROW_PREPARE, "MISMATCH", f"{side.root}.{RUNNER}:{CLASS} not found (source)")
        return
    methods = _methods(cls)
    file = RUNNER.replace(".", "/") + ".py"
    for row, (problems, detail) in (
            (ROW_PREPARE, _check_prepare(methods, file)),
            (ROW_POST, _check_post(methods, side.ast_def(INPUT_BATCH, BATCH), file)),
            (ROW_SNAP, _check_snapshot(side, methods)),
            (ROW_INSERT, _check_insert(methods))):
        report.add_checked(section, row, problems, detail)
