"""Section ``step_syncs`` on FastDeploy 2.5: (d25) the sampling seed on the device.

On 2.5 ``patches/step_syncs.py`` moves the seed only (sync "T"): right after ``GPUModelRunner.__init__``
returns it replaces ``self.share_inputs["infer_seed"]`` (an ``InputBatch`` attribute) and
``self.infer_seed_increment`` by device copies with the same values, so that ``top_k_top_p_sampling``
gets a device ``topp_seed``. That is exact only if FastDeploy's code has this shape, read here by AST:

1. ``InputBatch.init_share_inputs`` creates ``self.infer_seed = paddle.full(...).cpu()`` (host),
   ``GPUModelRunner.__init__`` binds ``self.share_inputs = InputBatch(...)``, calls
   ``self.share_inputs.init_share_inputs()`` and then creates ``self.infer_seed_increment =
   paddle.full(...).cpu()``; nothing else in the runner or ``InputBatch`` rebinds either tensor (or
   the whole ``share_inputs``, or calls ``init_share_inputs`` again). ``ProposerInputBatch`` (MTP)
   shares the target's ``infer_seed``: speculative decoding, where the plugin stands down - listed;
2. the writers of ``infer_seed`` are only: setitem of ``request.get("seed")``,
   ``.add_(self.infer_seed_increment)``, ``[:] %= self.MAX_INFER_SEED``,
   ``fill_paddle_tensor(self, "infer_seed", 0)`` (whose body fills in place) and
   ``swap_data(self.infer_seed, i1, i2)`` (a local helper that only clones and sets items);
3. no host read of either tensor (``.numpy()``, ``.item()``, ``.tolist()``, ``.cpu()``, ``int()`` and
   the like, an ``if`` test, a name bound to it) in the runner, ``InputBatch`` (and the module's
   functions) or the sampler; the runner hands it to the sampler as ``SamplingMetadata(seed=...)``,
   ``Sampler.forward_cuda`` passes ``sampling_metadata.seed`` as ``top_k_top_p_sampling(...,
   topp_seed=...)`` and the speculative samplers hand it to sampler-module functions whose use of it
   is followed (device ops only).

Checked on the FastDeploy side when the detected profile is ``fastdeploy-2.5``, and on the replica
``...reference.fd25``. On other non-2.4 profiles (2.6+/develop) one INFO row says where the seed is
created (develop creates it on the device itself).
"""

from __future__ import annotations

import ast

from .common import INPUT_BATCH, RUNNER, SAMPLER, Report
from .side import Side
from .step_syncs import _HOST_CONVERT, _NP, _classify, _containers, _methods, _parents

PROFILE = "fastdeploy-2.5"
SEED, INCREMENT = "infer_seed", "infer_seed_increment"
CLASS, BATCH, PROPOSER = "GPUModelRunner", "InputBatch", "ProposerInputBatch"
UTILS = "utils"

ROW_CREATE = "(d25) 1. infer_seed and the increment: created on the host once, never rebound"
ROW_WRITERS = "(d25) 2. the writers of infer_seed"
ROW_READS = "(d25) 3. no host read of infer_seed or the increment"
ROW_PLACEMENT = "(d25) seed placement"

#: writer forms of assumption 2, in the order they are reported
WRITER_FORMS = ('setitem request.get("seed")', "add_(increment)", "[:] %= MAX_INFER_SEED",
                'fill_paddle_tensor(self, "infer_seed", 0)', "swap_data(infer_seed, i1, i2)")
#: method calls on a tensor that bring it to the host (a blocking device-to-host copy)
_TO_HOST = {"numpy", "tolist", "item", "cpu", "pin_memory", "__bool__", "__int__", "__index__", "__float__"}


def _file(rel: str) -> str:
    return rel.replace(".", "/") + ".py"


def _is_host_creation(value) -> bool:
    """``paddle.<op>(...).cpu()`` (or ``.pin_memory()``): created on the host."""
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr in ("cpu", "pin_memory") and isinstance(value.func.value, ast.Call)
            and ast.unparse(value.func.value.func).startswith("paddle."))


