"""Issue 37: the package has no import cycle, and the shipped runtime knows no test double.

- every ``import``/``from ... import`` of a package module, at module level or inside a function,
  is an edge; a strongly connected set of two or more modules is a cycle (the sync check and the
  step trace imported each other: they are observers of ``observers.py`` now);
- the runtime part (``tests/registry/test_runtime_footprint.RUNTIME``) names neither the backend
  ``sim`` nor a class or module of the replica or the fake CUDA runtime in its code (docstrings and
  comments may explain them).
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from pathlib import Path

from tests.registry.test_runtime_footprint import RUNTIME

ROOT = Path(__file__).resolve().parents[2] / "fd_async_copy_plugin"
#: cycles inside ``runtime/`` (owned by the copy-path work, edited apart): named, so that any other
#: cycle fails and this one is seen until it is broken
KNOWN_RUNTIME_CYCLES = [{"fd_async_copy_plugin.runtime.backend", "fd_async_copy_plugin.runtime.glue"}]
#: ``runtime/__init__.py``'s ``make_backend`` still builds ``sim`` by name (the copy-path work's file);
#: the plugin reaches ``sim`` through the ``fd_async_copy.backends`` entry point instead
KNOWN_RUNTIME_MENTIONS = {"fd_async_copy_plugin.runtime": {"'sim'", "SimulatedBackend", "simulated"}}
FORBIDDEN_NAMES = {"SimulatedBackend", "FakeRuntime", "ReplicaEvent", "simulated", "reference", "testing",
                   "copy_backend", "device_tracking", "fake_cudart"}
FORBIDDEN_STRINGS = {"'sim'", '"sim"'}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, _, files in os.walk(ROOT, followlinks=True):  # patches/ is a link in a checkout
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, modules: dict) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            candidates = [[f"{base}.{a.name}", base] for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [[a.name] for a in node.names]
        else:
            continue
        for names in candidates:
            hit = next((n for n in names if n in modules and n != module), None)
            if hit:
                edges.add(hit)
    return edges


def _cycles(edges: dict[str, set]) -> list[set]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    planted = {"fd_async_copy_plugin.sync_check": {"fd_async_copy_plugin.trace"},
               "fd_async_copy_plugin.trace": {"fd_async_copy_plugin.sync_check"}}
    assert _cycles(planted) == [set(planted)]


def test_no_import_cycle_in_the_package():
    modules = _modules()
    assert "fd_async_copy_plugin.patches.runner" in modules and "fd_async_copy_plugin.trace" in modules
    edges = {m: _imports(m, p, modules) for m, p in modules.items()}
    assert "fd_async_copy_plugin.sync_check" in edges["fd_async_copy_plugin.trace"]  # the one direction
    cycles = [c for c in _cycles(edges) if c not in KNOWN_RUNTIME_CYCLES]
    assert cycles == []


def _code_tokens(path: Path):
    """NAME tokens and non-docstring STRING tokens of ``path``."""
    tree = ast.parse(path.read_text())
    docstrings = {(n.body[0].value.lineno, n.body[0].value.col_offset) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
                  and isinstance(n.body[0].value.value, str)}
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.NAME or (tok.type == tokenize.STRING and tok.start not in docstrings):
            yield tok


def _mentions(path: Path) -> set[str]:
    found = set()
    for tok in _code_tokens(path):
        if tok.type == tokenize.NAME and tok.string in FORBIDDEN_NAMES:
            found.add(tok.string)
        elif tok.type == tokenize.STRING and tok.string in FORBIDDEN_STRINGS:
            found.add("'sim'")
    return found


def test_the_runtime_part_names_no_test_double(tmp_path):
    modules = _modules()
    planted = tmp_path / "planted.py"
    planted.write_text('"""The sim backend, explained."""\nOK = backend.name in ("host", "sim")\n')
    assert _mentions(planted) == {"'sim'"}  # the grep sees code, not the docstring
    found = {m: _mentions(modules[m]) for m in sorted(RUNTIME) if m in modules}
    found = {m: names - KNOWN_RUNTIME_MENTIONS.get(m, set()) for m, names in found.items()}
    assert {m: names for m, names in found.items() if names} == {}


def _reads_of_other_parts(path: Path) -> list[str]:
    """``x.stop.<field>``, ``x.syncs.<field>``, ``x.overlap.<field>``: a part's field read through
    the runner state (only ``patches/runner.py`` and the lines' ``methods.py``, which compose the
    parts around FastDeploy's methods, may)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and node.value.attr in ("stop", "syncs", "overlap"):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


COMPOSERS = {f"fd_async_copy_plugin.patches.{m}" for m in ("runner", "fd24.methods", "fd25.methods")}


def test_no_part_reads_another_parts_fields(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f(self):\n    return self.runner.stop.device\n")
    assert _reads_of_other_parts(planted) == ["planted.py:2 self.runner.stop.device"]
    modules = _modules()
    found = [hit for name, path in sorted(modules.items()) if name.startswith("fd_async_copy_plugin.patches.")
             and name not in COMPOSERS for hit in _reads_of_other_parts(path)]
    assert found == []
