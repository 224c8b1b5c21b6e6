"""Where nvcc is, found without running a build: ``find_nvcc()``.

Standard library only, so both the builder and the loader (which explains a missing CUDA library)
can ask without importing each other. What only a build needs (the C++ compiler, the summary of a
failed compiler run) is in ``build.py``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def find_nvcc() -> tuple[str | None, str]:
    """The nvcc to use and where it came from, or ``None`` and why none was found. A ``CUDA_HOME``
    or ``CUDA_PATH`` without ``bin/nvcc`` is named in the answer, never silently skipped."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and os.access(Path(root) / "bin" / "nvcc", os.X_OK):
            return str(Path(root) / "bin" / "nvcc"), f"${env}"
    ignored = ignored_cuda_roots()
    note = f"; {', '.join(ignored)}: ignored, fix or unset it" if ignored else ""
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path, "PATH" + note
    default = Path("/usr/local/cuda/bin/nvcc")
    if os.access(default, os.X_OK):
        return str(default), "/usr/local/cuda" + note
    if ignored:
        return None, (f"nvcc not found: {', '.join(ignored)}; set CUDA_HOME to a CUDA toolkit "
                      "(e.g. CUDA_HOME=/usr/local/cuda) or put nvcc on PATH")
    return None, "nvcc not found: set CUDA_HOME (e.g. CUDA_HOME=/usr/local/cuda) or put nvcc on PATH"


def ignored_cuda_roots() -> list[str]:
    """``CUDA_HOME``/``CUDA_PATH`` values set but without an executable ``bin/nvcc`` (one line each)."""
    return [f"{env}={os.environ[env]!r} has no executable bin/nvcc" for env in ("CUDA_HOME", "CUDA_PATH")
            if os.environ.get(env) and not os.access(Path(os.environ[env]) / "bin" / "nvcc", os.X_OK)]
