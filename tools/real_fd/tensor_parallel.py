"""Section ``tensor parallel``: the rank rules the replica's TP loop follows (issue 39), read from
FastDeploy's sources by AST (and the save ops' C++ by text), on every profile:

(t1) in the worker loop (``worker_process.py``, the function that calls ``self.task_queue.get_tasks()``)
     only an ``if tp_rank == 0:`` block decides on the task queue (``num_tasks()``/``exist_tasks()``
     in an ``if`` test; 2.4 also logs ``num_tasks()`` after a weight update, not a decision) and it
     raises ``exist_task_signal``;
(t2) every rank then meets at ``self._tp_barrier_wait()``, before anyone reads the tasks;
(t3) every rank reads the tasks (``get_tasks()`` under no rank test, under the ``exist_task_signal``
     test) and inserts them (``preprocess_new_task``);
(t4) the idle branch: an ``if`` on ``not_need_stop()`` whose body meets the others at
     ``_tp_barrier_wait()`` and ``continue``s; the detail says whether the overlap schedule skips it
     (2.5: ``not_need_stop()`` is evaluated first all the same);
(t5) ``_tp_barrier_wait`` is ``paddle.distributed.barrier(self.parallel_config.tp_group)`` (CUDA);
(t6) every ``save_output``/``save_output_topk`` call passes ``model_output.mp_rank`` (the op's rank)
     and every ``_build_stream_transfer_data`` call sits under ``save_each_rank or
     model_output.mp_rank == 0``; the runner builds ``ModelOutputData(mp_rank=
     self.parallel_config.tensor_parallel_rank)``;
(t7) the save ops return at once on ranks > 0 (``if (rank_id > 0)`` in ``custom_ops/gpu_ops/
     save_with_output_msg.cc`` and ``save_output_msg_with_topk.cc``; SKIP without ``custom_ops/``);
(t8) the replica's rank loop (``testing/reference/tp.py`` ``_rank_loop``) makes the same calls in
     the same order as FastDeploy's loop.

Statuses: OK, MISMATCH, INFO, SKIP.
"""

from __future__ import annotations

import ast
import os

from .common import POSTPROC, RUNNER, Report
from .side import Side

SECTION = "tensor parallel"
WORKER = "worker.worker_process"
#: the save ops, whose ``rank_id`` argument (at 2/5 on 2.4, 3/6 on 2.5+) must be ``model_output.mp_rank``
SAVE_OPS = ("save_output", "save_output_topk")
OPS = ("save_with_output_msg.cc", "save_output_msg_with_topk.cc")

#: the loop's calls, by attribute name -> the step of the rank rules they are
FD_STEPS = {"num_tasks": "rank 0 asks the queue", "exist_tasks": "rank 0 asks the queue",
            "_tp_barrier_wait": "barrier", "get_tasks": "read tasks", "preprocess_new_task": "insert",
            "not_need_stop": "not_need_stop()", "execute_model": "execute_model", "exist_prefill": "exist_prefill"}
REPLICA_STEPS = {"num_tasks": "rank 0 asks the queue", "barrier": "barrier", "get_tasks": "read tasks",
                 "insert_tasks_v1": "insert", "not_need_stop": "not_need_stop()", "execute_model": "execute_model",
                 "exist_prefill": "exist_prefill"}


def _calls(node) -> list[ast.Call]:
    return sorted((n for n in ast.walk(node) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))


def _attr(call: ast.Call) -> str | None:
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def _rank0_blocks(func) -> list[ast.If]:
    return [n for n in ast.walk(func) if isinstance(n, ast.If) and ast.unparse(n.test).replace(" ", "") in
            ("tp_rank==0", "rank==0") or isinstance(n, ast.If) and ast.unparse(n.test).startswith("rank == 0 and")]


def _inside(node, blocks) -> bool:
    return any(b.lineno <= node.lineno <= (b.end_lineno or b.lineno) and node is not b for b in blocks)


def steps_of(func, names: dict) -> list[str]:
    """The loop's rank-rule steps in source order: the first of each call, and of the barriers the
    first and the idle one (under a test of ``not_need_stop()``/``idle``; FD 2.5's barriers after
    control requests and while sleeping are other paths). Calls inside the rank-0 block other than the
    queue question are not steps (FD 2.4/2.5 ask ``exist_prefill()`` there for multimodal models)."""
    blocks = _rank0_blocks(func)
    ifs = [n for n in ast.walk(func) if isinstance(n, ast.If)]
    out = []
    for call in _calls(func):
        label = names.get(_attr(call) or "")
        if label is None or (label != "rank 0 asks the queue" and _inside(call, blocks)):
            continue
        if label == "barrier" and "barrier" in out:
            tests = [ast.unparse(n.test) for n in ifs if _inside(call, [n])]
            if not any("not_need_stop" in t or "idle" in t for t in tests) or "idle barrier" in out:
                continue
            label = "idle barrier"
        if label in out:
            continue
        out.append(label)
    return out


