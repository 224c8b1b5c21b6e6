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
import contextlib
import importlib.metadata
import importlib.util
import os
import stat
import sys
import time
from dataclasses import dataclass, field

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
    paths = getattr(sys.modules.get(root), "__path__", None)
    if not paths:
        try:
            spec = importlib.util.find_spec(root)
        except (ImportError, ValueError):
            return None
        paths = spec.submodule_search_locations if spec is not None else None
    return list(paths)[0] if paths else None


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
        data = b""
        while len(data) <= MAX_SOURCE_BYTES and (chunk := os.read(fd, 1 << 20)):
            data += chunk
        if len(data) > MAX_SOURCE_BYTES:  # it grew since fstat
            raise _Unreadable(f"too large (over {MAX_SOURCE_BYTES} bytes)")
    except OSError as exc:
        raise _Unreadable(f"cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unreadable(f"invalid UTF-8 at byte {exc.start}") from None


def _parse_source(path: str, text: str) -> ast.Module:
    try:
        return ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise _Unreadable(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except (MemoryError, RecursionError) as exc:
        raise _Unreadable(f"too deeply nested to parse ({type(exc).__name__})") from None
    # anything else (e.g. ValueError: source code string cannot contain null bytes) is reported as
    # it is by _Reader.facts


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    """The module-level class ``name`` Python binds: its last definition."""
    return next((n for n in reversed(tree.body) if isinstance(n, ast.ClassDef) and n.name == name), None)


def _functions(node: ast.AST | None) -> dict[str, ast.FunctionDef]:
    """The functions defined in the body of ``node`` (a module or a class; none when None)."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {n.name: n for n in getattr(node, "body", ()) if isinstance(n, kinds)}


def _mentions(node: ast.AST | None, name: str) -> bool:
    """``name`` is used in ``node`` as a name or an attribute."""
    walked = ast.walk(node) if node is not None else ()
    return any(name in (getattr(sub, "attr", None), getattr(sub, "id", None)) for sub in walked)


#: GPUModelRunner's methods that are markers: marker -> method
_RUNNER_METHODS = {"runner_init_share_inputs": "_init_share_inputs",
                   "runner_execute_model_overlap": "execute_model_overlap",
                   "runner_preprocess_and_execute_model": "_preprocess_and_execute_model",
                   "runner_not_need_stop_method": "not_need_stop"}
#: The patch-point files and the markers read from each (``_extract``)
_MARKERS = {_RUNNER: tuple(_RUNNER_METHODS), _POSTPROC: ("save_output_normal",),
            _OUTPUT: ("model_output_not_need_stop_device",),
            _SAMPLER: ("gather_logprobs_pin_memory", "gather_logprobs_present")}


def _extract(relative: str, tree: ast.Module) -> dict:
    """The few facts detection needs from one file (all that is kept of it): its markers
    (``_MARKERS``), or the version of ``__init__.py``."""
    if relative == _RUNNER:
        methods = _functions(_class(tree, "GPUModelRunner"))
        return {marker: method in methods for marker, method in _RUNNER_METHODS.items()}
    if relative == _POSTPROC:
        return {"save_output_normal": "save_output_normal" in _functions(tree)}
    if relative == _OUTPUT:  # a field: an annotated name in the class body
        body = getattr(_class(tree, "ModelOutputData"), "body", ())
        fields = {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        return {"model_output_not_need_stop_device": "not_need_stop_device" in fields}
    if relative == _SAMPLER:
        gather = _functions(_class(tree, "Sampler")).get("gather_logprobs")
        return {"gather_logprobs_pin_memory": _mentions(gather, "pin_memory"),
                "gather_logprobs_present": gather is not None}
    if relative == "__init__.py":  # the last ``__version__ = "..."`` (the one Python binds)
        versions = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "__version__" for t in n.targets)
                    and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
        return {"version": versions[-1] if versions else None}
    raise ValueError(relative)


class _Reader:
    """Reads patch-point files for one detection, within the time budget; records causes."""

    def __init__(self, base: str) -> None:
        self.base, self.deadline = base, time.monotonic() + TIME_BUDGET_S
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
            if (cached := _FACTS.get(key)) is not None:
                return cached
            if time.monotonic() > self.deadline:
                raise _Unreadable("not read: the detection time budget was spent on other files")
            text = _read_source(path)
            if text is None:
                return None
            facts = _extract(relative, _parse_source(path, text))
            if len(_FACTS) >= _FACTS_MAX:
                _FACTS.clear()
            _FACTS[key] = facts
            return facts
        except Exception as exc:  # detection must never raise (it runs inside FastDeploy's imports)
            unusable = isinstance(exc, _Unreadable)  # (its message is the cause)
            self.problems[relative] = str(exc) if unusable else f"{type(exc).__name__}: {exc}"
        return None


def _version(base: str, root: str, reader: _Reader) -> str:
    if version := (reader.facts("__init__.py") or {}).get("version"):
        return version
    with contextlib.suppress(_Unreadable):
        for line in (_read_source(os.path.join(base, "version.txt")) or "").splitlines():
            if line.startswith("fastdeploy version:"):
                return line.split(":", 1)[1].strip()
    for dist in _DISTRIBUTIONS if root == "fastdeploy" else ():
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return "Unknown"


def read_markers(base: str, reader: _Reader | None = None) -> dict[str, bool | None]:
    """The structural markers of fastdeploy-surface.md §7, read from source. None = file missing or
    unusable (``reader.problems`` says why)."""
    reader = reader or _Reader(base)
    markers = {"input_batch_module": os.path.exists(os.path.join(base, _INPUT_BATCH))}
    for relative, names in _MARKERS.items():
        markers.update(reader.facts(relative) or dict.fromkeys(names))
    return markers


#: What FastDeploy 2.5 and develop share, and 2.4 has none of
_SHAPE_25 = {"input_batch_module": True, "runner_init_share_inputs": False,
             "runner_execute_model_overlap": True, "save_output_normal": True,
             "model_output_not_need_stop_device": True, "gather_logprobs_pin_memory": True}
#: The known FastDeploy shapes: profile -> (the value each of these markers has there, the reason)
_SHAPES = {
    "fastdeploy-2.4": ({**{marker: not value for marker, value in _SHAPE_25.items()},
                        "runner_not_need_stop_method": True},
                       "2.4 shape: share_inputs dict, blocking save inside post_process, no #6176/#6362"),
    "fastdeploy-2.5": ({**_SHAPE_25, "runner_preprocess_and_execute_model": True,
                        "runner_not_need_stop_method": True},
                       "2.5 shape: InputBatch, #6176 and #6362 present"),
    "fastdeploy-2.6+": ({**_SHAPE_25, "runner_preprocess_and_execute_model": False,
                         "runner_not_need_stop_method": False},
                        "2.6+ shape: #6356 removed not_need_stop(); overlap schedule available"),
}


def classify(markers: dict[str, bool | None], problems: dict[str, str] | None = None) -> tuple[str, str]:
    """Profile and the reason, from the markers. Anything not matching a known shape is unknown.

    ``problems``: patch-point files that exist but could not be used, and why (reported as such,
    not as "not found")."""
    if problems:
        detail = "; ".join(f"{path}: {why}" for path, why in sorted(problems.items()))
        return "unknown", f"patch-point source files unusable: {detail}"
    if missing := sorted(k for k, v in markers.items() if v is None):
        return "unknown", f"patch-point source files not found for markers: {', '.join(missing)}"
    if not markers["gather_logprobs_present"]:
        return "unknown", "Sampler.gather_logprobs not found"
    for profile, (shape, reason) in _SHAPES.items():
        if all(markers[marker] == value for marker, value in shape.items()):
            return profile, reason
    differing = ", ".join(f"{k}={v}" for k, v in sorted(markers.items()))
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
