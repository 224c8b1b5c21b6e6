"""Reading one side (real FastDeploy or the replica): imported objects first, source AST second."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import os
import sys


class Side:
    """One package tree - ``fastdeploy`` or a replica root - seen through imports and its source."""

    def __init__(self, root: str, label: str):
        self.root = root
        self.label = label
        self.modules: dict[str, object] = {}
        self.import_errors: dict[str, str] = {}
        self.resolved: dict[str, str | None] = {}
        self._trees: dict[str, ast.Module | None] = {}

    # -- locating -------------------------------------------------------------------------
    def resolve(self, rel: str) -> str | None:
        """Dotted name of the module for ``rel`` on this side, or None when no such module exists."""
        if rel not in self.resolved:
            name = f"{self.root}.{rel}"
            try:
                found = name if importlib.util.find_spec(name) is not None else None
            except (ImportError, ValueError, AttributeError):
                # A parent package failed to import: look for the file instead.
                found = name if self._file_for(name) is not None else None
            self.resolved[rel] = found
        return self.resolved[rel]

    def _file_for(self, dotted: str) -> str | None:
        from fd_async_copy_plugin.profile import root_directory  # importable once the environment is set

        base = root_directory(dotted.split(".")[0])
        if base is None:
            return None
        parts = dotted.split(".")[1:]
        for candidate in (os.path.join(base, *parts) + ".py", os.path.join(base, *parts, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
        return None

    def path(self, rel: str) -> str | None:
        name = self.resolve(rel)
        if name is None:
            return None
        module = self.modules.get(rel)
        origin = getattr(module, "__file__", None)
        return origin or self._file_for(name)

    # -- importing ------------------------------------------------------------------------
    def load(self, rel: str):
        if rel in self.modules:
            return self.modules[rel]
        if rel in self.import_errors:
            return None
        name = self.resolve(rel)
        if name is None:
            return None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                module = importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - FD import errors are findings, not crashes
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.import_errors[rel] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            return None
        self.modules[rel] = module
        return module

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            source_path = self.path(rel)
            tree = None
            if source_path:
                try:
                    with open(source_path, encoding="utf-8") as handle:
                        tree = ast.parse(handle.read(), filename=source_path)
                except (OSError, SyntaxError, ValueError):
                    tree = None
            self._trees[rel] = tree
        return self._trees[rel]

    # -- objects --------------------------------------------------------------------------
    def obj(self, rel: str, qualname: str):
        module = self.load(rel)
        if module is None:
            return None
        current = module
        for part in qualname.split("."):
            try:
                current = inspect.getattr_static(current, part)
            except AttributeError:
                return None
        return current

    def ast_def(self, rel: str, qualname: str):
        tree = self.tree(rel)
        if tree is None:
            return None
        node: ast.AST = tree
        for part in qualname.split("."):
            found = None
            for child in getattr(node, "body", []):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == part:
                    found = child  # the last definition wins, as at runtime
            if found is None:
                return None
            node = found
        return node