def worker_loop(side: Side):
    tree = side.tree(WORKER)
    if tree is None:
        return None, None
    loops = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
             and any(_attr(c) == "get_tasks" and ast.unparse(c.func.value) == "self.task_queue" for c in _calls(f))]
    return tree, (loops[0] if len(loops) == 1 else None)


def check_loop(side: Side, report: Report) -> list[str] | None:
    tree, loop = worker_loop(side)
    if tree is None:
        report.add(SECTION, "(t1) worker loop", "SKIP", f"{side.root}.{WORKER} not found")
        return None
    if loop is None:
        report.add(SECTION, "(t1) worker loop", "MISMATCH", "not exactly one function calls self.task_queue.get_tasks()")
        return None
    calls = _calls(loop)
    blocks = _rank0_blocks(loop)
    tests = [n.test for n in ast.walk(loop) if isinstance(n, ast.If)]  # a question decides (a log line does not)
    asks = sorted((c for t in tests for c in _calls(t) if _attr(c) in ("num_tasks", "exist_tasks")
                   and ast.unparse(c.func.value) == "self.task_queue"), key=lambda c: c.lineno)
    raises = [n for b in blocks for n in ast.walk(b) if isinstance(n, ast.Assign)
              and any(ast.unparse(t) == "self.exist_task_signal.value[0]" for t in n.targets)]
    problems = [f"line {c.lineno}: the queue asked outside `if tp_rank == 0:`" for c in asks if not _inside(c, blocks)]
    if not asks or not raises:
        problems.append("no `if tp_rank == 0:` block that asks the queue and raises exist_task_signal")
    report.add_checked(SECTION, "(t1) rank 0 alone asks the queue", problems,
                       f"{loop.name}: queue asked at lines {[c.lineno for c in asks]}, signal raised at "
                       f"{[n.lineno for n in raises]}")
    barriers = [c for c in calls if _attr(c) == "_tp_barrier_wait"]
    take = next(c for c in calls if _attr(c) == "get_tasks")
    first = barriers[0] if barriers else None
    ok = first is not None and asks and asks[-1].lineno < first.lineno < take.lineno
    report.add(SECTION, "(t2) every rank meets at the barrier before reading", "OK" if ok else "MISMATCH",
               f"_tp_barrier_wait() at lines {[c.lineno for c in barriers]}, get_tasks() at {take.lineno}")
    guard = [n for n in ast.walk(loop) if isinstance(n, ast.If) and _inside(take, [n])]
    tests = [ast.unparse(g.test) for g in guard]
    insert = next((c for c in calls if _attr(c) == "preprocess_new_task"), None)
    problems = []
    if _inside(take, blocks) or any("rank" in t for t in tests):
        problems.append("get_tasks() depends on the rank")
    if not any("exist_task_signal" in t for t in tests):
        problems.append("get_tasks() is not under the exist_task_signal test")
    if insert is None or insert.lineno < take.lineno or _inside(insert, blocks):
        problems.append("no preprocess_new_task() after get_tasks() on every rank")
    report.add_checked(SECTION, "(t3) every rank reads and inserts the tasks", problems,
                       f"get_tasks() line {take.lineno} under {tests}; preprocess_new_task line "
                       f"{getattr(insert, 'lineno', '-')}")
    idle = [n for n in ast.walk(loop) if isinstance(n, ast.If) and "not_need_stop()" in ast.unparse(n.test)]
    good = [n for n in idle if any(_attr(c) == "_tp_barrier_wait" for c in _calls(ast.Module(n.body, [])))
            and any(isinstance(s, ast.Continue) for s in n.body)]
    overlap = [n for n in good if "enable_overlap_schedule" in ast.unparse(n.test)]
    detail = (f"line {good[0].lineno}: {ast.unparse(good[0].test)}" if good else f"{len(idle)} if(s) on not_need_stop()")
    if overlap:
        detail += " (the overlap schedule skips the branch; not_need_stop() is evaluated before that test)"
    report.add(SECTION, "(t4) idle: barrier and continue", "OK" if len(good) == 1 else "MISMATCH", detail)
    return steps_of(loop, FD_STEPS)


