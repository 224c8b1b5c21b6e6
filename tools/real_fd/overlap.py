"""Section ``overlap``: the FastDeploy 2.4 code shapes that ``patches/fd24/overlap.py`` relies on (issue 12).

The feature keeps FastDeploy's ``execute_model`` body and moves each step's save one step later.
That is only right if FastDeploy's code has these shapes, read here by AST (no import needed):

(a) the hook: ``GPUModelRunner.execute_model`` calls ``self.not_need_stop()`` exactly once, after
    its first ``self.model(...)`` call (the forward) and before the sampler and ``post_process``;
    nothing it calls before the forward (``_prepare_inputs`` and its callees) calls
    ``not_need_stop()`` (the hook would fire before the forward: still correct, no overlap);
(b) the captured saves: every ``save_output(...)`` / ``save_output_topk(...)`` call in
    ``pre_and_post_process.py`` passes the stop flag positionally at the index the patch replaces
    (1 and 4: ``SAVE_OPS``), with no keyword arguments, and the names are the module's imported
    ops (a call the patch cannot capture runs at once: correct, no overlap for that step);
(c) the worker loop (``worker/worker_process.py``, FD side only: the replica has none) takes the
    engine's tasks with ``self.task_queue.get_tasks()`` before it inserts them
    (``preprocess_new_task``) and before ``execute_model``, gates ``execute_model`` on
    ``not_need_stop()``, and ``task_queue`` is an ``inter_communicator.EngineWorkerQueue``, whose
    ``get_tasks`` the patch wraps (so the pending save is finished before the engine sees its
    batch taken).

Checked on the FastDeploy side when the detected profile is ``fastdeploy-2.4``, and on the replica
when it is ``...reference.fd24``. Statuses: OK, MISMATCH, INFO, SKIP.
"""

from __future__ import annotations

import ast

from .common import POSTPROC, RUNNER, Report, feature_section
from .side import Side
from .step_syncs import _methods

SECTION = "overlap"
PROFILE = "fastdeploy-2.4"
CLASS = "GPUModelRunner"
WORKER = "worker.worker_process"
QUEUE = "inter_communicator.engine_worker_queue"
#: save op -> position of its ``not_need_stop`` argument (patches/fd24/overlap.py's SAVE_OPS; a test
#: keeps the two equal)
SAVE_OPS = {"save_output": 1, "save_output_topk": 4}


def _calls(func) -> list[ast.Call]:
    """Calls in ``func``, in source order."""
    found = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _pos(node) -> tuple[int, int]:
    return (node.lineno, node.col_offset)


def _is_self_call(call: ast.Call, name: str, obj: str | None = None) -> bool:
    f = call.func
    if not isinstance(f, ast.Attribute) or f.attr != name:
        return False
    target = f.value
    if obj is None:
        return isinstance(target, ast.Name) and target.id == "self"
    return ast.unparse(target) == f"self.{obj}"


def check_hook(side: Side, report: Report, section: str) -> None:
    cls = side.ast_def(RUNNER, CLASS)
    if not isinstance(cls, ast.ClassDef):
        report.add(section, "(a) hook", "MISMATCH", f"{side.root}.{RUNNER}:{CLASS} not found (source)")
        return
    methods = _methods(cls)
    body = methods.get("execute_model")
    if body is None:
        report.add(section, "(a) hook", "MISMATCH", "GPUModelRunner.execute_model not found")
        return
    calls = _calls(body)
    forward = next((c for c in calls if _is_self_call(c, "model") or ast.unparse(c.func) == "self.model"), None)
    hooks = [c for c in calls if _is_self_call(c, "not_need_stop")]
    sampler = next((c for c in calls if ast.unparse(c.func) == "self.sampler"), None)
    post = next((c for c in calls if isinstance(c.func, ast.Name) and c.func.id == "post_process"), None)
    where = f"execute_model: forward line {getattr(forward, 'lineno', '-')}, not_need_stop() lines " \
            f"{[c.lineno for c in hooks]}, sampler line {getattr(sampler, 'lineno', '-')}, post_process line " \
            f"{getattr(post, 'lineno', '-')}"
    ok = (forward is not None and len(hooks) == 1 and _pos(hooks[0]) > _pos(forward)
          and all(x is None or _pos(hooks[0]) < _pos(x) for x in (sampler, post)) and post is not None)
    report.add(section, "(a) hook after the forward", "OK" if ok else "MISMATCH", where)
    # nothing reached from execute_model before the forward asks not_need_stop()
    before = [c for c in calls if forward is not None and _pos(c) < _pos(forward)]
    names = [c.func.attr for c in before if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)
             and c.func.value.id == "self" and c.func.attr in methods]
    seen, todo, early = set(), list(names), []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for c in _calls(methods[name]):
            if _is_self_call(c, "not_need_stop"):
                early.append(f"{name}:{c.lineno}")
            elif isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) \
                    and c.func.value.id == "self" and c.func.attr in methods:
                todo.append(c.func.attr)
    report.add(section, "(a) no not_need_stop() before the forward", "MISMATCH" if early else "OK",
               f"methods called before the forward, followed: {sorted(seen)}; not_need_stop() calls: {early or 'none'}")


