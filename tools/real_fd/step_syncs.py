"""Section ``step_syncs``: the FastDeploy 2.4 code shapes that ``patches/step_syncs.py`` relies on (issue 11).

The feature keeps a host shadow of six step tensors by watching FastDeploy's ``share_inputs`` (a view
whose stand-ins answer ``__setitem__``, ``__getitem__`` and ``numpy``) during three runner calls, answers two host reads from the shadow, hands ``get_padding_offset`` a host token count
and moves the sampling seed to the device. Each of those is only exact if FastDeploy's code has a
particular shape. This section reads that code by AST (it works when nothing imports) and checks it:

(a) in ``insert_tasks_v1``, ``insert_prefill_inputs`` and ``_dummy_prefill_inputs`` (and the runner
    methods they call), every use of a watched tensor is ``X[basic key] = host value``, or, for
    ``is_block_step`` only, a read that is an ``if`` test; the view rebind
    ``share_inputs["seq_lens_this_time"] = <buffer>[...]`` is a read that changes no data;
(b) in ``_prepare_inputs`` (and its callees) ``bad_tokens_len`` is used once, as
    ``np.max(<bad_tokens_len>.numpy())``;
(c) ``pre_process`` computes ``token_num = paddle.sum(seq_lens_this_time)`` and hands it as the second
    argument of ``get_padding_offset(input_ids, token_num, seq_lens_this_time)`` on the CUDA branch,
    the name resolved through the module's globals; ``_prepare_inputs`` passes the
    ``seq_lens_this_time`` view, after ``recover_decode_task``;
(d) the writers of ``infer_seed`` are exactly: setitem of ``request.get("seed")``, ``add_`` of the
    increment, ``[:] %= MAX_INFER_SEED`` and a fill, at the sites fd24-sync-semantics.md lists; no host
    read of ``infer_seed`` or of the increment exists in the runner;
(e) the other runner methods that write a watched tensor (host writes, and tensors handed to calls
    that may write on the device), with how the feature accounts for each;
(f) under the non-V1 scheduler (``ENABLE_V1_KVCACHE_SCHEDULER=0``) the feature stands the runner down
    and ``exist_prefill`` is FastDeploy's own answer. That is right because FastDeploy's V0 path
    rewrites the step state on the device: ``execute_model`` (and ``_dummy_run``) call
    ``step_cuda(self.share_inputs, ...)`` when the switch is off, and every op ``step_cuda`` runs is
    handed ``seq_lens_encoder``, ``is_block_step``, ``block_tables``, ``seq_lens_this_time``. The
    stand-down reads the switch as ``<runner module>.envs.ENABLE_V1_KVCACHE_SCHEDULER``
    (``patches/step_syncs.own_path_reason``): the runner module must bind ``envs`` to
    ``fastdeploy.envs`` and ``envs.py`` must declare the switch. Where the runner module imported,
    the plugin's own decision is asked too, on the real module with the switch set to 0.

Checked on the FastDeploy side when the detected profile is ``fastdeploy-2.4``, and on the replica
when it is ``...reference.fd24``. Statuses: OK, MISMATCH (an assumption does not hold), INFO, SKIP.
On ``fastdeploy-2.5`` (and the ``...reference.fd25`` replica) the feature moves the sampling seed and
answers the token_num reads from its own shadow: ``check_step_syncs`` hands over to ``step_syncs_fd25``
(rows ``(d25)``) and ``token_num_fd25`` (rows ``(t25)``); other profiles get a SKIP and the seed's
placement.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .common import POSTPROC, RUNNER, Report, feature_section
from .side import Side
from .source import cuda_import_names

SECTION = "step_syncs"
PROFILE = "fastdeploy-2.4"

CLASS = "GPUModelRunner"
BUFFER = "seq_lens_this_time_buffer"  # a runner attribute, not a share_inputs key
#: watched tensors: share_inputs keys, plus the runner attribute BUFFER
WATCHED_KEYS = ("seq_lens_encoder", "is_block_step", "step_seq_lens_decoder", "bad_tokens_len", "block_tables")
WATCHED = (BUFFER,) + WATCHED_KEYS
#: share_inputs["seq_lens_this_time"] is a view of BUFFER after an insert: writes through it are not
#: writes to the watched tensor object
VIEW = "seq_lens_this_time"
INSERTS = ("insert_tasks_v1", "insert_prefill_inputs", "_dummy_prefill_inputs")
SEED, INCREMENT = "infer_seed", "infer_seed_increment"

#: (d) fd24-sync-semantics.md §1: write form -> the runner methods it must be reached from
SEED_WRITERS = {
    'setitem request.get("seed")': ("insert_tasks_v1", "insert_prefill_inputs"),
    "add_(increment)": ("_dummy_run", "execute_model"),
    "[:] %= MAX_INFER_SEED": ("_dummy_run", "execute_model"),
    "fill": ("reset_share_inputs",),
}

#: (e) how the feature accounts for writes made by a runner method outside the watched inserts
COVERAGE = {
    "__init__": "construction (the shadow is loaded after _init_share_inputs)",
    "_init_share_inputs": "creates the tensors; the shadow is loaded from the device right after",
    "reset_share_inputs": "wrapped: the shadow is reloaded from the device",
    "_prepare_inputs": "recover_decode_task (device) is replayed on the shadow, or the shadow is dropped for the step",
    "execute_model": "device updates of the step: copied to pinned after the update op, read at the next insert",
    "_dummy_run": "dummy/profile run: everything is reloaded before the next real step",
    "_dummy_sampler_run": "dummy/profile run: everything is reloaded before the next real step",
    "_dummy_pooler_run": "dummy/profile run: everything is reloaded before the next real step",
    "_dummy_pooler_run_task": "dummy/profile run: everything is reloaded before the next real step",
    "capture_model": "dummy/profile run: everything is reloaded before the next real step",
    "profile_run": "dummy/profile run: everything is reloaded before the next real step",
    "sot_warmup": "dummy/profile run: everything is reloaded before the next real step",
    "_update_chunked_prefill": "non-V1 scheduler only: FastDeploy's own path",
    "_init_speculative_proposer": "speculative decoding only: FastDeploy's own path",
}

_INPLACE = {"set_value", "fill_", "copy_", "add_", "subtract_", "multiply_", "scale_", "zero_", "clip_",
            "remainder_", "floor_divide_", "assign_", "share_buffer_to", "_share_buffer_to"}
_HOST_READS = {"numpy", "tolist", "item", "__bool__", "__int__", "__index__", "__float__"}
_HOST_CONVERT = {"int", "float", "bool", "str", "list", "tuple", "repr", "print"}
_NP = ("np", "numpy")
_CONTAINER_METHODS = {"get", "append", "pop", "items", "keys", "values", "update", "clear", "setdefault", "extend"}
_HOST_BUILTINS = {"len", "int", "float", "bool", "min", "max", "sum", "abs", "range", "list", "tuple", "round"}


# --- reading one class ---------------------------------------------------------------------------


def _parents(root: ast.AST) -> dict:
    return {child: node for node in ast.walk(root) for child in ast.iter_child_nodes(node)}


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    out = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node  # the last definition wins, as at runtime
    return out


def _self_calls(func) -> list[str]:
    """Names of ``self.<name>(...)`` calls in ``func``."""
    names = []
    for node in ast.walk(func):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
            names.append(node.func.attr)
    return names


def _other_calls(func) -> list[str]:
    """``self.<obj>.<method>(...)`` calls: into objects this section does not follow."""
    out = []
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            value = node.func.value
            if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                    and value.value.id == "self"):
                text = f"self.{value.attr}.{node.func.attr}"
                if text not in out:
                    out.append(text)
    return out


#: composite expressions: a host value when every part is one (label, parts)
_COMPOSITE_PARTS = {
    ast.BinOp: ("arithmetic", lambda n: (n.left, n.right)),
    ast.BoolOp: ("boolean", lambda n: n.values),
    ast.Compare: ("comparison", lambda n: [n.left, *n.comparators]),
    ast.IfExp: ("conditional", lambda n: (n.test, n.body, n.orelse)),
    ast.List: ("sequence", lambda n: n.elts),
    ast.Tuple: ("sequence", lambda n: n.elts),
}


class Runner:
    """``GPUModelRunner`` of one side: methods, in-class call graph, share_inputs aliases."""

    def __init__(self, cls: ast.ClassDef):
        self.cls = cls
        self.methods = _methods(cls)
        self.calls = {name: [c for c in _self_calls(f) if c in self.methods] for name, f in self.methods.items()}
        self.callers: dict[str, set[str]] = {name: set() for name in self.methods}
        for name, callees in self.calls.items():
            for callee in callees:
                self.callers[callee].add(name)
        # runner attributes that hold tensors (assigned from a paddle call somewhere in the class)
        self.tensor_attrs: set[str] = set()
        for node in ast.walk(cls):
            if isinstance(node, ast.Assign) and _is_paddle_call(node.value):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        self.tensor_attrs.add(target.attr)

    def reach(self, roots) -> dict[str, list[str]]:
        """Every method reachable from ``roots`` through ``self.m()`` calls -> one call path to it."""
        paths = {r: [r] for r in roots if r in self.methods}
        todo = list(paths)
        while todo:
            name = todo.pop(0)
            for callee in self.calls.get(name, ()):
                if callee not in paths:
                    paths[callee] = paths[name] + [callee]
                    todo.append(callee)
        return paths

    def entries(self, name: str, wanted) -> set[str]:
        """The methods in ``wanted`` from which ``name`` is reached (``name`` itself included)."""
        found, seen, todo = set(), set(), [name]
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur in wanted:
                found.add(cur)
                continue
            todo.extend(self.callers.get(cur, ()))
        return found


def _is_paddle_call(node) -> bool:
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "cpu", "cuda", "pin_memory"):
        node = node.func.value
    return isinstance(node, ast.Call) and ast.unparse(node.func).startswith("paddle.")


def _containers(func) -> set[str]:
    """``self.share_inputs`` and the local names bound to it (``si = self.share_inputs``)."""
    names = {"self.share_inputs"}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and any(ast.unparse(t) in names for t in node.targets + [node.value]):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _key_of(node, containers) -> str | None:
    """The tensor a node names: a share_inputs key, or the runner attribute BUFFER."""
    if (isinstance(node, ast.Subscript) and ast.unparse(node.value) in containers
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
        return node.slice.value
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and node.attr in (BUFFER, INCREMENT)):
        return node.attr
    return None


@dataclass
class Use:
    method: str
    key: str
    kind: str  # setitem, augassign, if-read, view-rebind, read, host-read, inplace, passed, rebind, helper, alias
    line: int
    text: str
    note: str = ""
    value: ast.AST | None = None  # setitem: the value expression
    callee: str = ""

    def where(self) -> str:
        return f"{self.method}:{self.line}"


def _callee_name(call: ast.Call) -> str:
    return ast.unparse(call.func)


def _enclosing_stmt(node, parents):
    while node is not None and not isinstance(node, ast.stmt):
        node = parents.get(node)
    return node


def uses_in(method: str, func, keys) -> list[Use]:
    """Every use of the tensors ``keys`` in ``func``, classified by its syntactic context."""
    containers = _containers(func)
    parents = _parents(func)
    out: list[Use] = []
    for node in ast.walk(func):
        # string-keyed access through a helper or a dict method: fill_paddle_tensor(si, "k", v), si.get("k")
        if isinstance(node, ast.Call):
            args = list(node.args)
            is_dict_method = isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) in containers
            if is_dict_method and node.func.attr == "update" and args and isinstance(args[0], ast.Dict):
                for k in args[0].keys:
                    if isinstance(k, ast.Constant) and k.value in keys:
                        out.append(Use(method, k.value, "rebind", node.lineno, ast.unparse(node)[:120],
                                       "share_inputs.update replaces the tensor"))
                continue
            strings = [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any(ast.unparse(a) in containers for a in args) or is_dict_method:
                for key in strings:
                    if key in keys:
                        name = _callee_name(node)
                        kind = "helper" if not is_dict_method else ("rebind" if node.func.attr in (
                            "pop", "setdefault", "__setitem__") else "read")
                        out.append(Use(method, key, kind, node.lineno, ast.unparse(node)[:120], callee=name))
            continue
        key = _key_of(node, containers)
        if key is None or key not in keys:
            continue
        out.append(_classify(method, key, node, parents, containers))
    out.sort(key=lambda u: u.line)
    return out


def _classify(method, key, ref, parents, containers) -> Use:
    line = getattr(ref, "lineno", 0)
    p = parents.get(ref)
    stmt = _enclosing_stmt(ref, parents)
    text = ast.unparse(stmt).splitlines()[0][:140] if stmt is not None else ast.unparse(ref)
    # the tensor itself is (re)bound
    if getattr(ref, "ctx", None).__class__ is ast.Store:
        if isinstance(p, (ast.Assign, ast.AnnAssign)):
            return Use(method, key, "rebind", line, text, value=p.value)
        return Use(method, key, "rebind", line, text, "bound in another form")
    if isinstance(p, ast.Subscript) and p.value is ref:
        pp = parents.get(p)
        if isinstance(p.ctx, ast.Store):
            if isinstance(pp, ast.Assign) and len(pp.targets) == 1 and pp.targets[0] is p:
                return Use(method, key, "setitem", line, text, value=pp.value)
            if isinstance(pp, ast.AugAssign) and pp.target is p:
                return Use(method, key, "augassign", line, text, type(pp.op).__name__)
            return Use(method, key, "setitem-other", line, text, "a store in another form (chained or unpacking)")
        if isinstance(pp, (ast.If, ast.While)) and pp.test is p:
            return Use(method, key, "if-read", line, text)
        if isinstance(pp, ast.Assign) and pp.value is p and _is_view_target(pp.targets, containers):
            return Use(method, key, "view-rebind", line, text)
        return Use(method, key, "read", line, text, _read_context(p, parents))
    if isinstance(p, ast.Assign) and p.value is ref:
        if _is_view_target(p.targets, containers):
            return Use(method, key, "view-rebind", line, text)
        return Use(method, key, "alias", line, text, "bound to another name")
    if isinstance(p, ast.Attribute) and p.value is ref:
        call = parents.get(p)
        if isinstance(call, ast.Call) and call.func is p:
            if p.attr in _HOST_READS:
                return Use(method, key, "host-read", line, text, f".{p.attr}()")
            if p.attr in _INPLACE or (p.attr.endswith("_") and not p.attr.startswith("_")):
                return Use(method, key, "inplace", line, text, f".{p.attr}()", value=call)
            return Use(method, key, "read", line, text, f".{p.attr}()")
        return Use(method, key, "read", line, text, f".{p.attr}")
    if isinstance(p, ast.keyword):
        call = parents.get(p)
        return Use(method, key, "passed", line, text, f"{p.arg}=", callee=_callee_name(call))
    if isinstance(p, ast.Call) and ref in p.args:
        name = _callee_name(p)
        if name in _HOST_CONVERT or name.split(".")[0] in _NP:
            return Use(method, key, "host-read", line, text, f"{name}(...)")
        return Use(method, key, "passed", line, text, f"argument {p.args.index(ref)}", callee=name)
    if isinstance(p, (ast.If, ast.While, ast.IfExp, ast.BoolOp, ast.UnaryOp, ast.Compare, ast.FormattedValue)):
        return Use(method, key, "host-read", line, text, type(p).__name__)
    return Use(method, key, "read", line, text, type(p).__name__ if p is not None else "")


def _is_view_target(targets, containers) -> bool:
    return len(targets) == 1 and _key_of(targets[0], containers) == VIEW


def _read_context(sub, parents) -> str:
    pp = parents.get(sub)
    if isinstance(pp, ast.Call):
        return f"index read passed to {_callee_name(pp)}"
    if isinstance(pp, ast.keyword):
        return f"index read passed as {pp.arg}="
    return f"index read in {type(pp).__name__}"


# --- host values and basic keys ------------------------------------------------------------------


class Values:
    """Whether an expression in a method is a host value (what ``_tensor_watch.host_value`` takes)."""

    def __init__(self, func, runner: Runner):
        self.func, self.runner = func, runner
        self.containers = _containers(func)
        self.params = {a.arg for a in func.args.args + func.args.kwonlyargs + func.args.posonlyargs}
        self.assigned: dict[str, list[ast.AST]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in _names_in_target(target):
                        self.assigned.setdefault(name, []).append(node.value)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) \
                    and node.value is not None:
                self.assigned.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, (ast.For, ast.comprehension)):
                for name in _names_in_target(node.target):
                    self.assigned.setdefault(name, []).append(ast.Constant(value=0))  # loop variable
            elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and node is not func:
                args = node.args
                for a in args.args + args.kwonlyargs:
                    self.assigned.setdefault(a.arg, []).append(ast.Constant(value=0))

    def host(self, node, seen=frozenset()) -> tuple[bool, str]:
        """(True, what) for a host value; (False, why not) for a tensor or anything unknown."""
        if isinstance(node, ast.Constant):
            return True, "literal"
        if isinstance(node, ast.UnaryOp):
            return self.host(node.operand, seen)
        parts = _COMPOSITE_PARTS.get(type(node))
        if parts is not None:
            what, children = parts
            for child in children(node):
                ok, why = self.host(child, seen)
                if not ok:
                    return ok, why
            return True, what
        if isinstance(node, ast.Name):
            if node.id in seen:
                return True, f"name {node.id}"
            values = self.assigned.get(node.id)
            if not values:
                return True, f"name {node.id}" + (" (parameter)" if node.id in self.params else "")
            for v in values:
                ok, why = self.host(v, seen | {node.id})
                if not ok:
                    return False, f"{node.id} = {why}"
            return True, f"name {node.id}"
        if isinstance(node, ast.Call):
            fname = ast.unparse(node.func)
            head = fname.split(".")[0]
            if head in _NP:
                return True, f"{fname}(...)"
            if head == "paddle" or fname.endswith((".cuda", ".to_tensor")):
                return False, f"{fname}(...): a tensor (device unless placed on the CPU)"
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                owner = ast.unparse(node.func.value)
                if owner in self.containers:
                    return False, f"{fname}(...): a share_inputs tensor"
                return True, f"{fname}(...)"
            if fname in _HOST_BUILTINS:
                return True, f"{fname}(...)"
            return False, f"{fname}(...): a call whose result is unknown"
        if isinstance(node, ast.Subscript):
            base = node.value
            if _key_of(base, self.containers) is not None or ast.unparse(base) in self.containers:
                return False, f"{ast.unparse(node)[:60]}: a subscript of a share_inputs tensor"
            if isinstance(base, ast.Subscript) and _key_of(base.value, self.containers) is not None:
                return False, f"{ast.unparse(node)[:60]}: a subscript of a share_inputs tensor"
            if isinstance(base, ast.Attribute) and base.attr == "shape":
                return True, "a shape entry"
            if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "self" \
                    and base.attr in self.runner.tensor_attrs:
                return False, f"{ast.unparse(node)[:60]}: a subscript of runner tensor self.{base.attr}"
            return self.host(base, seen) if not isinstance(base, ast.Name) else (True, f"{ast.unparse(node)[:40]}")
        if isinstance(node, ast.Attribute):
            if _key_of(node, self.containers) is not None:
                return False, f"{ast.unparse(node)}: a watched tensor"
            if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.runner.tensor_attrs:
                return False, f"self.{node.attr}: a runner tensor"
            return True, f"attribute {ast.unparse(node)[:40]}"
        return False, f"{type(node).__name__}: not a recognised host value"

    def basic_key(self, node) -> tuple[bool, str]:
        """Integer/slice keys (what numpy applies identically); masks, lists and tensors are not."""
        parts = node.elts if isinstance(node, ast.Tuple) else [node]
        for part in parts:
            if isinstance(part, ast.Slice):
                for bound in (part.lower, part.upper, part.step):
                    if bound is not None:
                        ok, why = self._int_like(bound)
                        if not ok:
                            return False, why
                continue
            if isinstance(part, ast.Constant) and part.value is Ellipsis:
                continue
            ok, why = self._int_like(part)
            if not ok:
                return False, why
        return True, ""

    def _int_like(self, node) -> tuple[bool, str]:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                return False, f"key {ast.unparse(node)}: not an integer"
            return True, ""
        if isinstance(node, (ast.List, ast.Compare)):
            return False, f"key {ast.unparse(node)[:40]}: fancy index or mask"
        ok, why = self.host(node)
        return (True, "") if ok else (False, f"key {why}")


def _names_in_target(target):
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _names_in_target(elt)]
    if isinstance(target, ast.Starred):
        return _names_in_target(target.value)
    return []


# --- the checks ----------------------------------------------------------------------------------


def _runner_of(side: Side) -> Runner | None:
    cls = side.ast_def(RUNNER, CLASS)
    return Runner(cls) if isinstance(cls, ast.ClassDef) else None


def check_inserts(runner: Runner, report: Report, section: str) -> None:
    """(a) the watched inserts write the watched tensors only as ``X[basic] = host value``."""
    keys = WATCHED + (VIEW,)
    followed = runner.reach(INSERTS)
    not_followed = sorted({c for name in followed for c in _other_calls(runner.methods[name])
                           if c.split(".")[1] != "share_inputs" and c.split(".")[-1] not in _CONTAINER_METHODS})
    for root in INSERTS:
        if root not in runner.methods:
            report.add(section, f"(a) {root}", "MISMATCH", "not defined in GPUModelRunner (the feature patches it)")
    problems = 0
    for name, path in followed.items():
        func = runner.methods[name]
        values = Values(func, runner)
        counts: dict[str, int] = {}
        bad: list[str] = []
        for use in uses_in(name, func, keys):
            verdict, label = _insert_verdict(use, values)
            if verdict is not None:
                bad.append(f"{use.where()} {use.key}: {verdict}: {use.text}")
            elif label is not None:
                counts[label] = counts.get(label, 0) + 1
        via = "" if len(path) == 1 else f" (reached from {' -> '.join(path[:-1])})"
        if not counts and not bad:
            if len(path) == 1:
                report.add(section, f"(a) {name}", "MISMATCH", "no use of a watched tensor at all")
            continue
        summary = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
        if bad:
            problems += len(bad)
            report.add(section, f"(a) {name}{via}", "MISMATCH",
                       f"{len(bad)} other use(s); accepted: {summary or 'none'}")
            for line in bad:
                report.add(section, f"(a) {name}: other use", "MISMATCH", line)
        else:
            report.add(section, f"(a) {name}{via}", "OK", f"{sum(counts.values())} uses, all accepted: {summary}")
    if not_followed:
        report.add(section, "(a) calls not followed", "INFO",
                   "into other objects (their writes to a watched tensor would be mirrored too, "
                   "the watch is by tensor identity): " + ", ".join(not_followed))
    report.add(section, "(a) summary", "OK" if not problems else "MISMATCH",
               f"{len(followed)} methods scanned ({', '.join(followed)}); {problems} use(s) outside the accepted forms")


def _insert_verdict(use: Use, values: Values) -> tuple[str | None, str | None]:
    """(None, label) when the use is one the shadow follows exactly, else (why not, None)."""
    if use.kind == "setitem":
        if use.key == VIEW:
            return "a write through the seq_lens_this_time view (a different tensor object: not mirrored)", None
        target = _setitem_target(use, values)
        if target is not None:
            ok, why = values.basic_key(target.slice)
            if not ok:
                return f"not a basic key ({why})", None
        ok, why = values.host(use.value)
        return (None, f"{use.key}[...] = host") if ok else (f"not a host value ({why})", None)
    if use.kind == "if-read":
        if use.key != "is_block_step":
            return "an if-test read (the shadow answers reads of is_block_step only)", None
        ref = _find_ref(values.func, use, values.containers)
        sub = _parents(values.func).get(ref)
        ok, why = values.basic_key(sub.slice) if isinstance(sub, ast.Subscript) else (False, "no key")
        return (None, "if is_block_step[...]") if ok else (f"if-test read with a non-basic key ({why})", None)
    if use.kind == "view-rebind":
        if use.key == BUFFER:
            return None, f"{VIEW} view <- buffer"
        return f"{use.key} bound to the {VIEW} view", None
    if use.key == VIEW and use.kind == "rebind":
        value = use.value
        base = value.value if isinstance(value, ast.Subscript) else value
        if _key_of(base, values.containers) == BUFFER:
            return None, None  # counted on the buffer side
        return f"the {VIEW} view rebound to {ast.unparse(value)[:60]}", None
    detail = f"{use.kind}{(' ' + use.note) if use.note else ''}{(' -> ' + use.callee) if use.callee else ''}"
    return detail, None


def _setitem_target(use: Use, values: Values):
    for node in ast.walk(values.func):
        if isinstance(node, ast.Assign) and node.value is use.value and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Subscript):
            return node.targets[0]
    return None


def check_bad_tokens_len(runner: Runner, report: Report, section: str) -> None:
    """(b) ``_prepare_inputs`` reads ``bad_tokens_len`` once, as ``np.max(X.numpy())``."""
    if "_prepare_inputs" not in runner.methods:
        report.add(section, "(b) _prepare_inputs", "MISMATCH", "not defined in GPUModelRunner")
        return
    found = []
    for name in runner.reach(["_prepare_inputs"]):
        func = runner.methods[name]
        parents = _parents(func)
        containers = _containers(func)
        for use in uses_in(name, func, ("bad_tokens_len",)):
            found.append((use, func, parents, containers))
    expected = []
    others = []
    for use, func, parents, containers in found:
        ref = _find_ref(func, use, containers)
        p = parents.get(ref)
        call = parents.get(p)
        outer = parents.get(call)
        if (use.kind == "host-read" and use.note == ".numpy()" and isinstance(call, ast.Call) and not call.args
                and not call.keywords and isinstance(outer, ast.Call) and ast.unparse(outer.func) in (
                    "np.max", "numpy.max") and len(outer.args) == 1 and outer.args[0] is call):
            expected.append(use)
        else:
            others.append(use)
    if len(expected) == 1 and not others:
        use = expected[0]
        report.add(section, "(b) _prepare_inputs bad_tokens_len", "OK",
                   f"one use, np.max(<bad_tokens_len>.numpy()) at {use.where()}")
    else:
        detail = f"{len(expected)} use(s) of the form np.max(<bad_tokens_len>.numpy())"
        if others:
            detail += "; other: " + "; ".join(f"{u.where()} {u.kind} {u.note}: {u.text}" for u in others)
        report.add(section, "(b) _prepare_inputs bad_tokens_len", "MISMATCH", detail)


def _find_ref(func, use: Use, containers):
    for node in ast.walk(func):
        if getattr(node, "lineno", None) == use.line and _key_of(node, containers) == use.key:
            return node
    return None


def _guard(node, parents, stop) -> list[str]:
    """The if-conditions around ``node`` inside ``stop``, innermost last (``not (c)`` for else)."""
    chain = []
    child, cur = node, parents.get(node)
    while cur is not None and cur is not stop:
        if isinstance(cur, ast.If):
            cond = ast.unparse(cur.test)
            if child in cur.body:
                chain.append(cond)
            elif child in cur.orelse:
                chain.append(f"not ({cond})")
        child, cur = cur, parents.get(cur)
    return list(reversed(chain))


def check_token_count(side: Side, runner: Runner, report: Report, section: str) -> None:
    """(c) ``pre_process`` hands ``paddle.sum(seq_lens_this_time)`` to ``get_padding_offset``."""
    item = "(c) pre_process token count"
    func = side.ast_def(POSTPROC, "pre_process")
    if func is None:
        report.add(section, item, "MISMATCH", "pre_and_post_process.pre_process not found")
        return
    params = [a.arg for a in func.args.args]
    if len(params) < 2:
        report.add(section, item, "MISMATCH", f"pre_process({', '.join(params)}): fewer than two parameters")
        return
    ids_param, lens_param = params[0], params[1]
    parents = _parents(func)
    sums = []  # (name, line, guard)
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            wrapped = ""
            if (isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords
                    and isinstance(value.args[0], ast.Call) and not ast.unparse(value.func).startswith("paddle.")):
                wrapped, value = ast.unparse(value.func), value.args[0]
            if (isinstance(value, ast.Call) and ast.unparse(value.func) == "paddle.sum" and len(value.args) == 1
                    and isinstance(value.args[0], ast.Name) and value.args[0].id == lens_param
                    and not value.keywords):
                sums.append((node.targets[0].id, node.lineno, _guard(node, parents, func), wrapped))
    if len(sums) != 1 or sums[0][2]:
        report.add(section, item, "MISMATCH",
                   f"expected one unconditional <name> = paddle.sum({lens_param}); found "
                   + ("; ".join(f"{n} at :{ln} if {' and '.join(g) or 'always'}" for n, ln, g, _w in sums) or "none"))
        return
    count, line, _g, wrapped = sums[0]
    calls = []
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "get_padding_offset":
            calls.append((node, _guard(node, parents, func)))
    local_defs = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            local_defs.setdefault(node.targets[0].id, []).append(ast.unparse(node.value))

    def selects_cuda(cond: str) -> bool:
        if cond.startswith("not ("):
            return False
        text = cond + " " + " ".join(v for n, vs in local_defs.items() if re.search(rf"\b{n}\b", cond) for v in vs)
        return "is_cuda()" in text

    cuda = [(c, g) for c, g in calls if g and any(selects_cuda(cond) for cond in g)]
    want = [ids_param, count, lens_param]
    note = f" (inside {wrapped}(...))" if wrapped else ""
    if len(cuda) != 1:
        report.add(section, item, "MISMATCH",
                   f"{len(cuda)} get_padding_offset call(s) on a branch that selects CUDA; expected one")
    else:
        call, guard = cuda[0]
        got = [ast.unparse(a) for a in call.args]
        if got != want or call.keywords:
            shown = ", ".join(got + [ast.unparse(k) for k in call.keywords])
            report.add(section, item, "MISMATCH",
                       f"CUDA branch calls get_padding_offset({shown}); expected ({', '.join(want)})")
        else:
            report.add(section, item, "OK",
                       f"{count} = paddle.sum({lens_param}){note} at :{line}; get_padding_offset({', '.join(got)}) "
                       f"at :{call.lineno} if {' and '.join(guard)}")
    # every other use of the count: must not be on the CUDA branch the wrapper is armed on
    others = []
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and node.id == count and isinstance(node.ctx, ast.Load):
            call = parents.get(node)
            if cuda and call is cuda[0][0]:
                continue
            stmt = _enclosing_stmt(node, parents)
            g = _guard(node, parents, func)
            callee = ast.unparse(call.func) if isinstance(call, ast.Call) else type(call).__name__
            pos = call.args.index(node) if isinstance(call, ast.Call) and node in call.args else None
            others.append(f":{stmt.lineno} {callee} (argument {pos}) if {' and '.join(g) or 'always'}")
    if others:
        report.add(section, "(c) other uses of the count", "INFO",
                   "off the CUDA non-speculative branch (the wrapper is armed only for CUDA runners with "
                   "stop_flag, never under speculative decoding): " + "; ".join(others))
    # the wrapper replaces the module global: pre_process must look the name up there
    tree = side.tree(POSTPROC)
    names = cuda_import_names(tree, ("ops.gpu",))
    local = any((isinstance(n, ast.Name) and n.id == "get_padding_offset" and isinstance(n.ctx, ast.Store))
                or (isinstance(n, (ast.ImportFrom, ast.Import))
                    and any((a.asname or a.name) == "get_padding_offset" for a in n.names))
                for n in ast.walk(func))
    if "get_padding_offset" in names and not local:
        report.add(section, "(c) get_padding_offset lookup", "OK",
                   "a module global of pre_and_post_process (imported from ops.gpu on CUDA); pre_process binds "
                   "no local of that name")
    else:
        report.add(section, "(c) get_padding_offset lookup", "MISMATCH",
                   f"in the CUDA import list: {'get_padding_offset' in names}; bound inside pre_process: {local}")
    # the runner side: _prepare_inputs passes the view, after recover_decode_task
    prep = runner.methods.get("_prepare_inputs")
    if prep is None:
        return
    containers = _containers(prep)
    pre_calls = [n for n in ast.walk(prep) if isinstance(n, ast.Call) and ast.unparse(n.func) == "pre_process"]
    recover = [n for n in ast.walk(prep) if isinstance(n, ast.Call) and ast.unparse(n.func) == "recover_decode_task"]
    problems = []
    if len(pre_calls) != 1:
        problems.append(f"{len(pre_calls)} pre_process calls")
    else:
        args = pre_calls[0].args
        if len(args) < 2 or _key_of(args[1], containers) != VIEW:
            problems.append(f"pre_process's second argument is {ast.unparse(args[1]) if len(args) > 1 else 'missing'}")
    if len(recover) != 1:
        problems.append(f"{len(recover)} recover_decode_task calls")
    else:
        rargs = recover[0].args
        if len(rargs) < 2 or _key_of(rargs[1], containers) != VIEW:
            problems.append("recover_decode_task does not take the seq_lens_this_time view second")
        if pre_calls and recover[0].lineno > pre_calls[0].lineno:
            problems.append("recover_decode_task runs after pre_process")
    if problems:
        report.add(section, "(c) _prepare_inputs order", "MISMATCH", "; ".join(problems))
    else:
        g = _guard(recover[0], _parents(prep), prep)
        report.add(section, "(c) _prepare_inputs order", "OK",
                   f"recover_decode_task (:{recover[0].lineno}, if {' and '.join(g) or 'always'}) then "
                   f"pre_process (:{pre_calls[0].lineno}), both on the {VIEW} view")


def check_seed(runner: Runner, report: Report, section: str) -> None:
    """(d) the writers of ``infer_seed`` and the absence of host reads of it or of the increment."""
    forms: dict[str, list[Use]] = {}
    others: list[str] = []
    readers: list[str] = []
    increment_uses: list[str] = []
    for name, func in runner.methods.items():
        for use in uses_in(name, func, (SEED, INCREMENT)):
            if use.key == INCREMENT:
                kind = _increment_use(use)
                if kind is None:
                    increment_uses.append(f"{use.where()} {use.kind} {use.note}: {use.text}")
                continue
            form = _seed_form(use, func)
            if form == "create":
                continue
            if form == "device read":
                readers.append(f"{use.where()} seed= of {use.callee}")
            elif form in SEED_WRITERS:
                forms.setdefault(form, []).append(use)
            else:
                others.append(f"{use.where()} {use.kind} {use.note}{(' -> ' + use.callee) if use.callee else ''}: "
                              f"{use.text}")
    for form, wanted in SEED_WRITERS.items():
        sites = forms.get(form, [])
        reached = sorted({e for u in sites for e in runner.entries(u.method, wanted)})
        where = ", ".join(u.where() for u in sites)
        outside = [u.where() for u in sites if not runner.entries(u.method, wanted)]
        if not sites:
            report.add(section, f"(d) infer_seed {form}", "MISMATCH", "absent")
        elif outside:
            report.add(section, f"(d) infer_seed {form}", "MISMATCH",
                       f"at {', '.join(outside)}, not reached from {', '.join(wanted)}")
        elif reached != sorted(w for w in wanted if w in runner.methods):
            report.add(section, f"(d) infer_seed {form}", "MISMATCH",
                       f"at {where}; reached from {', '.join(reached) or 'none of'} {', '.join(wanted)}")
        else:
            report.add(section, f"(d) infer_seed {form}", "OK", f"at {where} (reached from {', '.join(reached)})")
    if others:
        report.add(section, "(d) infer_seed other uses", "MISMATCH", "; ".join(others))
    else:
        report.add(section, "(d) infer_seed other uses", "OK",
                   "none; device reads: " + ("; ".join(readers) or "none"))
    if increment_uses:
        report.add(section, "(d) infer_seed_increment uses", "MISMATCH", "; ".join(increment_uses))
    else:
        report.add(section, "(d) infer_seed_increment uses", "OK", "created in __init__ and read only by add_")
    # the increment is replaced on the device in _prepare_inputs: every add_ must come after one
    late = []
    for use in forms.get("add_(increment)", []):
        func = runner.methods[use.method]
        first = min((n.lineno for n in ast.walk(func) if isinstance(n, ast.Call)
                     and ast.unparse(n.func) == "self._prepare_inputs"), default=None)
        if first is None or first > use.line:
            late.append(use.where())
    report.add(section, "(d) add_ after _prepare_inputs", "MISMATCH" if late else "OK",
               ("add_ before any _prepare_inputs call at " + ", ".join(late)) if late else
               "every add_ follows a self._prepare_inputs() call in its method (the increment is on the device)")


def _seed_form(use: Use, func) -> str:
    if use.kind == "rebind":
        return "create" if use.method == "_init_share_inputs" else "rebind"
    if use.kind == "setitem":
        value = ast.unparse(use.value)
        return 'setitem request.get("seed")' if value in ("request.get('seed')", 'request.get("seed")') else "setitem"
    if use.kind == "inplace" and use.note == ".add_()":
        call = use.value
        if len(call.args) == 1 and ast.unparse(call.args[0]) == f"self.{INCREMENT}":
            return "add_(increment)"
        return "add_"
    if use.kind == "augassign":
        for node in ast.walk(func):
            if isinstance(node, ast.AugAssign) and node.lineno == use.line and isinstance(node.op, ast.Mod) \
                    and isinstance(node.target, ast.Subscript) and ast.unparse(node.target.slice) == ":" \
                    and ast.unparse(node.value) == "self.MAX_INFER_SEED":
                return "[:] %= MAX_INFER_SEED"
        return "augassign"
    if use.kind == "helper" and "fill" in use.callee:
        return "fill"
    if use.kind == "inplace" and use.note == ".fill_()":
        return "fill"
    if use.kind == "passed" and use.note == "seed=":
        return "device read"
    return use.kind


def _increment_use(use: Use) -> str | None:
    if use.kind == "rebind" and use.method == "__init__":
        return "create"
    if use.kind == "passed" and use.callee.endswith(".add_"):
        return "add_"
    return None


def check_other_writers(runner: Runner, report: Report, section: str) -> None:
    """(e) runner methods outside the watched inserts that write a watched tensor."""
    inside = set(runner.reach(INSERTS))
    keys = WATCHED + (VIEW,)
    uncovered = []
    listed = 0
    for name, func in runner.methods.items():
        if name in inside:
            continue
        host, handed = [], []
        for use in uses_in(name, func, keys):
            label = use.key if use.key != VIEW else f"{VIEW} (view of the buffer)"
            if use.kind in ("setitem", "augassign", "setitem-other", "inplace", "helper", "rebind"):
                what = {"setitem": "setitem", "augassign": "augmented setitem", "setitem-other": "store",
                        "inplace": (use.note or "in place"), "helper": f"{use.callee}(...)",
                        "rebind": "rebinds"}[use.kind]
                if use.kind == "rebind" and use.key == VIEW:
                    what = "rebinds the view"
                host.append(f"{label} {what} :{use.line}")
            elif use.kind == "passed" and use.key != VIEW:
                handed.append(f"{label} -> {use.callee}")
            elif use.kind == "alias" and use.key != VIEW:
                handed.append(f"{label} -> bound to another name: {use.text[:60]}")
        containers = _containers(func)
        whole = sorted({ast.unparse(n.func) for n in ast.walk(func) if isinstance(n, ast.Call)
                        and any(ast.unparse(a) in containers for a in n.args + [k.value for k in n.keywords])
                        and not any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in n.args)})
        if not host and not handed and not whole:
            continue
        listed += 1
        how = COVERAGE.get(name)
        parts = []
        if host:
            parts.append("host writes: " + ", ".join(host))
        if handed:
            parts.append("handed to: " + ", ".join(sorted(set(handed))))
        if whole:
            parts.append("share_inputs handed whole to: " + ", ".join(whole))
        if how is None and host:
            uncovered.append(name)
            report.add(section, f"(e) {name}", "MISMATCH", "; ".join(parts) + " - not accounted for by the shadow")
        else:
            report.add(section, f"(e) {name}", "INFO", "; ".join(parts) + f" - {how or 'reads/device ops only'}")
    report.add(section, "(e) summary", "MISMATCH" if uncovered else "OK",
               f"{listed} other methods touch a watched tensor; host writes not accounted for: "
               f"{', '.join(uncovered) or 'none'}")


# --- (f) the non-V1 scheduler ---------------------------------------------------------------------

SWITCH = "ENABLE_V1_KVCACHE_SCHEDULER"
ENVS = "envs"  # the runner-module global the plugin reads the switch from (own_path_reason)
STEP_CUDA = "step_cuda"
#: what step_cuda's ops must be handed for the shadow to be unknowable under V0
V0_REWRITTEN = ("seq_lens_encoder", "is_block_step", "block_tables", VIEW)


def _switch_guard(cond: str) -> bool | None:
    """True: the condition selects the non-V1 path; False: the V1 path; None: unrelated."""
    text = cond.replace(" ", "")
    plain = f"{ENVS}.{SWITCH}"
    if text in (f"not{plain}", f"not({plain})", f"{plain}==0"):
        return True
    if text in (plain, f"{plain}==1", f"bool({plain})"):
        return False
    return None


def _non_v1_guarded(node, parents, stop) -> bool:
    """The node runs only when the switch is off (an enclosing ``if not envs.SWITCH:`` body, or the
    ``else`` of an ``if envs.SWITCH:``)."""
    child, cur = node, parents.get(node)
    while cur is not None and cur is not stop:
        if isinstance(cur, ast.If):
            sel = _switch_guard(ast.unparse(cur.test))
            if sel is True and child in cur.body:
                return True
            if sel is False and child in cur.orelse:
                return True
        child, cur = cur, parents.get(cur)
    return False


def _starred_keys(func, share: str) -> dict[str, set]:
    """``args = [share[name] for name in names]`` with ``names`` a tuple of strings -> {"args": keys}
    (the replica's ``step_cuda`` hands its tensors as ``op(*args, ...)``)."""
    consts = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, (ast.Tuple, ast.List)) \
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts):
            consts[node.targets[0].id] = {e.value for e in node.value.elts}
    out = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.ListComp) and len(node.value.generators) == 1:
            elt, gen = node.value.elt, node.value.generators[0]
            if isinstance(elt, ast.Subscript) and ast.unparse(elt.value) == share and isinstance(gen.iter, ast.Name) \
                    and gen.iter.id in consts and ast.unparse(elt.slice) == ast.unparse(gen.target):
                out[node.targets[0].id] = consts[gen.iter.id]
    return out


