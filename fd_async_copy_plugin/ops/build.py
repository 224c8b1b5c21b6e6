"""Compiling the custom ops: ``fd-async-copy build-ops`` and ``build_ops()``.

Two artifacts, both in ``cache.ops_dir()``:

- ``fd_async_copy_ops.so`` - the Paddle pybind module (``get_stop``/``set_stop`` and the host
  stop-flag ops), compiled with ``paddle.utils.cpp_extension`` (needs a C++ compiler and Paddle).
- ``libfd_async_copy_cuda.so`` - the CUDA stop-flag kernels, compiled with plain ``nvcc`` (no
  Paddle headers); skipped, with the reason recorded, when no nvcc is found.

Why not at ``pip install`` time: the pybind module is tied to the Paddle and Python that will
import it, which an isolated wheel build cannot see, and FastDeploy hosts often install wheels
without a compiler. Building is one explicit, idempotent step instead; an up-to-date build is a
no-op, so CI and test fixtures just call it.

Freshness is checked before anything is locked or written: an up-to-date build is a no-op even on a
read-only cache. Concurrency: builds run under an exclusive ``flock`` on ``<ops_dir>/.build.lock``, compile into a
private staging folder and publish with ``os.replace`` (atomic), so concurrent workers never see
or load a half-written library; a worker that waited for the lock finds the build current and
returns.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import cache
from .cache import find_nvcc

CUDA_ARCHS_ENV = "FD_ASYNC_COPY_CUDA_ARCHS"
# Ampere and Hopper SASS plus Hopper PTX, which newer GPUs JIT-compile. CUDA 13 dropped < sm_75.
DEFAULT_CUDA_ARCHS = "80;90"
LOCK_TIMEOUT_S = 900
COMPILE_TIMEOUT_S = 900


LOG_FILE = "build-ops.log"


class BuildError(RuntimeError):
    """A compiler is missing, or ran and failed: one line naming the cause and the fix; the full
    compiler output is in ``<ops dir>/build-ops.log`` (or on the terminal with ``--verbose``)."""


def cuda_archs_problem(value: str | None, nvcc: str | None = None) -> str:
    """What is wrong with an ``FD_ASYNC_COPY_CUDA_ARCHS`` value, as one line, or "" (unset is fine).
    Checked before anything compiles: the format, then, with ``nvcc``, that it knows each arch
    (``nvcc --list-gpu-arch``; skipped when that query fails)."""
    if value is None:
        return ""
    numbers = [a.strip() for a in value.replace(",", ";").split(";") if a.strip()]
    if not numbers or not all(n.isascii() and n.isdigit() for n in numbers):
        return (f"{CUDA_ARCHS_ENV}={value!r}: expected compute capabilities as numbers separated by ';', "
                f"e.g. '80;90' (this GPU's: nvidia-smi --query-gpu=compute_cap); or unset it (default {DEFAULT_CUDA_ARCHS})")
    if nvcc:
        try:
            listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        known = {line.strip().removeprefix("compute_") for line in listed.stdout.splitlines() if line.strip()}
        unknown = [n for n in numbers if n not in known]
        if listed.returncode == 0 and known and unknown:
            return (f"{CUDA_ARCHS_ENV}={value!r}: {nvcc} does not support {', '.join(unknown)} "
                    f"(it supports {', '.join(sorted(known, key=int))}); set architectures from that list, or unset it")
    return ""


def cuda_arch_flags(archs: str | None = None) -> list[str]:
    archs = archs or os.environ.get(CUDA_ARCHS_ENV) or DEFAULT_CUDA_ARCHS
    numbers = [a.strip() for a in archs.replace(",", ";").split(";") if a.strip()]
    if not numbers or not all(n.isdigit() for n in numbers):
        raise ValueError(f"{CUDA_ARCHS_ENV}={archs!r}: expected e.g. '80;90'")
    flags = []
    for n in numbers:
        flags += ["-gencode", f"arch=compute_{n},code=sm_{n}"]
    highest = max(numbers, key=int)
    return flags + ["-gencode", f"arch=compute_{highest},code=compute_{highest}"]


@contextlib.contextmanager
def build_lock(directory: Path, timeout: float = LOCK_TIMEOUT_S):
    """Exclusive lock on ``directory`` across processes; released if the holder dies."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".build.lock", "a+") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BuildError(
                        f"another build has held {directory / '.build.lock'} for over {timeout:.0f}s"
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_ops(verbose: bool = False, force: bool = False, cuda: bool = True, progress=None) -> dict:
    """Build whatever is missing or stale; returns a JSON-serialisable report.

    Raises ``BuildError`` when the pybind module failed to build (after trying both artifacts),
    and ``FileNotFoundError`` when the sources are not installed. A failed CUDA build is reported
    (``report["cuda"]["status"] == "failed"``), not raised: the CUDA kernels are optional.
    ``progress``: called with one line before and after each compilation (what is compiling).
    """
    say = progress or (lambda line: None)
    src = cache.sources_dir()
    if src is None:
        raise FileNotFoundError(
            "the custom op sources (custom_ops/) are not installed with fd_async_copy_plugin; "
            "reinstall the package"
        )
    directory = cache.ops_dir()
    report: dict = {"ops_dir": str(directory), "sources": str(src)}
    if not force:
        # Freshness first, without the lock: an up-to-date build on a read-only cache (a shared,
        # prebuilt ops dir) has nothing to do and must not fail on creating the lock file.
        current = _current_report(directory, cuda)
        if current is not None:
            return {**report, **current}
    failures: list[str] = []
    with build_lock(directory):
        _remove_abandoned_staging(directory)
        (directory / LOG_FILE).unlink(missing_ok=True)  # the log of this build only
        for name, step in (("pybind", _build_pybind), ("cuda", _build_cuda)):
            if name == "cuda" and not cuda:
                report[name] = {"status": "skipped", "reason": "disabled (--no-cuda)"}
                continue
            try:
                report[name] = step(src, directory, verbose, force, say)
            except BuildError as exc:
                report[name] = {"status": "failed", "error": str(exc)}
                if name == "pybind":
                    failures.append(f"{name}: {exc}")
    if failures:
        raise BuildError("; ".join(failures))
    return report