def check_barrier(side: Side, report: Report) -> None:
    tree = side.tree(WORKER)
    body = next((f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "_tp_barrier_wait"), None) \
        if tree is not None else None
    found = [ast.unparse(c) for c in _calls(body)] if body is not None else []
    ok = "paddle.distributed.barrier(self.parallel_config.tp_group)" in found
    report.add(SECTION, "(t5) _tp_barrier_wait is the tp group's barrier", "OK" if ok else "MISMATCH",
               f"calls {found}" if body is not None else "_tp_barrier_wait not found")


def check_saves(side: Side, report: Report) -> None:
    tree = side.tree(POSTPROC)
    if tree is None:
        report.add(SECTION, "(t6) saves on rank 0", "MISMATCH", f"{side.root}.{POSTPROC} source not found")
        return
    problems, counted = [], {}
    for call in _calls(tree):
        name = call.func.id if isinstance(call.func, ast.Name) else None
        if name in SAVE_OPS:
            counted[name] = counted.get(name, 0) + 1
            if "model_output.mp_rank" not in [ast.unparse(a) for a in call.args]:
                problems.append(f"line {call.lineno}: {name} without model_output.mp_rank as its rank")
        if name == "_build_stream_transfer_data":
            counted[name] = counted.get(name, 0) + 1
            guards = [ast.unparse(n.test) for n in ast.walk(tree) if isinstance(n, ast.If) and _inside(call, [n])]
            if "save_each_rank or model_output.mp_rank == 0" not in guards:
                problems.append(f"line {call.lineno}: _build_stream_transfer_data not under the rank-0 test ({guards})")
    for name in SAVE_OPS:
        if not counted.get(name):
            problems.append(f"no {name} call")
    runner = side.tree(RUNNER)
    given = [ast.unparse(k.value) for n in ast.walk(runner or ast.Module([], [])) if isinstance(n, ast.Call)
             for k in n.keywords if k.arg == "mp_rank"]
    if not given or any(g != "self.parallel_config.tensor_parallel_rank" for g in given):
        problems.append(f"the runner's mp_rank values: {given}")
    report.add_checked(SECTION, "(t6) saves and the ZMQ payload on rank 0", problems,
                       f"calls {counted}; runner mp_rank={sorted(set(given))}")


def check_ops_source(fd_src: str | None, report: Report) -> None:
    bases = [os.path.join(root, "custom_ops", "gpu_ops") for root in (fd_src, os.path.dirname(fd_src or ""))
             if fd_src] or [""]  # (--fd-src may name the checkout or its fastdeploy/ folder)
    base = next((b for b in bases if os.path.isdir(b)), None)
    if base is None:
        report.add(SECTION, "(t7) save ops return on ranks > 0", "SKIP", "custom_ops/gpu_ops not found next to fastdeploy/")
        return
    problems, where = [], []
    for name in OPS:
        path = os.path.join(base, name)
        text = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
        lines = [i + 1 for i, line in enumerate(text.splitlines()) if "if (rank_id > 0)" in line]
        where.append(f"{name}:{lines}")
        if not lines:
            problems.append(f"{name}: no `if (rank_id > 0)`")
    report.add_checked(SECTION, "(t7) save ops return on ranks > 0", problems, ", ".join(where))


def check_replica_loop(fd_steps: list[str] | None, report: Report) -> None:
    from fd_async_copy_plugin.testing.reference import tp

    source = open(tp.__file__, encoding="utf-8").read()
    loop = next(f for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef) and f.name == "_rank_loop")
    mine = steps_of(loop, REPLICA_STEPS)
    if fd_steps is None:
        report.add(SECTION, "(t8) the replica's rank loop", "SKIP", f"FastDeploy's loop not read; replica: {mine}")
        return
    report.add(SECTION, "(t8) the replica's rank loop follows FastDeploy's order",
               "OK" if mine == fd_steps else "MISMATCH", f"FastDeploy {fd_steps}; replica {mine}")


def check_tensor_parallel(side: Side, report: Report, fd_src: str | None) -> None:
    report.add(SECTION, "source", "INFO", f"{side.path(WORKER)}, {side.path(POSTPROC)}")
    steps = check_loop(side, report)
    if steps is not None:
        check_barrier(side, report)
    check_saves(side, report)
    check_ops_source(fd_src, report)
    check_replica_loop(steps, report)