def check_non_v1(side: Side, runner: Runner, report: Report, section: str) -> None:
    """(f) FastDeploy's V0 path rewrites the step state on the device, and the switch the plugin
    stands down on is where it reads it."""
    # FastDeploy's side: step_cuda under the switch, in the step
    problems, sites = [], []
    for name in ("execute_model", "_dummy_run"):
        func = runner.methods.get(name)
        if func is None:
            continue
        parents = _parents(func)
        for node in ast.walk(func):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == STEP_CUDA:
                whole = bool(node.args) and ast.unparse(node.args[0]) in _containers(func)
                guarded = _non_v1_guarded(node, parents, func)
                sites.append(f"{name}:{node.lineno}" + ("" if guarded else " (not under the switch)"))
                if name == "execute_model" and not (whole and guarded):
                    problems.append(f"execute_model:{node.lineno} step_cuda(" + (
                        "share_inputs" if whole else "not share_inputs") + ", ...) " + (
                        "only when the switch is off" if guarded else f"NOT guarded by not {ENVS}.{SWITCH}"))
    if not any(s.startswith("execute_model:") for s in sites):
        problems.append("execute_model does not call step_cuda(...)")
    func = side.ast_def(POSTPROC, STEP_CUDA)
    handed: dict[str, set] = {}
    ops = 0
    if func is None:
        problems.append(f"{POSTPROC}.{STEP_CUDA} not found")
    else:
        share = func.args.args[0].arg if func.args.args else "share_inputs"
        starred = _starred_keys(func, share)
        for node in ast.walk(func):
            if isinstance(node, ast.Call):
                keys = {a.slice.value for a in node.args if isinstance(a, ast.Subscript)
                        and ast.unparse(a.value) == share and isinstance(a.slice, ast.Constant)}
                for a in node.args:
                    if isinstance(a, ast.Starred) and isinstance(a.value, ast.Name):
                        keys |= starred.get(a.value.id, set())
                if keys:
                    ops += 1
                    for key in V0_REWRITTEN:
                        handed.setdefault(key, set())
                        if key in keys:
                            handed[key].add(ast.unparse(node.func))
        missing = [k for k in V0_REWRITTEN if not handed.get(k) or len(handed[k]) < ops]
        if not ops:
            problems.append(f"{STEP_CUDA} hands no share_inputs tensor to an op")
        elif missing:
            problems.append(f"{STEP_CUDA}'s ops do not all take {', '.join(missing)}")
    item = "(f) non-V1: step_cuda rewrites the step state"
    if problems:
        report.add(section, item, "MISMATCH", "; ".join(problems))
    else:
        report.add(section, item, "OK",
                   f"step_cuda(share_inputs, ...) only when {ENVS}.{SWITCH} is off at {', '.join(sites)}; its "
                   f"{ops} ops ({', '.join(sorted(set().union(*handed.values())))}) each take "
                   f"{', '.join(V0_REWRITTEN)}: the host cannot know the step state - the plugin must stand down")
    # the switch the plugin reads: <runner module>.envs.SWITCH
    item = "(f) non-V1: the stand-down reads the switch"
    tree = side.tree(RUNNER)
    bound = []
    for node in (tree.body if tree is not None else []):
        # ``from fastdeploy import envs``, or relative from the package root (``from .. import envs``)
        root_pkg = (node.module == side.root and not node.level) or (
            node.module is None and node.level == len(RUNNER.split("."))) if isinstance(node, ast.ImportFrom) else False
        if root_pkg:
            bound += [f"from {'.' * node.level or node.module} import {a.name}" + (f" as {a.asname}" if a.asname else "")
                      for a in node.names if (a.asname or a.name) == ENVS and a.name == ENVS]
        elif isinstance(node, ast.Import):
            bound += [f"import {a.name} as {a.asname}" for a in node.names
                      if a.asname == ENVS and a.name == f"{side.root}.{ENVS}"]
    rebound = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == ENVS
               and isinstance(n.ctx, ast.Store)] if tree is not None else []
    envs_tree = side.tree(ENVS)
    declared = False
    for node in ast.walk(envs_tree) if envs_tree is not None else ():
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == SWITCH for k in node.keys):
            declared = True
    reads = sorted({n.lineno for n in ast.walk(runner.cls) if isinstance(n, ast.Attribute) and n.attr == SWITCH
                    and ast.unparse(n.value) == ENVS})
    probe = _probe_stand_down(side)
    wrong = []
    if len(bound) != 1:
        wrong.append(f"the runner module binds {ENVS!r} {len(bound)} times from {side.root}.{ENVS} "
                     f"({'; '.join(bound) or 'never'}): the plugin reads <runner module>.{ENVS}")
    if rebound:
        wrong.append(f"{ENVS} is rebound at lines {rebound}")
    if not declared:
        wrong.append(f"{side.root}/{ENVS}.py declares no {SWITCH}")
    probed, probe = probe
    if probed is False:
        wrong.append(probe)
    if wrong:
        report.add(section, item, "MISMATCH", "; ".join(wrong))
    else:
        report.add(section, item, "OK",
                   f"{bound[0]} (module global, never rebound); {ENVS}.py declares {SWITCH}; the runner reads it "
                   f"at lines {reads}; " + (probe or "the plugin's decision not asked (the runner module did not "
                                                     "import: AST only)"))
    if side.root == "fastdeploy":  # the replica has no FastDeploy config to build a runner from
        _run_probe(side, report, section)


