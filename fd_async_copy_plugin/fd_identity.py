"""Exact structural identity of the FastDeploy code the plugin reproduces.

Where a patch re-implements part of a FastDeploy function (the maths of ``Sampler.gather_logprobs``
is run by the plugin's replacement, only the copies differ; ``LogprobsTensors.slice_rows`` is
re-implemented by ``sync_scope`` and ``logprobs``), "calls the same functions" is not enough: a
cherry-picked constant or an extra op changes results while the shape still matches. Such
code is identified by a **normalised-AST digest**: the SHA-256 of ``ast.dump`` of the statements the
plugin reproduces, after removing only what cannot change behaviour - docstrings (string-constant
expression statements), comments and formatting (absent from the AST), source positions, and
argument/return annotations. Nothing else is normalised: a changed constant, name, operator or
statement gives another digest, and the feature is ``incompatible`` with that digest in its reason
(FastDeploy runs unpatched).

Only digests are stored here (hex), never FastDeploy code. ``tools/fd_identity_digests.py`` prints
them for a FastDeploy source tree; the values below were computed from the real FastDeploy trees
(2.4 ``r3_fix_int32_bug_2.4`` cd7a24511, 2.5 ``r3_fix_int32_bug_2.5`` a386642b8, ``develop``
e53f5184a). The test replica matches them but for ``slice_rows``, whose digests it registers itself
(in ``ACCEPTED``; ``testing/reference/identity.py``).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap

_SLICE_ROWS_24 = frozenset({"89a859f2bee6059be1c603cd17db72ca1bb8df22f65cb6fe5431daa9bc779417"})
_SLICE_ROWS_25 = frozenset({"83ca28054b1f5e3aea2f06a432d81f0cd5fec6d15627e06722502e193cf4ad1f"})  # = develop
_GATHER_MATHS = frozenset({"c98dab76131b55e907b859dd1ee9083e1af851b392062dd007b20c9346d2bc1e"})
#: name -> profile -> digests accepted for that profile.
KNOWN: dict[str, dict[str, frozenset[str]]] = {
    # The maths of Sampler.gather_logprobs: the body up to the end of the `if num_logprobs >= 1`
    # block (what the plugin's replacement runs itself). Identical in FD 2.4, 2.5 and develop.
    "Sampler.gather_logprobs.maths": dict.fromkeys(("fastdeploy-2.4", "fastdeploy-2.5", "fastdeploy-2.6+"),
                                                   _GATHER_MATHS),
    # The whole body of LogprobsTensors.slice_rows (worker/output.py): 2.4 slices on the source
    # place; 2.5 and develop copy each field to the CPU first.
    "LogprobsTensors.slice_rows": {"fastdeploy-2.4": _SLICE_ROWS_24,
                                   "fastdeploy-2.5": _SLICE_ROWS_25, "fastdeploy-2.6+": _SLICE_ROWS_25}}

#: Digests accepted beyond ``KNOWN`` (name -> profile -> digests), added by whoever vouches for a
#: body: the testing package adds its replica's (``testing/reference/identity.py``); empty in a
#: FastDeploy worker.
ACCEPTED: dict[str, dict[str, frozenset[str]]] = {}


class _StripDocstrings(ast.NodeTransformer):
    """Drops string-constant expression statements (docstrings) and annotations."""

    def _body(self, body: list) -> list:
        kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                        and isinstance(s.value.value, str))]
        return kept or [ast.Pass()]

    def generic_visit(self, node):
        node = super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, name, self._body(value))
        return node

    def visit_arg(self, node: ast.arg):
        node.annotation = node.type_comment = None
        return node


def function_node(fn) -> ast.FunctionDef:
    """The parsed definition of ``fn`` (raises OSError/TypeError/SyntaxError when unreadable)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    raise SyntaxError(f"no function definition in the source of {fn!r}")


def digest(statements: list[ast.stmt], args: ast.arguments | None = None) -> str:
    """The SHA-256 of the normalised ``ast.dump`` of ``statements``, after that of ``args`` if given."""
    strip = _StripDocstrings()
    module = ast.Module(body=strip._body([strip.visit(s) for s in statements]), type_ignores=[])
    text = ast.dump(module, annotate_fields=True, include_attributes=False)
    if args is not None:
        text = ast.dump(strip.visit(args), include_attributes=False) + "\n" + text
    return hashlib.sha256(text.encode()).hexdigest()


def gather_logprobs_maths(node: ast.FunctionDef) -> list[ast.stmt]:
    """The statements of ``gather_logprobs`` the plugin reproduces: up to and including the first
    ``if`` testing ``num_logprobs`` (the copies that follow are what the plugin replaces)."""
    for i, statement in enumerate(node.body):
        tested = ast.walk(statement.test) if isinstance(statement, ast.If) else ()
        if any(isinstance(n, ast.Name) and n.id == "num_logprobs" for n in tested):
            return node.body[:i + 1]
    raise ValueError("no `if num_logprobs ...` block: not the known gather_logprobs shape")


def slice_rows_digest(fn) -> str:  # the whole body (inspect looks through a wrapper's __wrapped__)
    node = function_node(fn)
    return digest(node.body, node.args)


def slice_rows_problem(fn, profile: str | None) -> str | None:
    try:
        return check("LogprobsTensors.slice_rows", profile, slice_rows_digest(fn))
    except (OSError, TypeError, SyntaxError) as exc:
        return f"cannot read LogprobsTensors.slice_rows source: {exc}"


def check(name: str, profile: str | None, found: str) -> str | None:
    """None when ``found`` is a known digest of ``name`` for ``profile`` (any profile when None);
    otherwise the reason, naming the digest found."""
    accepted = frozenset()
    for table in (KNOWN, ACCEPTED):
        known = table.get(name, {})
        accepted |= known.get(profile, frozenset()) if profile else frozenset().union(*known.values())
    if found in accepted:
        return None
    where = f"FastDeploy profile {profile}" if profile else "any known FastDeploy"
    return (f"{name} has digest {found}, which matches no known body of {where}; the plugin reproduces "
            "this code and only runs it where it is exactly FastDeploy's, so FastDeploy runs unpatched")
