"""The compilers ``build-ops`` needs, found without running a build: ``find_nvcc()``.

Standard library only, so both the builder and the loader (which explains a missing CUDA library)
can ask without importing each other.
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


def find_cxx() -> tuple[str | None, str]:
    """The C++ compiler Paddle's extension build will use (``$CXX``, else ``c++``/``g++`` on PATH),
    or ``None`` and one line saying how to get one."""
    named = os.environ.get("CXX", "").split()
    if named:
        found = shutil.which(named[0])
        if found:
            return found, "$CXX"
        return None, (f"CXX={os.environ['CXX']!r} is not an executable; set CXX to a C++ compiler "
                      "(e.g. CXX=g++) or unset it")
    for name in ("c++", "g++"):
        found = shutil.which(name)
        if found:
            return found, "PATH"
    return None, ("no C++ compiler: g++ is not on PATH and CXX is not set; install g++ (Debian: "
                  "apt-get install g++) or set CXX=/path/to/g++, then rerun `fd-async-copy build-ops`")


#: Known compiler/linker failures -> the fix, for the one-line summary of a failed build.
_HINTS = (
    ("Python.h", "install the Python headers (Debian: apt-get install python3-dev)"),
    ("command 'gcc' failed", "install gcc/g++ (Debian: apt-get install g++) or set CC/CXX"),
    ("No such file or directory: 'which'", "put the basic tools (which, sh) on PATH"),
    ("unsupported gpu architecture", "set FD_ASYNC_COPY_CUDA_ARCHS to architectures this nvcc supports"),
)


def summarize_failure(output: str) -> str:
    """One line for a failed compiler run: the first error line, and the fix when it is known."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and "warning" not in line.lower()]
    first = (errors or lines or ["(no output)"])[0]
    if len(first) > 160:
        first = first[:157] + "..."
    for needle, fix in _HINTS:
        if needle in output:
            return f"{first} -> {fix}"
    return first