def _run_probe(side: Side, report: Report, section: str) -> None:
    """The row from a real runner (``non_v1_probe``, in a child process): where FastDeploy's runner
    module imported here (the import route); SKIP otherwise."""
    import json
    import os
    import subprocess
    import sys

    from .common import REPO_ROOT
    from .non_v1_probe import non_v1_row

    item = "(f) non-V1: a real runner keeps FastDeploy's exist_prefill"
    module = side.modules.get(RUNNER)
    package = sys.modules.get(side.root)
    if module is None or package is None or side.root != "fastdeploy":
        report.add(section, item, "SKIP", "the runner module did not import here (AST route): no real runner")
        return
    fd_root = os.path.dirname(os.path.dirname(os.path.abspath(package.__file__)))
    tools = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    plugin = sys.modules.get("fd_async_copy_plugin")  # the child uses the plugin this report uses
    plugin_root = os.path.dirname(os.path.dirname(os.path.abspath(plugin.__file__))) if plugin else REPO_ROOT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tools, plugin_root, os.environ.get("PYTHONPATH", "")])}
    env.pop("ENABLE_V1_KVCACHE_SCHEDULER", None)
    try:
        done = subprocess.run([sys.executable, "-m", "real_fd.non_v1_probe", fd_root], capture_output=True,
                              text=True, env=env, timeout=600)
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - a probe that cannot run is a SKIP, with why
        result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    status, detail = non_v1_row(result)
    report.add(section, item, status, detail)


