"""Which FastDeploy is this? Detected from structural markers, never from version strings alone.

Version strings lie here: a source build reports "Unknown", 2.4.x patch releases carry cherry-picks,
and the string ``not_need_stop_device`` already appears in 2.4 (fastdeploy-surface.md §2.1, §7).
The markers are read from the **source files** with ``ast`` - no FastDeploy module is imported - so
detection is cheap, safe in the API-server process (which must not import GPU modules), and works
while FastDeploy modules are half-initialised (the plugin hook can fire in the middle of an import).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache

PROFILES = ("fastdeploy-2.4", "fastdeploy-2.5", "fastdeploy-2.6+", "unknown", "absent")

# Files read, relative to the root package directory.
_RUNNER = "worker/gpu_model_runner.py"
_POSTPROC = "model_executor/pre_and_post_process.py"
_OUTPUT = "worker/output.py"
_SAMPLER = "model_executor/layers/sample/sampler.py"
_INPUT_BATCH = "worker/input_batch.py"

_DISTRIBUTIONS = ("fastdeploy-gpu", "fastdeploy-xpu", "fastdeploy-iluvatar-gpu", "fastdeploy-dcu")


@dataclass(frozen=True)
class ProfileInfo:
    profile: str
    version: str
    root: str
    location: str | None
    markers: dict[str, bool | None] = field(default_factory=dict)
    reason: str = ""

    def as_dict(self) -> dict:
        return {
            "profile": self.profile,
            "fastdeploy_version": self.version,
            "root": self.root,
            "location": self.location,
            "markers": dict(self.markers),
            "reason": self.reason,
        }


def root_directory(root: str) -> str | None:
    """Directory of the root package, without importing it when it is not imported yet."""
    module = sys.modules.get(root)
    paths = getattr(module, "__path__", None) if module is not None else None
    if not paths:
        try:
            spec = importlib.util.find_spec(root)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        paths = spec.submodule_search_locations
    return list(paths)[0]


@lru_cache(maxsize=64)
def _parse(path: str, mtime: float) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def _tree(base: str, relative: str) -> ast.Module | None:
    path = os.path.join(base, relative)
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        return None
    return _parse(path, mtime)


def _class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _methods(cls: ast.ClassDef | None) -> dict[str, ast.FunctionDef]:
    if cls is None:
        return {}
    return {
        n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _functions(tree: ast.Module | None) -> set[str]:
    if tree is None:
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _fields(cls: ast.ClassDef | None) -> list[str]:
    if cls is None:
        return []
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]


def _mentions(node: ast.AST | None, name: str) -> bool:
    if node is None:
        return False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == name:
            return True
        if isinstance(sub, ast.Name) and sub.id == name:
            return True
    return False


def _version(base: str, root: str) -> str:
    init = _tree(base, "__init__.py")
    if init is not None:
        for node in init.body:
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                return node.value.value
    try:
        with open(os.path.join(base, "version.txt"), encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("fastdeploy version:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if root == "fastdeploy":
        for dist in _DISTRIBUTIONS:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
    return "Unknown"


def read_markers(base: str) -> dict[str, bool | None]:
    """The structural markers of fastdeploy-surface.md §7, read from source. None = file missing."""
    runner_tree = _tree(base, _RUNNER)
    post_tree = _tree(base, _POSTPROC)
    output_tree = _tree(base, _OUTPUT)
    sampler_tree = _tree(base, _SAMPLER)
    runner = _methods(_class(runner_tree, "GPUModelRunner")) if runner_tree else None
    gather = _methods(_class(sampler_tree, "Sampler")).get("gather_logprobs")

    def has(method: str) -> bool | None:
        return None if runner is None else method in runner

    return {
        "input_batch_module": os.path.exists(os.path.join(base, _INPUT_BATCH)),
        "runner_init_share_inputs": has("_init_share_inputs"),
        "runner_execute_model_overlap": has("execute_model_overlap"),
        "runner_preprocess_and_execute_model": has("_preprocess_and_execute_model"),
        "runner_not_need_stop_method": has("not_need_stop"),
        "save_output_normal": None if post_tree is None else "save_output_normal" in _functions(post_tree),
        "model_output_not_need_stop_device": None
        if output_tree is None
        else "not_need_stop_device" in _fields(_class(output_tree, "ModelOutputData")),
        "gather_logprobs_pin_memory": None
        if sampler_tree is None
        else _mentions(gather, "pin_memory"),
        "gather_logprobs_present": None if sampler_tree is None else gather is not None,
    }


def classify(markers: dict[str, bool | None]) -> tuple[str, str]:
    """Profile and the reason, from the markers. Anything not matching a known shape is unknown."""
    missing = sorted(k for k, v in markers.items() if v is None)
    if missing:
        return "unknown", f"patch-point source files not found for markers: {', '.join(missing)}"
    m = markers
    if not m["gather_logprobs_present"]:
        return "unknown", "Sampler.gather_logprobs not found"
    shape_24 = (
        not m["input_batch_module"]
        and m["runner_init_share_inputs"]
        and not m["runner_execute_model_overlap"]
        and m["runner_not_need_stop_method"]
        and not m["save_output_normal"]
        and not m["model_output_not_need_stop_device"]
        and not m["gather_logprobs_pin_memory"]
    )
    if shape_24:
        return "fastdeploy-2.4", "2.4 shape: share_inputs dict, blocking save inside post_process, no #6176/#6362"
    shape_25_common = (
        m["input_batch_module"]
        and not m["runner_init_share_inputs"]
        and m["runner_execute_model_overlap"]
        and m["save_output_normal"]
        and m["model_output_not_need_stop_device"]
        and m["gather_logprobs_pin_memory"]
    )
    if shape_25_common and m["runner_preprocess_and_execute_model"] and m["runner_not_need_stop_method"]:
        return "fastdeploy-2.5", "2.5 shape: InputBatch, #6176 and #6362 present"
    if shape_25_common and not m["runner_preprocess_and_execute_model"] and not m["runner_not_need_stop_method"]:
        return "fastdeploy-2.6+", "2.6+ shape: #6356 removed not_need_stop(); overlap schedule available"
    differing = ", ".join(f"{k}={v}" for k, v in sorted(m.items()))
    return "unknown", f"markers match no known FastDeploy shape ({differing})"


def detect_profile(root: str = "fastdeploy") -> ProfileInfo:
    base = root_directory(root)
    if base is None:
        return ProfileInfo("absent", "absent", root, None, {}, f"package {root!r} is not installed")
    markers = read_markers(base)
    profile, reason = classify(markers)
    return ProfileInfo(profile, _version(base, root), root, base, markers, reason)