def check_saves(side: Side, report: Report, section: str) -> None:
    tree = side.tree(POSTPROC)
    if tree is None:
        report.add(section, "(b) save calls", "MISMATCH", f"{side.root}.{POSTPROC} source not found")
        return
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    redefined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for name, index in SAVE_OPS.items():
        sites = [c for c in _calls(tree) if isinstance(c.func, ast.Name) and c.func.id == name]
        if not sites:
            report.add(section, f"(b) {name}", "MISMATCH", "no call found")
            continue
        bad = []
        for c in sites:
            arg = ast.unparse(c.args[index]) if len(c.args) > index else None
            if c.keywords or arg is None or not arg.endswith("not_need_stop"):
                bad.append(f"line {c.lineno}: {ast.unparse(c)[:120]}")
        source = "imported" if name in imported and name not in redefined else "NOT an imported op"
        status = "OK" if not bad and source == "imported" else "MISMATCH"
        detail = (f"{len(sites)} call(s) at lines {[c.lineno for c in sites]}, flag at position {index}, "
                  f"no keywords; name {source}")
        report.add(section, f"(b) {name}", status, detail + (f"; uncapturable: {bad}" if bad else ""))


def check_worker_loop(side: Side, report: Report, section: str) -> None:
    tree = side.tree(WORKER)
    if tree is None:
        report.add(section, "(c) worker loop", "SKIP", f"{side.root}.{WORKER} not present (the replica's driver plays it)")
        return
    loops = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             and any(_is_self_call(c, "get_tasks", "task_queue") for c in _calls(f))]
    if len(loops) != 1:
        report.add(section, "(c) worker loop", "MISMATCH",
                   f"{len(loops)} functions call self.task_queue.get_tasks(): {[f.name for f in loops]}")
        return
    loop = loops[0]
    calls = _calls(loop)
    take = next(c for c in calls if _is_self_call(c, "get_tasks", "task_queue"))
    insert = next((c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "preprocess_new_task"), None)
    gate = next((c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "not_need_stop"), None)
    execute = next((c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "execute_model"), None)
    ok = all(x is not None for x in (insert, gate, execute)) and _pos(take) < _pos(insert) < _pos(gate) < _pos(execute)
    report.add(section, "(c) get_tasks, then insert, gate, execute", "OK" if ok else "MISMATCH",
               f"{loop.name}: get_tasks line {take.lineno}, preprocess_new_task line {getattr(insert, 'lineno', '-')}, "
               f"not_need_stop() line {getattr(gate, 'lineno', '-')}, execute_model line {getattr(execute, 'lineno', '-')}")
    # task_queue's class: imported from inter_communicator as EngineWorkerQueue (any alias)
    alias = next((a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                  and (node.module or "").endswith("inter_communicator") for a in node.names
                  if a.name == "EngineWorkerQueue"), None)
    built = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and any(ast.unparse(t) == "self.task_queue" for t in n.targets)]
    kinds = sorted({ast.unparse(n.value.func) for n in built if isinstance(n.value, ast.Call)})
    queue_cls = side.ast_def(QUEUE, "EngineWorkerQueue")
    has_get = isinstance(queue_cls, ast.ClassDef) and "get_tasks" in _methods(queue_cls)
    ok = alias is not None and kinds == [alias] and has_get
    report.add(section, "(c) task_queue is EngineWorkerQueue", "OK" if ok else "MISMATCH",
               f"imported as {alias!r}; self.task_queue = {kinds}; {QUEUE}.EngineWorkerQueue.get_tasks "
               f"{'defined' if has_get else 'NOT defined'}")


def check_overlap(side: Side, report: Report, profile: str | None, *, replica: bool = False) -> None:
    section = feature_section(report, SECTION, profile, PROFILE, replica)
    if section is None:
        return
    report.add(section, "source", "INFO", f"{side.path(RUNNER)}, {side.path(POSTPROC)}, {side.path(WORKER)}")
    check_hook(side, report, section)
    check_saves(side, report, section)
    check_worker_loop(side, report, section)