def _probe_stand_down(side: Side) -> tuple[bool | None, str]:
    """The plugin's own decision on the imported runner module with the switch off: (True, what it
    said), (False, why it would not stand down), or (None, "" or why it was not asked)."""
    import os

    module = side.modules.get(RUNNER)
    if module is None:
        return None, ""
    try:
        from fd_async_copy_plugin.patches.step_syncs import own_path_reason
    except Exception as exc:  # noqa: BLE001 - the plugin needs Paddle
        return None, f"the plugin's decision not asked ({type(exc).__name__}: {exc})"[:200]
    envs = getattr(module, ENVS, None)
    saved = os.environ.get(SWITCH)
    had = envs is not None and SWITCH in vars(envs)
    kept = vars(envs).pop(SWITCH) if had else None  # a value FastDeploy assigned would hide the variable
    os.environ[SWITCH] = "0"
    try:
        value = getattr(envs, SWITCH, None) if envs is not None else None
        reason = own_path_reason(object(), module)
    finally:
        if saved is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = saved
        if had:
            setattr(envs, SWITCH, kept)
    if "non-V1 scheduler" not in reason:
        return False, (f"the plugin's own_path_reason on the imported runner module with {SWITCH}=0 answered "
                       f"{reason!r} ({ENVS}.{SWITCH} read {value!r}): it would not stand down")
    return True, f"with {SWITCH}=0 the plugin's own_path_reason on the imported module says {reason!r}"