def _short(value) -> str:
    """``paddle.full(...).cpu()``: a creation without its arguments."""
    if _is_host_creation(value):
        return f"{ast.unparse(value.func.value.func)}(...).{value.func.attr}()"
    if isinstance(value, ast.Call):
        return f"{ast.unparse(value.func)}(...)"
    return ast.unparse(value)[:60]


def _is_paddle_creation(value) -> bool:
    return isinstance(value, ast.Call) and ast.unparse(value.func).startswith("paddle.")


def _host_read(kind: str, note: str) -> str | None:
    """Why a classified use brings the tensor to the host, or None."""
    if kind == "host-read":
        return f"a host read ({note})"
    if kind == "if-read":
        return "a host read (an if test)"
    if kind == "read" and note.startswith(".") and note.rstrip("()")[1:] in _TO_HOST:
        return f"a host read ({note})"
    if kind == "read" and note.startswith("index read passed to "):
        callee = note.removeprefix("index read passed to ")
        if callee in _HOST_CONVERT or callee.split(".")[0] in _NP:
            return f"a host read (indexing used as a Python value: {callee}(...))"
    if kind == "read" and note.startswith("index read in ") and note.split()[-1] in (
            "If", "While", "IfExp", "BoolOp", "UnaryOp", "Compare", "FormattedValue", "JoinedStr"):
        return f"a host read (indexing used as a Python value: {note.split()[-1]})"
    return None


# --- references --------------------------------------------------------------------------------


class Ref:
    """One use of the seed or of the increment."""

    def __init__(self, where: str, key: str, kind: str, line: int, text: str, note: str = "", value=None,
                 callee: str = "", func=None):
        self.where, self.key, self.kind, self.line, self.text = where, key, kind, line, text
        self.note, self.value, self.callee, self.func = note, value, callee, func

    def at(self) -> str:
        """``file.py:line (method)``; ``where`` is ``"<path> <Class.method>"``."""
        path, label = self.where.split(" ", 1)
        return f"{path.rsplit('/', 1)[-1]}:{self.line} ({label.removeprefix(CLASS + '.')})"


def refs_in(label: str, file: str, func, keys) -> list[Ref]:
    """Every use in ``func`` of the tensors ``keys``: ``<x>.key``, ``<x>["key"]``, and the name given
    as a string (``fill_paddle_tensor(self, "key", v)``, ``setattr``, ``.pop``, ``.update({...})``)."""
    parents = _parents(func)
    containers = _containers(func)
    out = []
    for node in ast.walk(func):
        key = None
        if isinstance(node, ast.Attribute) and node.attr in keys:
            key = node.attr
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in keys:
            key = node.slice.value
        if key is not None:
            use = _classify(label, key, node, parents, containers)
            out.append(Ref(f"{file} {label}", key, use.kind, use.line, use.text, use.note, use.value, use.callee,
                           func))
            continue
        if isinstance(node, ast.Constant) and node.value in keys and not (
                isinstance(parents.get(node), ast.Subscript) and parents[node].slice is node):
            out.append(_string_use(label, file, node, parents, func))
        elif isinstance(node, ast.keyword) and node.arg in keys:  # update(infer_seed=...), dict(infer_seed=...)
            call = parents.get(node)
            out.append(Ref(f"{file} {label}", node.arg, "rebind", node.value.lineno, ast.unparse(call)[:120],
                           f"{node.arg}= in {ast.unparse(call.func)}(...)", func=func))
    out.sort(key=lambda r: r.line)
    return out


def _string_use(label, file, node, parents, func) -> Ref:
    where = f"{file} {label}"
    p = parents.get(node)
    line = getattr(node, "lineno", 0)
    looped = _fill_loop_call(node, parents)
    if looped is not None:  # for key, value in (..., ("infer_seed", 0), ...): fill_paddle_tensor(self, key, value)
        return Ref(where, node.value, "helper", line, ast.unparse(looped)[:120], "in a loop over (key, value) pairs",
                   callee=ast.unparse(looped.func), value=looped, func=func)
    if isinstance(p, ast.Dict):  # {"infer_seed": ...}: handed to update / built into a dict
        return Ref(where, node.value, "rebind", line, ast.unparse(p)[:120], "a dict entry (update/replacement)",
                   func=func)
    if isinstance(p, ast.Call):
        callee = ast.unparse(p.func)
        name = callee.split(".")[-1]
        if name == "fill_paddle_tensor":
            return Ref(where, node.value, "helper", line, ast.unparse(p)[:120], callee=callee, value=p, func=func)
        if name in ("setattr", "pop", "__setitem__", "__delitem__", "delattr", "setdefault"):
            return Ref(where, node.value, "rebind", line, ast.unparse(p)[:120], f"{callee}(...)", func=func)
        return Ref(where, node.value, "passed", line, ast.unparse(p)[:120], "by name", callee=callee, func=func)
    return Ref(where, node.value, "read", line, ast.unparse(p)[:120] if p is not None else repr(node.value),
               "the name as a string", func=func)


