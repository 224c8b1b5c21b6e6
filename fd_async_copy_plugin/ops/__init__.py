"""Building and loading the custom ops (``custom_ops/``), and reporting their state.

- ``load_ops(build=False) -> StopFlagOps``: ``get_stop``, ``set_stop``, ``update_inputs_v1_host``,
  ``update_inputs_host`` and, when the CUDA library is built, ``update_inputs_v1_cuda``,
  ``update_inputs_cuda``. Raises ``OpsUnavailable`` saying what to do.
- ``ops_status() -> dict``: built / loadable / path / error / cuda_kernels; never raises.
- ``build_ops(verbose=False, force=False, cuda=True)`` (the CLI ``fd-async-copy build-ops`` is
  ``cli/build_ops.py``); ``find_nvcc()`` (``cache.py``).

Importing this package imports neither Paddle nor a compiler, nor the builder (``build.py``,
loaded on first use of ``build_ops``/``BuildError``).
"""

from __future__ import annotations

from .cache import OPS_DIR_ENV, find_nvcc, ops_dir
from .stop_flag_ops import OpsUnavailable, StopFlagOps, load_ops, ops_status


def __getattr__(name: str):
    # The builder (compilers, locks, subprocesses) is loaded by `build-ops`, never by enable().
    if name in ("BuildError", "build_ops"):
        from . import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BuildError", "OPS_DIR_ENV", "OpsUnavailable", "StopFlagOps", "build_ops", "find_nvcc", "load_ops",
           "ops_dir", "ops_status"]