def _current_report(directory: Path, cuda: bool) -> dict | None:
    """The report of a build that has nothing to do, or None when something must be built."""
    pybind = directory / cache.PYBIND_FILE
    if cache.staleness(pybind, cache.pybind_fingerprint()) is not None:
        return None
    report = {"pybind": {"status": "up to date", "path": str(pybind)}}
    library = directory / cache.CUDA_LIB_FILE
    if not cuda:
        report["cuda"] = {"status": "skipped", "reason": "disabled (--no-cuda)"}
    elif cache.staleness(library, cache.cuda_fingerprint()) is None:
        report["cuda"] = {"status": "up to date", "path": str(library)}
    else:
        nvcc, origin = find_nvcc()
        if nvcc is not None:
            return None
        report["cuda"] = {"status": "skipped", "reason": origin}
    return report


def _remove_abandoned_staging(directory: Path) -> None:
    # Only the lock holder creates staging folders, so any left over belong to a dead build.
    for leftover in directory.glob(".staging-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _build_pybind(src: Path, directory: Path, verbose: bool, force: bool, say=print) -> dict:
    artifact = directory / cache.PYBIND_FILE
    fingerprint = cache.pybind_fingerprint()
    if not force and cache.staleness(artifact, fingerprint) is None:
        return {"status": "up to date", "path": str(artifact)}
    cxx, why = find_cxx()
    if cxx is None:
        raise BuildError(why)
    started = time.monotonic()
    say(f"compiling {cache.PYBIND_FILE} ({', '.join(cache.PYBIND_SOURCES)}) with {cxx} through "
        "paddle.utils.cpp_extension (about a minute) ...")
    with _staging(directory) as staging:
        out = staging / "out"
        script = staging / "setup_fd_async_copy_ops.py"
        script.write_text(
            _PYBIND_SETUP.format(
                name=cache.PYBIND_MODULE,
                sources=[str(src / s) for s in cache.PYBIND_SOURCES],
                include=str(src),
                out=str(out),
            )
        )
        _run([sys.executable, script.name, "build"], staging, verbose, "the C++ build of the custom ops (g++)")
        built = out / cache.PYBIND_FILE
        if not built.is_file():
            raise BuildError(f"the Paddle extension build produced no {cache.PYBIND_FILE} in {out}")
        identity = cache.file_identity(built)
        os.replace(built, artifact)
    write_manifest(artifact, {"fingerprint": fingerprint, "built_at": time.time(), "artifact": identity})
    say(f"built {cache.PYBIND_FILE} in {time.monotonic() - started:.0f} s")
    return {"status": "built", "path": str(artifact), "seconds": round(time.monotonic() - started, 1)}


def write_manifest(artifact: Path, manifest: dict) -> None:
    """``<artifact>.build.json`` (``cache.manifest_path``), written atomically."""
    path = cache.manifest_path(artifact)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, path)


