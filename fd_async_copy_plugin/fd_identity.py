"""Exact structural identity of the FastDeploy code the plugin reproduces.

Where a patch re-implements part of a FastDeploy function (the maths of ``Sampler.gather_logprobs``
is run by the plugin's replacement, only the copies differ), "calls the same functions" is not
enough: a cherry-picked constant or an extra op changes results while the shape still matches. Such
code is identified by a **normalised-AST digest**: the SHA-256 of ``ast.dump`` of the statements the
plugin reproduces, after removing only what cannot change behaviour - docstrings (string-constant
expression statements), comments and formatting (absent from the AST), source positions, and
argument/return annotations. Nothing else is normalised: a changed constant, name, operator or
statement gives another digest, and the feature is ``incompatible`` with that digest in its reason
(FastDeploy runs unpatched).

Only digests are stored here (hex), never FastDeploy code. ``tools/fd_identity_digests.py`` prints
them for a FastDeploy source tree; the values below were computed from the real FastDeploy trees
(2.4 ``r3_fix_int32_bug_2.4``, 2.5 ``r3_fix_int32_bug_2.5``, ``develop``) and are matched by the
reference replica (``tests/registry/test_fd_identity.py`` checks both).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap

#: name -> profile -> digests accepted for that profile.
KNOWN: dict[str, dict[str, frozenset[str]]] = {
    # The maths of Sampler.gather_logprobs: the body up to the end of the `if num_logprobs >= 1`
    # block (what the plugin's replacement runs itself). Identical in FD 2.4, 2.5 and develop.
    "Sampler.gather_logprobs.maths": {
        "fastdeploy-2.4": frozenset({"c98dab76131b55e907b859dd1ee9083e1af851b392062dd007b20c9346d2bc1e"}),
        "fastdeploy-2.5": frozenset({"c98dab76131b55e907b859dd1ee9083e1af851b392062dd007b20c9346d2bc1e"}),
        "fastdeploy-2.6+": frozenset({"c98dab76131b55e907b859dd1ee9083e1af851b392062dd007b20c9346d2bc1e"}),
    },
}


class _StripDocstrings(ast.NodeTransformer):
    """Drops string-constant expression statements (docstrings) and annotations."""

    def _body(self, body: list) -> list:
        kept = [
            s for s in body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))
        ]
        return kept or [ast.Pass()]

    def generic_visit(self, node):
        node = super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, name, self._body(value))
        return node

    def visit_arg(self, node: ast.arg):
        node.annotation = None
        node.type_comment = None
        return node


def function_node(fn) -> ast.FunctionDef:
    """The parsed definition of ``fn`` (raises OSError/TypeError/SyntaxError when unreadable)."""
    source = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    raise SyntaxError(f"no function definition in the source of {fn!r}")


def normalised(statements: list[ast.stmt], args: ast.arguments | None = None) -> str:
    strip = _StripDocstrings()
    module = ast.Module(body=strip._body([strip.visit(s) for s in statements]), type_ignores=[])
    text = ast.dump(module, annotate_fields=True, include_attributes=False)
    if args is not None:
        args = _StripDocstrings().visit(args)
        text = ast.dump(args, include_attributes=False) + "\n" + text
    return text


def digest(statements: list[ast.stmt], args: ast.arguments | None = None) -> str:
    return hashlib.sha256(normalised(statements, args).encode()).hexdigest()


def gather_logprobs_maths(node: ast.FunctionDef) -> list[ast.stmt]:
    """The statements of ``gather_logprobs`` the plugin reproduces: up to and including the first
    ``if`` testing ``num_logprobs`` (the copies that follow are what the plugin replaces)."""
    region = []
    for statement in node.body:
        region.append(statement)
        if isinstance(statement, ast.If) and any(
            isinstance(n, ast.Name) and n.id == "num_logprobs" for n in ast.walk(statement.test)
        ):
            return region
    raise ValueError("no `if num_logprobs ...` block: not the known gather_logprobs shape")


def gather_logprobs_digest(fn) -> str:
    node = function_node(fn)
    return digest(gather_logprobs_maths(node), node.args)


def check(name: str, profile: str | None, found: str) -> str | None:
    """None when ``found`` is a known digest of ``name`` for ``profile`` (any profile when None);
    otherwise the reason, naming the digest found."""
    known = KNOWN[name]
    accepted = known.get(profile, frozenset()) if profile else frozenset().union(*known.values())
    if found in accepted:
        return None
    where = f"FastDeploy profile {profile}" if profile else "any known FastDeploy"
    return (
        f"{name} has digest {found}, which matches no known body of {where}; the plugin reproduces "
        "this code and only runs it where it is exactly FastDeploy's, so FastDeploy runs unpatched"
    )