def _fill_loop_call(node, parents):
    """``for k, v in (..., (node, value), ...): fill_paddle_tensor(self, k, v)`` -> the call as it runs
    for this pair (``fill_paddle_tensor(self, "infer_seed", value)``), else None."""
    pair, pairs = parents.get(node), None
    if isinstance(pair, ast.Tuple) and len(pair.elts) == 2 and pair.elts[0] is node:
        pairs = parents.get(pair)
    loop = parents.get(pairs) if isinstance(pairs, (ast.Tuple, ast.List)) else None
    if not (isinstance(loop, ast.For) and loop.iter is pairs and isinstance(loop.target, ast.Tuple)
            and len(loop.target.elts) == 2 and all(isinstance(e, ast.Name) for e in loop.target.elts)):
        return None
    k, v = (e.id for e in loop.target.elts)
    for stmt in loop.body:
        for call in ast.walk(stmt):
            if isinstance(call, ast.Call) and ast.unparse(call.func).split(".")[-1] == "fill_paddle_tensor" \
                    and [ast.unparse(a) for a in call.args[1:]] == [k, v]:
                made = ast.Call(func=call.func, args=[call.args[0], ast.Constant(node.value), pair.elts[1]], keywords=[])
                return ast.copy_location(made, node)
    return None


# --- resolving names the checks follow ------------------------------------------------------------