# Generated per build; mirrors what paddle.utils.cpp_extension.load() writes, without importing
# the result into the building process.
_PYBIND_SETUP = """\
import warnings

warnings.filterwarnings("ignore", message=".*No ccache found", category=UserWarning)
from paddle.utils.cpp_extension import BuildExtension, CppExtension, setup

setup(
    name={name!r},
    ext_modules=[
        CppExtension(
            sources={sources!r},
            include_dirs=[{include!r}],
            extra_compile_args={{"cxx": ["-O2"]}},
        )
    ],
    cmdclass={{"build_ext": BuildExtension.with_options(output_dir={out!r}, no_python_abi_suffix=True)}},
)
"""


def _build_cuda(src: Path, directory: Path, verbose: bool, force: bool, say=print) -> dict:
    artifact = directory / cache.CUDA_LIB_FILE
    fingerprint = cache.cuda_fingerprint()
    if not force and cache.staleness(artifact, fingerprint) is None:
        return {"status": "up to date", "path": str(artifact)}
    nvcc, origin = find_nvcc()
    if nvcc is None:
        return {"status": "skipped", "reason": origin}
    arch_flags = cuda_arch_flags()
    started = time.monotonic()
    say(f"compiling {cache.CUDA_LIB_FILE} ({cache.CUDA_SOURCES[0]}) with {nvcc} (from {origin}) ...")
    with _staging(directory) as staging:
        built = staging / cache.CUDA_LIB_FILE
        command = [
            nvcc, "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", f"-I{src}",
            *arch_flags, "-o", str(built), str(src / cache.CUDA_SOURCES[0]),
        ]
        _run(command, staging, verbose, "nvcc (CUDA kernels)")
        identity = cache.file_identity(built)
        os.replace(built, artifact)
    write_manifest(
        artifact,
        {
            "fingerprint": fingerprint,
            "artifact": identity,
            "built_at": time.time(),
            "nvcc": nvcc,
            "nvcc_version": _nvcc_version(nvcc),
            "arch_flags": arch_flags,
        },
    )
    say(f"built {cache.CUDA_LIB_FILE} in {time.monotonic() - started:.0f} s")
    return {
        "status": "built",
        "path": str(artifact),
        "nvcc": f"{nvcc} (from {origin})",
        "seconds": round(time.monotonic() - started, 1),
    }


@contextlib.contextmanager
def _staging(directory: Path):
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{os.getpid()}-", dir=directory))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run(command: list[str], cwd: Path, verbose: bool, what: str) -> None:
    if verbose:
        print("+", " ".join(command), flush=True)
    try:
        done = subprocess.run(
            command, cwd=cwd, capture_output=not verbose, text=True, timeout=COMPILE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{what} could not run: {exc}") from exc
    if done.returncode != 0:
        if verbose:  # the output is on the terminal already
            raise BuildError(f"{what} failed with exit code {done.returncode} (output above)")
        output = (done.stdout or "") + (done.stderr or "")
        log = _write_log(cwd.parent, command, output)
        raise BuildError(
            f"{what} failed with exit code {done.returncode}: {summarize_failure(output)} "
            f"(full log: {log}; or rerun with --verbose)"
        )


def _write_log(directory: Path, command: list[str], output: str) -> Path:
    log = directory / LOG_FILE
    with open(log, "a") as handle:
        handle.write(f"$ {' '.join(command)}\n{output}\n")
    return log


def _nvcc_version(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in out.splitlines() if "release" in line]
    return lines[-1].strip() if lines else None


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
