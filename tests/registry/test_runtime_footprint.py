"""What an FD worker loads is the product: ``register()`` + ``enable()`` import the runtime part only
(API, config, profile, registry, patches, runtime, ops loader), never the scaffolding (replica,
decode driver, harness, CLI, A/B checker, simulator, builder), and the runtime part stays small.
Importing the scaffolding changes nothing in Paddle."""

from __future__ import annotations

import ast
import io
import tokenize
import json
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = "fd_async_copy_plugin"
FD24 = f"{PACKAGE}.testing.reference.fd24"
#: Every module of the runtime part (``runtime.cuda`` is loaded on GPU builds only).
RUNTIME = {
    PACKAGE,
    f"{PACKAGE}.config",
    f"{PACKAGE}.fd_identity",
    f"{PACKAGE}.profile",
    f"{PACKAGE}.registry",
    f"{PACKAGE}.registry.catalog",
    f"{PACKAGE}.registry.hookspecs",
    f"{PACKAGE}.registry.imports",
    f"{PACKAGE}.registry.manager",
    f"{PACKAGE}.registry.patch",
    f"{PACKAGE}.registry.plan",
    f"{PACKAGE}.patches",
    f"{PACKAGE}.patches.common",
    f"{PACKAGE}.patches.step",
    f"{PACKAGE}.patches.fd24",
    f"{PACKAGE}.patches.fd24.methods",
    f"{PACKAGE}.patches.fd24.step_syncs",
    f"{PACKAGE}.patches.fd25",
    f"{PACKAGE}.patches.fd25.methods",
    f"{PACKAGE}.patches.fd25.step_syncs",
    f"{PACKAGE}.patches.logprobs",
    f"{PACKAGE}.patches.fd24.stop_flag",
    f"{PACKAGE}.patches.sync_scope",
    f"{PACKAGE}.patches.step_syncs",
    f"{PACKAGE}.patches._tensor_watch",
    f"{PACKAGE}.patches.runner",
    f"{PACKAGE}.patches.fd24.overlap",
    f"{PACKAGE}.patches.fd25.flag_race",
    f"{PACKAGE}.runtime",
    f"{PACKAGE}.runtime.backend",
    f"{PACKAGE}.runtime.census",
    f"{PACKAGE}.runtime.host",
    f"{PACKAGE}.runtime.ring",
    f"{PACKAGE}.runtime.cuda",
    f"{PACKAGE}.runtime.cudart",
    f"{PACKAGE}.runtime.glue",
    f"{PACKAGE}.runtime.probe",  # loaded at the first copy on a GPU
    f"{PACKAGE}.ops",
    f"{PACKAGE}.ops.cache",
    f"{PACKAGE}.ops.stop_flag_library",
    f"{PACKAGE}.ops.stop_flag_ops",
}
#: New runtime modules are fine (add them above); these must never be loaded by register()+enable().
SCAFFOLDING = ("testing", "cli", "serving_ab", "runtime.simulated", "ops.build",
               "pytest_plugin")
#: The budget: code lines (blank lines, comments and docstrings not counted - every patch module
#: carries its why/how/mirrors/delete header, and the CUDA layer documents each call), set to what
#: the runtime part measures (4598 code / 7531 physical lines) rounded up, so that any growth is a
#: decision made here. The runtime serves three FastDeploy lines (2.4, 2.5, develop), tensor
#: parallelism, the overlap's three token counts, and one copy path with its C call; the issue asking
#: for the one copy path aims at 4.6k code lines, which is reached.
MAX_RUNTIME_CODE_LINES = 4600
#: and a ceiling on the physical lines, docs included
MAX_RUNTIME_LINES = 7540


def loaded_by_register(prelude: str = "") -> tuple[set[str], dict]:
    """Plugin modules that ``register()`` (FD_ASYNC_COPY=1, backend host) loads in a fresh process,
    FastDeploy being the replica at ``FD24``; ``prelude`` runs first (e.g. FD imports its runner)."""
    code = textwrap.dedent(
        f"""
        import functools, json, os, sys
        {prelude}
        before = set(sys.modules)
        os.environ.update(FD_ASYNC_COPY="1", FD_ASYNC_COPY_BACKEND="host")
        import fd_async_copy_plugin as plugin
        plugin.enable = functools.partial(plugin.enable, root={FD24!r})
        plugin.register()
        status = plugin.status()
        new = sorted(m for m in set(sys.modules) - before if m.startswith({PACKAGE!r}))
        print(json.dumps({{"modules": new, "features": status["features"]}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # FastDeploy's side: the replica root, its modules, and the packages above it (imported to find it).
    fd_side = {m for m in report["modules"] if m.startswith(FD24 + ".") or FD24 == m or FD24.startswith(m + ".")}
    fd_side.discard(PACKAGE)
    return set(report["modules"]) - fd_side, report["features"]


def _assert_runtime_only(modules: set[str]) -> None:
    forbidden = sorted(m for m in modules if m.removeprefix(PACKAGE + ".").startswith(SCAFFOLDING))
    assert forbidden == [], f"register()+enable() loaded scaffolding: {forbidden}"
    assert modules <= RUNTIME, f"not listed as runtime: {sorted(modules - RUNTIME)}"


def test_register_and_enable_before_fastdeploy_imports_its_modules_load_the_runtime_only():
    modules, features = loaded_by_register()
    assert features["logprobs"]["state"] == "pending"  # the apply path ran up to the deferred import
    _assert_runtime_only(modules)
    assert f"{PACKAGE}.runtime.host" in modules and f"{PACKAGE}.ops.stop_flag_ops" in modules


def test_register_and_enable_with_fastdeploy_imported_load_the_runtime_only():
    modules, features = loaded_by_register(f"import {FD24}.worker.gpu_model_runner")
    assert features["logprobs"]["state"] == "applied" and features["stop_flag"]["state"] == "applied"
    _assert_runtime_only(modules)


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_counts_only_code():
    source = '"""Doc\n\nmore."""\n\n# comment\nx = 1  # trailing\n\n\ndef f():\n    """doc"""\n    return (1,\n            2)\n'
    assert code_lines(source) == 4  # x = 1, def, and the two lines of the return


def test_the_runtime_part_stays_small():
    root = Path(__file__).resolve().parents[2]
    total = code = 0
    for module in RUNTIME:
        relative = module.removeprefix(PACKAGE).strip(".").replace(".", "/")
        if relative.startswith("patches"):
            path = root / relative
        else:
            path = root / PACKAGE / relative
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        source = path.read_text()
        total += len(source.splitlines())
        code += code_lines(source)
    assert code <= MAX_RUNTIME_CODE_LINES, f"the runtime part has {code} code lines"
    assert total <= MAX_RUNTIME_LINES, f"the runtime part has {total} lines"


def test_importing_the_scaffolding_changes_nothing_in_paddle():
    code = textwrap.dedent(
        f"""
        import importlib, pkgutil, paddle
        original = paddle.device.synchronize
        import {PACKAGE}.testing.reference as reference
        for info in pkgutil.walk_packages(reference.__path__, reference.__name__ + "."):
            importlib.import_module(info.name)
        import {PACKAGE}.testing.harness, {PACKAGE}.testing.reference.driver
        assert paddle.device.synchronize is original, paddle.device.synchronize
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
