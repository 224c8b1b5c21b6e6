"""Where the custom ops are built, from which sources, whether a build is current, and where nvcc is.

The ops are compiled per user and per Paddle/Python version (a pybind module is tied to both), not
shipped in the wheel: ``~/.cache/fd_async_copy/paddle-<version>-<python tag>/`` unless
``FD_ASYNC_COPY_OPS_DIR`` names a folder. Each artifact has a ``<artifact>.build.json`` beside it
recording the fingerprint of what it was built from (a changed source or Paddle makes it stale) and
the artifact's size and sha256 (a truncated or corrupted library is refused, never loaded).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

OPS_DIR_ENV = "FD_ASYNC_COPY_OPS_DIR"

PYBIND_MODULE = "fd_async_copy_ops"
PYBIND_FILE = PYBIND_MODULE + ".so"
CUDA_LIB_FILE = "libfd_async_copy_cuda.so"

PYBIND_SOURCES = ("fd_async_copy_ops.cc", "stop_flag_host.cc", "copy_batch.cc")
CUDA_SOURCES = ("stop_flag_kernels.cu",)
HEADERS = ("stop_flag_slot.h", "stop_flag_api.h")


def sources_dir() -> Path | None:
    """The C++/CUDA sources: packaged as ``fd_async_copy_plugin/_custom_ops`` in a wheel, or the
    repository's ``custom_ops/`` in a checkout / editable install."""
    package_root = Path(__file__).resolve().parents[1]
    candidates = (package_root / "_custom_ops", package_root.parent / "custom_ops")
    return next((candidate for candidate in candidates if (candidate / HEADERS[0]).is_file()), None)


def paddle_version() -> str:
    import paddle

    return str(paddle.__version__)


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def ops_dir() -> Path:
    if override := os.environ.get(OPS_DIR_ENV):
        return Path(override).expanduser().resolve()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    build = hashlib.sha256(paddle_build().encode()).hexdigest()[:8]
    return cache_home / "fd_async_copy" / f"paddle-{paddle_version()}-{python_tag()}-{build}"


def _hash_sources(names: tuple[str, ...]) -> str | None:
    src = sources_dir()
    if src is None:
        return None
    return hashlib.sha256(b"".join(name.encode() + b"\0" + (src / name).read_bytes() + b"\0"
                                   for name in sorted(names))).hexdigest()


def paddle_build() -> str:
    """The Paddle build the module links against: source builds can share a version string, and
    every venv shares the cache folder, so the commit and the install location are recorded too."""
    import paddle

    commit = getattr(getattr(paddle, "version", None), "commit", "unknown")
    return f"{commit}@{os.path.dirname(os.path.abspath(paddle.__file__))}"


def pybind_fingerprint() -> dict:
    return {"sources_sha256": _hash_sources(PYBIND_SOURCES + HEADERS), "paddle": paddle_version(),
            "paddle_build": paddle_build(), "python": python_tag()}


def cuda_fingerprint() -> dict:
    # nvcc's version and the arch list are recorded in the manifest for the doctor but are not
    # part of the fingerprint: a server may load a library built elsewhere and have no nvcc.
    return {"sources_sha256": _hash_sources(CUDA_SOURCES + HEADERS)}


def manifest_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".build.json")


def read_manifest(artifact: Path) -> dict | None:
    try:
        return json.loads(manifest_path(artifact).read_text())
    except (OSError, ValueError):
        return None


def file_identity(path: Path) -> dict:
    """Size and SHA-256 of a built artifact, as recorded in its manifest (``artifact`` key)."""
    data = Path(path).read_bytes()  # (a library of a few MB)
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


REBUILD = "rebuild with `fd-async-copy build-ops`"


def integrity(artifact: Path, manifest: dict) -> str | None:
    """``None`` when ``artifact`` is byte for byte what the build recorded; else why not.

    Loading a truncated or corrupted shared library kills the process (SIGBUS/SIGSEGV in ``dlopen``
    or at the first call), so nothing is loaded that does not match its manifest.
    """
    recorded = manifest.get("artifact")
    if not isinstance(recorded, dict) or "size" not in recorded or "sha256" not in recorded:
        return f"{artifact.name}'s build manifest records no size/sha256 (built by an older version); {REBUILD}"
    try:
        found = file_identity(artifact)
    except OSError as exc:
        return f"{artifact.name} cannot be read ({exc}); {REBUILD}"
    if found["size"] != recorded["size"]:
        return (f"{artifact.name} is {found['size']} bytes but was built as {recorded['size']} (truncated or "
                f"replaced); {REBUILD}")
    if found["sha256"] != recorded["sha256"]:
        return f"{artifact.name} does not match the sha256 recorded when it was built (corrupted); {REBUILD}"
    return None


def staleness(artifact: Path, fingerprint: dict) -> str | None:
    """``None`` when ``artifact`` exists, was built from ``fingerprint`` and is intact; else why not."""
    if not artifact.is_file():
        return f"{artifact.name} is not built in {artifact.parent}"
    manifest = read_manifest(artifact)
    if manifest is None:
        return f"{artifact.name} has no readable build manifest"
    built_from = manifest.get("fingerprint", {})
    # (a value None: sources not shipped, cannot tell: the build is trusted)
    changed = [key for key, want in fingerprint.items() if want is not None and built_from.get(key) != want]
    if changed:
        return f"{artifact.name} is stale ({changed[0]} changed since it was built)"
    return integrity(artifact, manifest)


def find_nvcc() -> tuple[str | None, str]:
    """The nvcc to use and where it came from, or ``None`` and why none was found (asked by the
    builder, and by the loader explaining a missing CUDA library). A ``CUDA_HOME`` or
    ``CUDA_PATH`` without ``bin/nvcc`` is named in the answer, never silently skipped."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and os.access(Path(root) / "bin" / "nvcc", os.X_OK):
            return str(Path(root) / "bin" / "nvcc"), f"${env}"
    ignored = ignored_cuda_roots()
    note = f"; {', '.join(ignored)}: ignored, fix or unset it" if ignored else ""
    for nvcc, origin in ((shutil.which("nvcc"), "PATH"), ("/usr/local/cuda/bin/nvcc", "/usr/local/cuda")):
        if nvcc and os.access(nvcc, os.X_OK):
            return nvcc, origin + note
    why = f"{', '.join(ignored)}; set CUDA_HOME to a CUDA toolkit" if ignored else "set CUDA_HOME"
    return None, f"nvcc not found: {why} (e.g. CUDA_HOME=/usr/local/cuda) or put nvcc on PATH"


def ignored_cuda_roots() -> list[str]:
    """``CUDA_HOME``/``CUDA_PATH`` values set but without an executable ``bin/nvcc`` (one line each)."""
    return [f"{env}={os.environ[env]!r} has no executable bin/nvcc" for env in ("CUDA_HOME", "CUDA_PATH")
            if os.environ.get(env) and not os.access(Path(os.environ[env]) / "bin" / "nvcc", os.X_OK)]
