"""AST readers: import lists, share_inputs keys, call arities, registered op inputs."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

from .common import FD_ROOT


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


def is_cuda_guard(guard) -> bool:
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
        if is_cuda_guard(guard):
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
    base = os.path.join(checkout(fd_src), "custom_ops", "gpu_ops")
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


def checkout(fd_src: str) -> str:
    """The checkout folder for --fd-src given as either the checkout or its fastdeploy/ package."""
    path = os.path.abspath(fd_src).rstrip(os.sep)
    if os.path.basename(path) == FD_ROOT and os.path.isfile(os.path.join(path, "__init__.py")):
        return os.path.dirname(path)
    return path
