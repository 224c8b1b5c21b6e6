"""Which FastDeploy is this? Detected from structural markers, never from version strings alone.

Version strings lie here: a source build reports "Unknown", 2.4.x patch releases carry cherry-picks,
and the string ``not_need_stop_device`` already appears in 2.4 (fastdeploy-surface.md §2.1, §7).
The markers are read from the **source files** with ``ast`` - no FastDeploy module is imported - so
detection is cheap, safe in the API-server process (which must not import GPU modules), and works
while FastDeploy modules are half-initialised (the plugin hook can fire in the middle of an import).

Detection never hangs, never raises and says why (issue 13): only regular files under
``MAX_SOURCE_BYTES`` are read (opened non-blocking: a FIFO named ``sampler.py`` is refused), within
``TIME_BUDGET_S``; a syntax error, invalid UTF-8, an unparseable nesting depth, a file too large or
not a regular file is reported as such. Only the extracted markers are cached, never syntax trees,
and a class defined twice is read from its last definition (the one Python binds).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import stat
import sys
import time
from dataclasses import dataclass, field

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


#: Largest source file detection reads. FastDeploy's largest patch-point file is ~160 kB; a file
#: far beyond that is not FastDeploy's and parsing it would cost seconds and gigabytes.
MAX_SOURCE_BYTES = 2 << 20
#: Wall-clock budget of one detection (reading and parsing every patch-point file).
TIME_BUDGET_S = 10.0

# Only the markers extracted from a file are cached (keyed by path, mtime and size), never its AST.
_FACTS: dict[tuple[str, int, int], dict] = {}
_FACTS_MAX = 64


class _Unreadable(Exception):
    """A patch-point file that exists but cannot be used; the message is the cause."""


def _read_source(path: str) -> str | None:
    """The text of a regular file under the size limit; None when it does not exist.

    Opened non-blocking and checked with ``fstat`` on the open descriptor: a FIFO, socket or device
    named like a FastDeploy file is refused without ever blocking on it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not os.path.lexists(path):
            return None
        raise _Unreadable(f"cannot open ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Unreadable("not a regular file")
        if info.st_size > MAX_SOURCE_BYTES:
            raise _Unreadable(f"too large ({info.st_size} bytes > {MAX_SOURCE_BYTES})")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_SOURCE_BYTES:
                raise _Unreadable(f"too large (over {MAX_SOURCE_BYTES} bytes)")
            chunks.append(chunk)
    except OSError as exc:
        raise _Unreadable(f"cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unreadable(f"invalid UTF-8 at byte {exc.start}") from None


def _parse_source(path: str, text: str) -> ast.Module:
    try:
        return ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise _Unreadable(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except (MemoryError, RecursionError) as exc:
        raise _Unreadable(f"too deeply nested to parse ({type(exc).__name__})") from None
    except Exception as exc:  # e.g. ValueError: source code string cannot contain null bytes
        raise _Unreadable(f"cannot parse ({type(exc).__name__}: {exc})") from None


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    """The module-level class ``name`` Python binds: its last definition."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            found = node
    return found


def _methods(cls: ast.ClassDef | None) -> dict[str, ast.FunctionDef]:
    if cls is None:
        return {}
    return {
        n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _functions(tree: ast.Module) -> set[str]:
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


def _extract(relative: str, tree: ast.Module) -> dict:
    """The few facts detection needs from one file (all that is kept of it)."""
    if relative == _RUNNER:
        cls = _class(tree, "GPUModelRunner")
        return {"runner_methods": None if cls is None else frozenset(_methods(cls))}
    if relative == _POSTPROC:
        return {"functions": frozenset(_functions(tree))}
    if relative == _OUTPUT:
        return {"model_output_fields": tuple(_fields(_class(tree, "ModelOutputData")))}
    if relative == _SAMPLER:
        gather = _methods(_class(tree, "Sampler")).get("gather_logprobs")
        return {"gather_present": gather is not None, "gather_pin_memory": _mentions(gather, "pin_memory")}
    if relative == "__init__.py":
        version = None
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                version = node.value.value
        return {"version": version}
    raise ValueError(relative)


class _Reader:
    """Reads patch-point files for one detection, within the time budget; records causes."""

    def __init__(self, base: str, budget_s: float | None = None) -> None:
        self.base = base
        self.deadline = time.monotonic() + (TIME_BUDGET_S if budget_s is None else budget_s)
        self.problems: dict[str, str] = {}

    def facts(self, relative: str) -> dict | None:
        """The file's facts, or None (missing, or unusable: the cause is in ``problems``)."""
        path = os.path.join(self.base, relative)
        try:
            try:
                info = os.stat(path)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise _Unreadable(f"cannot stat ({exc.strerror or exc})") from None
            key = (path, info.st_mtime_ns, info.st_size)
            cached = _FACTS.get(key)
            if cached is not None:
                return cached
            if time.monotonic() > self.deadline:
                raise _Unreadable("not read: the detection time budget was spent on other files")
            text = _read_source(path)
            if text is None:
                return None
            facts = _extract(relative, _parse_source(path, text))
            del text
            if len(_FACTS) >= _FACTS_MAX:
                _FACTS.clear()
            _FACTS[key] = facts
            return facts
        except _Unreadable as exc:
            self.problems[relative] = str(exc)
        except Exception as exc:  # detection must never raise (it runs inside FastDeploy's imports)
            self.problems[relative] = f"{type(exc).__name__}: {exc}"
        return None


def _version(base: str, root: str, reader: _Reader | None = None) -> str:
    init = (reader or _Reader(base)).facts("__init__.py")
    if init is not None and init.get("version"):
        return init["version"]
    try:
        text = _read_source(os.path.join(base, "version.txt"))
        for line in (text or "").splitlines():
            if line.startswith("fastdeploy version:"):
                return line.split(":", 1)[1].strip()
    except _Unreadable:
        pass
    if root == "fastdeploy":
        for dist in _DISTRIBUTIONS:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
    return "Unknown"


def read_markers(base: str, reader: _Reader | None = None) -> dict[str, bool | None]:
    """The structural markers of fastdeploy-surface.md §7, read from source. None = file missing or
    unusable (``reader.problems`` says why)."""
    reader = reader or _Reader(base)
    runner_facts = reader.facts(_RUNNER)
    post = reader.facts(_POSTPROC)
    output = reader.facts(_OUTPUT)
    sampler = reader.facts(_SAMPLER)
    runner = None
    if runner_facts is not None:
        runner = runner_facts["runner_methods"] or frozenset()

    def has(method: str) -> bool | None:
        return None if runner is None else method in runner

    return {
        "input_batch_module": os.path.exists(os.path.join(base, _INPUT_BATCH)),
        "runner_init_share_inputs": has("_init_share_inputs"),
        "runner_execute_model_overlap": has("execute_model_overlap"),
        "runner_preprocess_and_execute_model": has("_preprocess_and_execute_model"),
        "runner_not_need_stop_method": has("not_need_stop"),
        "save_output_normal": None if post is None else "save_output_normal" in post["functions"],
        "model_output_not_need_stop_device": None
        if output is None
        else "not_need_stop_device" in output["model_output_fields"],
        "gather_logprobs_pin_memory": None if sampler is None else sampler["gather_pin_memory"],
        "gather_logprobs_present": None if sampler is None else sampler["gather_present"],
    }


def classify(markers: dict[str, bool | None], problems: dict[str, str] | None = None) -> tuple[str, str]:
    """Profile and the reason, from the markers. Anything not matching a known shape is unknown.

    ``problems``: patch-point files that exist but could not be used, and why (reported as such,
    not as "not found")."""
    if problems:
        detail = "; ".join(f"{path}: {why}" for path, why in sorted(problems.items()))
        return "unknown", f"patch-point source files unusable: {detail}"
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
    reader = _Reader(base)
    try:
        markers = read_markers(base, reader)
        profile, reason = classify(markers, reader.problems)
        version = _version(base, root, reader)
    except Exception as exc:  # never raise out of detection (register() and doctor call it)
        return ProfileInfo("unknown", "Unknown", root, base, {}, f"detection failed: {type(exc).__name__}: {exc}")
    return ProfileInfo(profile, version, root, base, markers, reason)
