"""Make a FastDeploy tree step on CPU Paddle: its platform, its compiled ops, Paddle's sampling op.

``prepare(fd_root)`` must run before the plugin is enabled and before anything imports
``fastdeploy.worker.gpu_model_runner`` (FastDeploy binds its ops at import):

- ``fd_root`` (the folder holding ``fastdeploy/``; None: the installed package) goes first on
  ``sys.path``; Paddle runs on the CPU; FastDeploy's log and Prometheus folders go to a scratch folder.
- ``fastdeploy.model_executor.ops.gpu`` is ``ops.op_namespace(line)``: our ports. Then the
  runner, post-process and sampler modules are imported (``IMPORTED``) on FastDeploy's CPU
  platform: their import lists bind our ops, and their import-time platform tests (some query the
  GPU's properties) take the CPU answer, which picks the same (``else``) branches as CUDA.
- then ``fastdeploy.platforms``' current platform becomes FastDeploy's own ``CUDAPlatform``
  answering ``is_cuda()`` True, also in every loaded module that bound the old one: FastDeploy's
  call-time tests (``Sampler``, ``rebuild_padding``, the penalty op) take their CUDA branch.
  So the plugin is enabled after the runner module was imported (the worker's order is the
  reverse; ``tools/enable_on_real_fastdeploy.py`` covers that order).
- FastDeploy's ``pin_memory()`` and ``copy_(src, False)`` into pinned buffers go through the
  run's copy backend (``pinned.py``).
- FastDeploy's Triton kernels on the step (``ops.TRITON_KERNELS``: the logprob ranks' count)
  are our ports (Triton has no CPU driver).
- ``paddle.tensor.top_p_sampling`` (Paddle's sampling kernel, which FastDeploy's
  ``top_k_top_p_sampling`` calls with ``FD_SAMPLING_CLASS=base``) is the replica's stand-in:
  greedy for ``top_p`` 0 rows, seeded otherwise, with the host-input transform device tracking
  counts (the **T** wait of FD 2.4 / 2.5's host ``infer_seed``).

``line`` is detected from the tree's shape (``detect_line``) unless given. Everything stays in
place for the life of the process (a child process per run keeps it from leaking).
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from dataclasses import dataclass

LINES = ("fd24", "fd25", "fddev")
#: imported by ``prepare`` before the platform answers CUDA (a decode step needs nothing else)
IMPORTED = (
    "fastdeploy.worker.gpu_model_runner",
    "fastdeploy.model_executor.pre_and_post_process",
    "fastdeploy.model_executor.layers.sample.sampler",
    "fastdeploy.model_executor.layers.sample.ops",
)


@dataclass
class Prepared:
    line: str
    fd_root: str | None
    fastdeploy_file: str
    scratch: str


_PREPARED: Prepared | None = None


def detect_line(fd_root: str | None) -> str:
    """fd24 / fd25 / fddev from the tree's files (the profile markers of fastdeploy-surface §7)."""
    base = os.path.join(fd_root, "fastdeploy") if fd_root else None
    if base is None:
        spec = importlib.util.find_spec("fastdeploy")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("no FastDeploy found: install it or pass --fd-root TREE")
        base = list(spec.submodule_search_locations)[0]
    if not os.path.isfile(os.path.join(base, "worker", "gpu_model_runner.py")):
        raise RuntimeError(f"{base} is not a FastDeploy package (no worker/gpu_model_runner.py)")
    if not os.path.isfile(os.path.join(base, "worker", "input_batch.py")):
        return "fd24"
    with open(os.path.join(base, "worker", "gpu_model_runner.py"), encoding="utf-8") as f:
        source = f.read()
    return "fd25" if "def not_need_stop(" in source else "fddev"


def prepare(fd_root: str | None = None, line: str | None = None) -> Prepared:
    global _PREPARED
    if _PREPARED is not None:
        if (fd_root and os.path.abspath(fd_root) != _PREPARED.fd_root) or (line and line != _PREPARED.line):
            raise RuntimeError("this process already stepped another FastDeploy tree; use a new process")
        return _PREPARED
    if fd_root:
        fd_root = os.path.abspath(fd_root)
        sys.path.insert(0, fd_root)
    line = line or detect_line(fd_root)
    if line not in LINES:
        raise ValueError(f"unknown FastDeploy line {line!r} (one of {', '.join(LINES)})")
    scratch = tempfile.mkdtemp(prefix="fd-async-copy-real-steps-")
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", scratch)
    os.environ.setdefault("FD_LOG_DIR", os.path.join(scratch, "log"))
    import paddle

    paddle.set_device("cpu")
    import fastdeploy

    if fd_root and not os.path.abspath(fastdeploy.__file__).startswith(fd_root + os.sep):
        raise RuntimeError(f"fastdeploy was already imported from {fastdeploy.__file__}, not {fd_root}")
    from . import pinned
    from .ops import op_namespace

    pinned.install(os.path.dirname(os.path.abspath(fastdeploy.__file__)))

    sys.modules["fastdeploy.model_executor.ops.gpu"] = op_namespace(line)
    import fastdeploy.model_executor.ops as ops_package

    ops_package.gpu = sys.modules["fastdeploy.model_executor.ops.gpu"]
    # FastDeploy's modules, imported on the CPU platform: their import-time platform tests (which
    # query the GPU's properties) take the CPU answer; the import lists bind our ops
    for name in IMPORTED:
        importlib.import_module(name)
    import fastdeploy.platforms as platforms
    from fastdeploy.platforms.cuda import CUDAPlatform

    class CudaOnCpu(CUDAPlatform):
        """FastDeploy's ``CUDAPlatform``, answering ``is_cuda()`` True on CPU Paddle (its own
        answer is ``paddle.is_compiled_with_cuda()``)."""

        def is_cuda(self) -> bool:
            return True

    from .ops import TRITON_KERNELS

    for (module_name, name), port in TRITON_KERNELS.items():
        module = importlib.import_module(module_name)
        if hasattr(module, name):
            setattr(module, name, port)
    earlier = platforms.current_platform
    platforms._current_platform = CudaOnCpu()
    for name, module in list(sys.modules.items()):  # the modules that bound the platform at import
        if name.startswith("fastdeploy") and vars(module).get("current_platform") is earlier:
            module.current_platform = platforms._current_platform
    from ..reference import ROOTS

    replica_sampling = importlib.import_module(ROOTS["fd24"] + ".model_executor.layers.sample.ops.top_k_top_p_sampling")

    paddle.tensor.top_p_sampling = replica_sampling.top_p_sampling
    _PREPARED = Prepared(line, fd_root, os.path.abspath(fastdeploy.__file__), scratch)
    return _PREPARED
