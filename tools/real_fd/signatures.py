"""Normalised descriptions (signatures, record fields) that compare equal across the import and AST routes."""

from __future__ import annotations

import ast
import dataclasses
import inspect

from .side import Side


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


def format_params(params) -> str:
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
        notes.append(f"FD {format_params(rparams)} | replica {format_params(pparams)}")
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