# --- entry ---------------------------------------------------------------------------------------


def check_step_syncs(side: Side, report: Report, profile: str | None, *, replica: bool = False) -> None:
    from .step_syncs_fd25 import PROFILE as SEED_PROFILE, check_seed_fd25, seed_placement

    if (replica and side.root.endswith(".fd25")) or (not replica and profile == SEED_PROFILE):
        # FastDeploy 2.5: the sampling seed (step_syncs_fd25, rows (d25)) and the token_num reads (token_num_fd25, (t25))
        section = f"{SECTION} replica" if replica else SECTION
        report.add(section, "profile", "INFO", (f"{side.root} models {SEED_PROFILE}" if replica else SEED_PROFILE)
                   + f": {SECTION} moves the sampling seed (sync T), rows (d25), and answers the token_num reads from a "
                   f"host shadow, rows (t25); rows (a)-(f) are for {PROFILE}")
        check_seed_fd25(side, report, section)
        from .token_num_fd25 import check_token_num_fd25

        check_token_num_fd25(side, report, section)  # rows (t25): the token_num waits
        return
    if not replica and profile != PROFILE:
        report.add(SECTION, "profile", "SKIP", f"{SECTION} is applied on {PROFILE}, and on {SEED_PROFILE} for the "
                   f"sampling seed and the token_num reads; this tree is {profile}")
        seed_placement(side, report, SECTION)
        return
    section = feature_section(report, SECTION, profile, PROFILE, replica)
    if section is None:
        return
    runner = _runner_of(side)
    if runner is None:
        report.add(section, CLASS, "MISMATCH", f"{side.root}.{RUNNER}:{CLASS} not found (source)")
        return
    report.add(section, "source", "INFO", f"{side.path(RUNNER)}, {side.path(POSTPROC)}")
    check_inserts(runner, report, section)
    check_bad_tokens_len(runner, report, section)
    check_token_count(side, runner, report, section)
    check_seed(runner, report, section)
    check_other_writers(runner, report, section)
    check_non_v1(side, runner, report, section)
