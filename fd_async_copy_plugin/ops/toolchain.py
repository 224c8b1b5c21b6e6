"""The compilers ``build-ops`` needs, found without running a build: ``find_nvcc()``.

Standard library only, so both the builder and the loader (which explains a missing CUDA library)
can ask without importing each other.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def find_nvcc() -> tuple[str | None, str]:
    """The nvcc to use and where it came from, or ``None`` and why none was found."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and os.access(Path(root) / "bin" / "nvcc", os.X_OK):
            return str(Path(root) / "bin" / "nvcc"), f"${env}"
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path, "PATH"
    default = Path("/usr/local/cuda/bin/nvcc")
    if os.access(default, os.X_OK):
        return str(default), "/usr/local/cuda"
    return None, "nvcc not found: set CUDA_HOME (e.g. CUDA_HOME=/usr/local/cuda) or put nvcc on PATH"
