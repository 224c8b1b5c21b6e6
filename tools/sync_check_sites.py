"""What the sync check and the step trace rely on, read from a real FastDeploy tree by AST.

    python tools/sync_check_sites.py --fd-src /path/to/FastDeploy [--json]

Nothing is imported from the tree (FastDeploy's compiled ops do not exist on CPU, so a real
decode step cannot run here; the counts are checked on the replica, ``tests/measure``). Checked:

- **step hook**: ``GPUModelRunner`` (``fastdeploy/worker/gpu_model_runner.py``) defines
  ``execute_model`` itself (``sync_check.install_step_hook`` wraps ``cls.__dict__["execute_model"]``);
- **trace phases**: the runner defines ``_prepare_inputs``; ``execute_model`` (or the runner method
  it delegates to) calls ``self.model(...)``, ``self.model.compute_logits`` and ``self.sampler(...)``;
  ``pre_and_post_process.py`` defines ``post_process`` and a save function of ``trace.SAVE_FUNCTIONS``;
- **site labels**: each function name of ``sync_check.SITE_LABELS`` is defined or called in the
  files a decode step runs (runner, ``pre_and_post_process``, sampler, logprobs), so a wait there
  gets its fd24-step-syncs.md label;
- **host reads** (INFO): the ``.numpy()``/``.cpu()``/``.item()``/``.tolist()`` calls in the runner
  methods ``execute_model`` reaches (``self.`` calls, three deep).

Exit 1 when a required item is missing (MISMATCH).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fd_async_copy_plugin.sync_check import SITE_LABELS  # noqa: E402
from fd_async_copy_plugin.trace import SAVE_FUNCTIONS  # noqa: E402

RUNNER = "worker/gpu_model_runner.py"
POSTPROC = "model_executor/pre_and_post_process.py"
STEP_FILES = (RUNNER, POSTPROC, "model_executor/layers/sample/sampler.py", "model_executor/layers/sample/logprobs.py",
              "worker/worker_process.py", "worker/gpu_worker.py")
HOST_READS = {"numpy", "cpu", "item", "tolist"}


def _parse(src: str, rel: str):
    path = os.path.join(src, rel)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def _class(tree, name):
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def _methods(cls) -> dict:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _self_calls(fn) -> set:
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "self":
            out.add(node.func.attr)
    return out


def _calls_attr(fn, chain: str) -> bool:
    """``self.model(...)`` (chain "model") or ``self.model.compute_logits(...)`` ("model.compute_logits")."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            parts, f = [], node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name) and f.id == "self" and ".".join(reversed(parts)) == chain:
                return True
    return False


def _host_reads(fn) -> list:
    return sorted({(node.lineno, node.func.attr) for node in ast.walk(fn)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in HOST_READS})


def check(fd_src: str) -> list[dict]:
    src = os.path.join(fd_src, "fastdeploy") if os.path.isdir(os.path.join(fd_src, "fastdeploy")) else fd_src
    rows: list[dict] = []

    def row(item, status, detail):
        rows.append({"item": item, "status": status, "detail": detail})

    runner_tree = _parse(src, RUNNER)
    cls = _class(runner_tree, "GPUModelRunner") if runner_tree else None
    if cls is None:
        row("step hook", "MISMATCH", f"no class GPUModelRunner in {RUNNER}")
        return rows
    methods = _methods(cls)
    execute = methods.get("execute_model")
    if execute is None:
        row("step hook", "MISMATCH", "GPUModelRunner does not define execute_model itself")
        return rows
    row("step hook", "OK", f"GPUModelRunner.execute_model defined at {RUNNER}:{execute.lineno}")
    # the body that runs the step: execute_model itself or the runner methods it calls
    reached = {"execute_model": execute}
    frontier = ["execute_model"]
    for _ in range(3):  # runner methods reached from execute_model, three calls deep
        frontier = [inner for name in frontier for inner in sorted(_self_calls(reached[name]))
                    if inner in methods and inner not in reached]
        reached.update({name: methods[name] for name in frontier})
    row("phase prepare", "OK" if "_prepare_inputs" in methods else "MISMATCH",
        "GPUModelRunner._prepare_inputs " + ("defined" if "_prepare_inputs" in methods else "missing"))
    for label, chain in (("forward launch", "model"), ("logits", "model.compute_logits"), ("sampler", "sampler")):
        where = [n for n, fn in reached.items() if _calls_attr(fn, chain)]
        row(f"phase {label}", "OK" if where else "MISMATCH",
            f"self.{chain}(...) called in {', '.join(where)}" if where else f"no self.{chain}(...) call reached from execute_model")
    post_tree = _parse(src, POSTPROC)
    post_defs = {n.name for n in ast.walk(post_tree) if isinstance(n, ast.FunctionDef)} if post_tree else set()
    row("phase post-process", "OK" if "post_process" in post_defs else "MISMATCH", f"{POSTPROC} post_process")
    saves = sorted((post_defs | set(methods)) & SAVE_FUNCTIONS)
    calls = {node.func.id for node in ast.walk(post_tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)} if post_tree else set()
    saves += sorted((calls & SAVE_FUNCTIONS) - set(saves))
    row("phase save", "OK" if saves else "MISMATCH", f"save functions: {', '.join(saves) or 'none'}")
    # labels
    names: dict[str, list] = {}
    for rel in STEP_FILES:
        tree = _parse(src, rel)
        if tree is None:
            continue
        for node in ast.walk(tree):
            name = None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = node.name
            elif isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in SITE_LABELS:
                names.setdefault(name, []).append(f"{rel}:{node.lineno}")
    for function, label in SITE_LABELS.items():
        where = names.get(function)
        row(f"label {label} ({function})", "OK" if where else "ABSENT",
            ", ".join(sorted(set(where))[:3]) if where else "not in this tree's step files (the label is not used here)")
    for name, fn in reached.items():
        reads = _host_reads(fn)
        if reads:
            row(f"host reads in {name}", "INFO", ", ".join(f"{RUNNER}:{line} .{attr}()" for line, attr in reads))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd-src", required=True, help="a FastDeploy checkout (or its fastdeploy/ folder)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = check(args.fd_src)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in rows:
            print(f"{r['status']:9s}{r['item']:34s}{r['detail']}")
    return 1 if any(r["status"] == "MISMATCH" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