def _import_target(side: Side, tree: ast.Module, rel: str, name: str) -> str | None:
    """The absolute dotted module ``name`` is imported from in the module ``rel`` (any depth: FastDeploy
    imports ``fill_paddle_tensor`` inside ``reset_share_inputs``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            if node.level:
                base = (side.root + "." + rel).split(".")[:-node.level]
                return ".".join(base + ([node.module] if node.module else []))
            return node.module
    return None


def _module_tree(side: Side, dotted: str) -> ast.Module | None:
    if dotted.startswith(side.root + "."):
        return side.tree(dotted[len(side.root) + 1:])
    path = side._file_for(dotted)  # another root (the fd25 replica re-exports fd24's helpers)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def _find_function(side: Side, dotted: str, name: str, hops: int = 3):
    """(dotted module, FunctionDef) of ``name`` defined in, or re-exported through, ``dotted``."""
    for _ in range(hops):
        tree = _module_tree(side, dotted)
        if tree is None:
            return dotted, None
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return dotted, node
        nxt = None
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                if node.level:
                    base = dotted.split(".")[:-node.level]  # a module: its package is dotted[:-1]
                    nxt = ".".join(base + ([node.module] if node.module else []))
                else:
                    nxt = node.module
        if nxt is None:
            return dotted, None
        dotted = nxt
    return dotted, None


def _fills_in_place(func: ast.FunctionDef) -> tuple[bool, str]:
    """``fill_paddle_tensor``: a ``.fill_(...)`` on the tensor it looks up, and no rebinding."""
    fills = [n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "fill_"]
    rebinds = [n.lineno for n in ast.walk(func) if (isinstance(n, ast.Call) and ast.unparse(n.func) in (
        "setattr", "delattr")) or (isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store))
        or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in (
            "__setitem__", "update", "pop"))]
    if not fills:
        return False, "no .fill_(...) in its body"
    if rebinds:
        return False, f"it also stores into the container at :{', :'.join(map(str, rebinds))}"
    return True, f"{ast.unparse(fills[0].func)}(...) at :{fills[0].lineno}, in place"


def _swap_is_device_safe(helper: ast.FunctionDef) -> tuple[bool, str]:
    """``swap_data(tensor, i1, i2)``: only ``t = tensor[i].clone()`` and ``tensor[i] = <clone or t>``."""
    if not helper.args.args:
        return False, "takes no tensor"
    tensor = helper.args.args[0].arg
    temps: set[str] = set()
    bad = []

    def clone_of_tensor(value) -> bool:
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "clone"
                and not value.args and isinstance(value.func.value, ast.Subscript)
                and ast.unparse(value.func.value.value) == tensor)

    for stmt in helper.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # docstring
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
            ok_value = clone_of_tensor(value) or (isinstance(value, ast.Name) and value.id in temps)
            if isinstance(target, ast.Name) and clone_of_tensor(value):
                temps.add(target.id)
                continue
            if isinstance(target, ast.Subscript) and ast.unparse(target.value) == tensor and ok_value:
                continue
        bad.append(f":{stmt.lineno} {ast.unparse(stmt).splitlines()[0][:80]}")
    if bad:
        return False, "other statements: " + "; ".join(bad)
    return True, "clone + setitem of tensors only"


def _local_def(func, name: str):
    for node in ast.walk(func):
        if isinstance(node, ast.FunctionDef) and node.name == name and node is not func:
            return node
    return None


def _update_keys(side: Side, runner_tree, func, call: ast.Call) -> tuple[set | None, str]:
    """The keys ``share_inputs.update(arg)`` binds, or (None, why not known)."""
    if not call.args:
        return {k.arg for k in call.keywords}, "keywords"
    arg = call.args[0]
    if isinstance(arg, ast.Dict):
        keys = {k.value for k in arg.keys if isinstance(k, ast.Constant)}
        return (keys, "a dict literal") if len(keys) == len(arg.keys) else (None, "a dict with computed keys")
    if isinstance(arg, ast.Name):
        sources = [n.value for n in ast.walk(func) if isinstance(n, ast.Assign) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name) and n.targets[0].id == arg.id]
        if len(sources) == 1 and isinstance(sources[0], ast.Call) and isinstance(sources[0].func, ast.Name):
            fname = sources[0].func.id
            module = _import_target(side, runner_tree, RUNNER, fname) if runner_tree is not None else None
            if module is None:
                return None, f"{arg.id} = {fname}(...): {fname} not imported by name"
            where, helper = _find_function(side, module, fname)
            if helper is None:
                return None, f"{arg.id} = {fname}(...): not found in {where}"
            keys, computed = set(), []
            for node in ast.walk(helper):
                if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                    if isinstance(node.slice, ast.Constant):
                        keys.add(node.slice.value)
                    else:
                        computed.append(node.lineno)
                elif isinstance(node, ast.Dict):
                    keys.update(k.value for k in node.keys if isinstance(k, ast.Constant))
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
                    computed.append(node.lineno)
            if computed:
                return None, f"{arg.id} = {fname}(...): keys computed at :{computed}"
            return keys, f"{arg.id} = {fname}(...) ({where.split('.')[-1]}.py:{helper.lineno}, keys read)"
        return None, f"{arg.id}: not bound once from a function call"
    return None, f"{ast.unparse(arg)[:60]}: not a dict literal or a name"


# --- the rows -------------------------------------------------------------------------------------


def check_seed_fd25(side: Side, report: Report, section: str) -> None:
    runner_cls = side.ast_def(RUNNER, CLASS)
    batch_tree = side.tree(INPUT_BATCH)
    batch_cls = side.ast_def(INPUT_BATCH, BATCH)
    if not isinstance(runner_cls, ast.ClassDef) or not isinstance(batch_cls, ast.ClassDef):
        missing = [f"{side.root}.{rel}:{name}" for rel, name, node in (
            (RUNNER, CLASS, runner_cls), (INPUT_BATCH, BATCH, batch_cls)) if not isinstance(node, ast.ClassDef)]
        for row in (ROW_CREATE, ROW_WRITERS, ROW_READS):
            report.add(section, row, "MISMATCH", f"{', '.join(missing)} not found (source)")
        return
    report.add(section, "(d25) source", "INFO",
               f"{side.path(RUNNER)}, {side.path(INPUT_BATCH)}, {side.path(SAMPLER)}")
    runner_file, batch_file = _file(RUNNER), _file(INPUT_BATCH)
    refs: list[Ref] = []
    runner_methods, batch_methods = _methods(runner_cls), _methods(batch_cls)
    for name, func in runner_methods.items():
        refs += refs_in(f"{CLASS}.{name}", runner_file, func, (SEED, INCREMENT))
    for name, func in batch_methods.items():
        refs += refs_in(f"{BATCH}.{name}", batch_file, func, (SEED, INCREMENT))
    module_funcs = [n for n in batch_tree.body if isinstance(n, ast.FunctionDef)]
    for func in module_funcs:
        refs += refs_in(func.name, batch_file, func, (SEED, INCREMENT))
    create_problems, writer_problems, read_problems = [], [], []
    created, forms, device_reads = [], {f: [] for f in WRITER_FORMS}, []
    for ref in refs:
        _sort_ref(side, ref, created, forms, device_reads, create_problems, writer_problems, read_problems)
    _row_create(side, report, section, runner_cls, batch_cls, batch_tree, created, create_problems)
    _row_writers(report, section, forms, writer_problems)
    _row_reads(side, report, section, device_reads, read_problems)


def _sort_ref(side, ref: Ref, created, forms, device_reads, create_problems, writer_problems, read_problems):
    detail = f"{ref.at()} {ref.key}: {ref.kind}{(' ' + ref.note) if ref.note else ''}" \
             f"{(' -> ' + ref.callee) if ref.callee else ''}: {ref.text}"
    if ref.kind == "rebind":
        expected = (ref.key == SEED and ref.where.endswith(f"{BATCH}.init_share_inputs")) or (
            ref.key == INCREMENT and ref.where.endswith(f"{CLASS}.__init__"))
        if expected and ref.value is not None:
            created.append(ref)
            if not _is_host_creation(ref.value):
                create_problems.append(f"{ref.at()} {ref.key} = {ast.unparse(ref.value)[:80]}: not created on the "
                                       f"host (paddle.<op>(...).cpu())")
            return
        create_problems.append(f"{detail} - rebinds {ref.key}")
        return
    if ref.key == INCREMENT:
        if ref.kind == "passed" and ref.callee.endswith(".add_") and _add_target_is_seed(ref):
            return  # the increment read by add_ (a device op)
        read_problems.append(detail)
        return
    form = _writer_form(side, ref, writer_problems)
    if form is not None:
        forms[form].append(ref)
        return
    if ref.kind in ("setitem", "augassign", "setitem-other", "inplace", "helper"):
        writer_problems.append(f"{detail} - another writer")
        return
    if ref.kind == "passed" and ref.note == "seed=" and ref.callee.split(".")[-1] == "SamplingMetadata":
        device_reads.append(f"{ref.at()} SamplingMetadata(seed=...)")
        return
    if ref.kind == "read" and (ref.note.startswith("index read passed to paddle.")
                               or ref.note in (".shape", ".dtype", ".place")):
        device_reads.append(f"{ref.at()} {ref.note}")
        return
    why = _host_read(ref.kind, ref.note) or {
        "alias": "bound to another name (not followed)",
        "passed": "handed to a call that is not followed (may read it on the host)"}.get(
        ref.kind, "a use that is not a known device read")
    read_problems.append(f"{detail} - {why}")


def _add_target_is_seed(ref: Ref) -> bool:
    for node in ast.walk(ref.func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_" \
                and node.lineno == ref.line and node.args and ast.unparse(node.args[0]).endswith(INCREMENT):
            base = node.func.value
            return (isinstance(base, ast.Attribute) and base.attr == SEED) or (
                isinstance(base, ast.Subscript) and isinstance(base.slice, ast.Constant) and base.slice.value == SEED)
    return False


def _writer_form(side: Side, ref: Ref, writer_problems) -> str | None:
    """The writer form of assumption 2 that ``ref`` is, or None."""
    if ref.kind == "setitem" and ast.unparse(ref.value) in ("request.get('seed')", 'request.get("seed")'):
        return WRITER_FORMS[0]
    if ref.kind == "inplace" and ref.note == ".add_()":
        call = ref.value
        if len(call.args) == 1 and not call.keywords and ast.unparse(call.args[0]) == f"self.{INCREMENT}":
            return WRITER_FORMS[1]
        return None
    if ref.kind == "augassign":
        for node in ast.walk(ref.func):
            if isinstance(node, ast.AugAssign) and node.lineno == ref.line and isinstance(node.op, ast.Mod) \
                    and isinstance(node.target, ast.Subscript) and ast.unparse(node.target.slice) == ":" \
                    and ast.unparse(node.value) == "self.MAX_INFER_SEED":
                return WRITER_FORMS[2]
        return None
    if ref.kind == "helper" and ref.callee.split(".")[-1] == "fill_paddle_tensor":
        call = ref.value
        args = [ast.unparse(a) for a in call.args]
        if len(args) != 3 or args[0] != "self" or args[2] != "0":
            writer_problems.append(f"{ref.at()} {ast.unparse(call)[:80]}: not fill_paddle_tensor(self, "
                                   f"\"{SEED}\", 0)")
            return WRITER_FORMS[3]
        tree = side.tree(INPUT_BATCH)
        module = _import_target(side, tree, INPUT_BATCH, "fill_paddle_tensor") if tree is not None else None
        where, func = _find_function(side, module, "fill_paddle_tensor") if module else (None, None)
        if func is None:
            writer_problems.append(f"{ref.at()} fill_paddle_tensor: definition not found"
                                   + (f" (imported from {module})" if module else " (no import of it)"))
        else:
            ok, why = _fills_in_place(func)
            ref.note = f"{where}:{func.lineno}: {why}"
            if not ok:
                writer_problems.append(f"{ref.at()} fill_paddle_tensor ({where}:{func.lineno}): {why}")
        return WRITER_FORMS[3]
    if ref.kind == "passed" and ref.callee == "swap_data":
        helper = _local_def(ref.func, "swap_data")
        if helper is None:
            writer_problems.append(f"{ref.at()} swap_data: not a local helper of the method")
        else:
            ok, why = _swap_is_device_safe(helper)
            ref.note = f"swap_data :{helper.lineno} {why}"
            if not ok:
                writer_problems.append(f"{ref.at()} swap_data (:{helper.lineno}): {why}")
        return WRITER_FORMS[4]
    return None


def _row_create(side, report, section, runner_cls, batch_cls, batch_tree, created, problems):
    runner_file, batch_file = _file(RUNNER), _file(INPUT_BATCH)
    seeds = [r for r in created if r.key == SEED]
    incs = [r for r in created if r.key == INCREMENT]
    if len(seeds) != 1:
        problems.append(f"{len(seeds)} creations of self.{SEED} in {BATCH}.init_share_inputs; expected one")
    if len(incs) != 1:
        problems.append(f"{len(incs)} creations of self.{INCREMENT} in {CLASS}.__init__; expected one")
    # share_inputs bound once, in __init__, to an InputBatch whose init_share_inputs runs before the increment
    binds, inits, updates = [], [], []
    short = runner_file.rsplit("/", 1)[-1]
    runner_tree = side.tree(RUNNER)
    for name, func in _methods(runner_cls).items():
        for node in ast.walk(func):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(ast.unparse(t) == "self.share_inputs" for t in targets):
                    binds.append((name, node.lineno, ast.unparse(node.value)[:60]))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "init_share_inputs":
                inits.append((name, node.lineno, ast.unparse(node.func)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                    and ast.unparse(node.func.value) in _containers(func):
                keys, how = _update_keys(side, runner_tree, func, node)
                updates.append(f":{node.lineno} {how}")
                if keys is None:
                    problems.append(f"{short}:{node.lineno} ({name}) share_inputs.update: keys not known ({how})")
                elif SEED in keys:
                    problems.append(f"{short}:{node.lineno} ({name}) share_inputs.update binds {SEED} ({how})")
    for node in ast.walk(batch_cls):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "init_share_inputs":
            problems.append(f"{batch_file.rsplit('/', 1)[-1]}:{node.lineno} {BATCH} calls init_share_inputs again "
                            f"({ast.unparse(node.func)}): the host seed would be re-created")
    ok_bind = [b for b in binds if b[0] == "__init__" and b[2].startswith(f"{BATCH}(")]
    if len(binds) != 1 or not ok_bind:
        problems.append(f"self.share_inputs bound {len(binds)} time(s): "
                        + ("; ".join(f"{CLASS}.{m}:{ln} = {v}" for m, ln, v in binds) or "never")
                        + f" (expected once, in __init__, to {BATCH}(...))")
    ok_init = [i for i in inits if i[0] == "__init__" and i[2] == "self.share_inputs.init_share_inputs"]
    if len(inits) != 1 or not ok_init:
        problems.append(f"init_share_inputs called {len(inits)} time(s) in the runner: "
                        + ("; ".join(f"{CLASS}.{m}:{ln} {c}()" for m, ln, c in inits) or "never")
                        + " (expected once, self.share_inputs.init_share_inputs() in __init__)")
    order = ""
    if ok_bind and ok_init and incs:
        if not ok_bind[0][1] < ok_init[0][1] < incs[0].line:
            problems.append(f"order in __init__: share_inputs bound :{ok_bind[0][1]}, init_share_inputs() "
                            f":{ok_init[0][1]}, increment :{incs[0].line} (expected in this order)")
        order = (f"{runner_file.rsplit('/', 1)[-1]}:{ok_bind[0][1]} (__init__) self.share_inputs = {ok_bind[0][2]}, "
                 f":{ok_init[0][1]} init_share_inputs(), then the increment")
    # the proposer's batch shares the target's seed (speculative decoding: the plugin stands down)
    proposer = side.ast_def(INPUT_BATCH, PROPOSER)
    shared = []
    if isinstance(proposer, ast.ClassDef):
        for node in ast.walk(proposer):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == SEED for t in node.targets):
                shared.append(f":{node.lineno} = {ast.unparse(node.value)[:60]}")
    note = (f"; {PROPOSER} (MTP) binds its {SEED} at {batch_file.rsplit('/', 1)[-1]}{', '.join(shared)} (speculative decoding: "
            f"the plugin stands down)") if shared else ""
    if problems:
        report.add(section, ROW_CREATE, "MISMATCH", "; ".join(problems))
        return
    report.add(section, ROW_CREATE, "OK",
               f"{seeds[0].at()} self.{SEED} = {_short(seeds[0].value)}; {order} at {incs[0].at()} "
               f"self.{INCREMENT} = {_short(incs[0].value)}; no other rebinding of either, of share_inputs, "
               f"and no other init_share_inputs() call"
               + (f"; share_inputs.update binds no {SEED} ({', '.join(updates)})" if updates else "") + note)


def _row_writers(report, section, forms, problems):
    found = [f"{form} at {', '.join(r.at() + (f' ({r.note})' if r.note and form in WRITER_FORMS[3:] else '') for r in refs)}"
             for form, refs in forms.items() if refs]
    absent = [form for form, refs in forms.items() if not refs]
    text = "; ".join(found) or "no writer"
    if absent:
        text += f"; absent (fewer writers: still exact): {', '.join(absent)}"
    if problems:
        report.add(section, ROW_WRITERS, "MISMATCH", "; ".join(problems) + f" | accepted: {text}")
    else:
        report.add(section, ROW_WRITERS, "OK", "only the accepted forms: " + text)


def _row_reads(side, report, section, device_reads, problems):
    sampler_ok, sampler_text = _sampler_reads(side, problems)
    if problems or not sampler_ok:
        report.add(section, ROW_READS, "MISMATCH", "; ".join(problems) + (f" | {sampler_text}" if sampler_text else ""))
        return
    report.add(section, ROW_READS, "OK",
               f"no host read in {CLASS}, {BATCH} or the sampler; device reads: {'; '.join(device_reads) or 'none'}; "
               + sampler_text)


def _sampler_reads(side: Side, problems: list) -> tuple[bool, str]:
    """Every use of ``sampling_metadata.seed`` in the sampler module; True when
    ``Sampler.forward_cuda`` hands it to ``top_k_top_p_sampling(..., topp_seed=...)``."""
    tree = side.tree(SAMPLER)
    file = _file(SAMPLER)
    if tree is None:
        problems.append(f"{file} not found")
        return False, ""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    scopes = [(n.name, n) for n in functions.values()]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        scopes += [(f"{cls.name}.{m}", f) for m, f in _methods(cls).items()]
    direct, handed, followed = [], [], set()
    for label, func in scopes:
        parents = _parents(func)
        containers = _containers(func)
        for node in ast.walk(func):
            if not (isinstance(node, ast.Attribute) and node.attr == "seed"
                    and ast.unparse(node.value).endswith("sampling_metadata")):
                continue
            use = _classify(label, "seed", node, parents, containers)
            at = f"{file.rsplit('/', 1)[-1]}:{use.line} ({label})"
            if use.kind == "passed" and use.note == "topp_seed=" and use.callee == "top_k_top_p_sampling":
                direct.append((label, at))
                continue
            call = parents.get(node)
            if use.kind == "passed" and use.callee in functions and isinstance(call, ast.Call) and node in call.args:
                target = functions[use.callee]
                index = call.args.index(node)
                if index < len(target.args.args):
                    param = target.args.args[index].arg
                    handed.append(f"{at} -> {use.callee}({param})")
                    if use.callee not in followed:
                        followed.add(use.callee)
                        problems.extend(_param_problems(file, target, param))
                    continue
            problems.append(f"{at} sampling_metadata.seed: {use.kind} {use.note}"
                            f"{(' -> ' + use.callee) if use.callee else ''}: {use.text} - "
                            + (_host_read(use.kind, use.note) or "not a known device use"))
    ok = any(label == "Sampler.forward_cuda" for label, _ in direct)
    if not ok:
        problems.append(f"{file.rsplit('/', 1)[-1]} Sampler.forward_cuda does not pass sampling_metadata.seed as "
                        f"top_k_top_p_sampling(..., topp_seed=...)")
    text = ("top_k_top_p_sampling(..., topp_seed=sampling_metadata.seed) at " + ", ".join(a for _, a in direct)
            if direct else "")
    if handed:
        text += "; the speculative paths hand it to " + ", ".join(handed) + " (followed: device ops only)"
    return ok, text


def _param_problems(file: str, func: ast.FunctionDef, param: str) -> list[str]:
    """Host reads of a sampler function's seed parameter (device ops only are accepted)."""
    parents = _parents(func)
    containers = _containers(func)
    out = []
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and node.id == param and isinstance(node.ctx, ast.Load):
            use = _classify(func.name, param, node, parents, containers)
            if use.kind == "read" and use.note.startswith("index read passed to paddle."):
                continue
            if use.kind == "passed" and use.callee.startswith("paddle."):
                continue
            out.append(f"{file.rsplit('/', 1)[-1]}:{use.line} ({func.name}) {param}: {use.kind} {use.note}: "
                       f"{use.text} - " + (_host_read(use.kind, use.note) or "not a device op"))
        elif isinstance(node, ast.Name) and node.id == param and isinstance(node.ctx, ast.Store):
            out.append(f"{file.rsplit('/', 1)[-1]}:{node.lineno} ({func.name}) {param} rebound (not followed)")
    return out


def seed_placement(side: Side, report: Report, section: str) -> None:
    """Other profiles (2.6+/develop): where the seed and the increment are created, as INFO."""
    batch = side.ast_def(INPUT_BATCH, BATCH)
    runner = side.ast_def(RUNNER, CLASS)
    found = []
    for rel, cls, method, key in ((INPUT_BATCH, batch, "init_share_inputs", SEED), (RUNNER, runner, "__init__", INCREMENT)):
        func = _methods(cls).get(method) if isinstance(cls, ast.ClassDef) else None
        if func is None:
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == key for t in node.targets):
                where = "on the host" if _is_host_creation(node.value) else (
                    "on the device" if _is_paddle_creation(node.value) else "placement not read")
                found.append(f"{key} created {where} at {_file(rel)}:{node.lineno} ({_short(node.value)})")
    if not found:
        return
    on_host = any("on the host" in f and f.startswith(SEED) for f in found)
    report.add(section, ROW_PLACEMENT, "INFO", "; ".join(found) + (
        f" - the plugin moves the seed on {PROFILE} only" if on_host else
        " - FastDeploy hands the sampler a device seed itself: nothing for the plugin to move"))
