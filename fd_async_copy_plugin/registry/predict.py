"""What ``enable()`` would decide, without patching or creating anything: ``fd_async_copy_plugin.plan()``
and ``fd-async-copy doctor``. Diagnostics only - an FD worker's ``register()``/``enable()`` never
loads this module (the runtime footprint test checks it)."""

from __future__ import annotations

import functools

from ..profile import detect_profile
from .manager import available_features, plugin_manager
from .plan import PADDLE_INSTALL_HINT, plan


def probe_backend(name: str) -> tuple[str, str]:
    """(the backend ``enable()`` would use for ``name``, why it cannot be used here or ""), without
    creating it. When it cannot be used, the name is ``none`` (what ``status()`` reports then) and
    the reason says what ``name`` needed."""
    if name in ("auto", "cuda"):
        try:
            from ..runtime.cuda import cuda_available

            ok, why = cuda_available()  # imports Paddle
        except ImportError as exc:
            return "none", f"backend {name!r}: Paddle is not importable ({exc}): {PADDLE_INSTALL_HINT}"
        if not ok:
            return "none", (
                f"backend {name!r} needs CUDA: {why}. Use FD_ASYNC_COPY_BACKEND=host to run the "
                "patched code with synchronous copies"
            )
        return "cuda", ""
    return name, ""


def predict(features: tuple[str, ...], backend: str, root: str) -> dict:
    """``fd_async_copy_plugin.plan()``'s answer for validated arguments."""
    profile = detect_profile(root)
    decisions = plan(features, available_features(plugin_manager()), profile, functools.partial(probe_backend, backend))
    return {
        "fastdeploy_version": profile.version,
        "profile": profile.profile,
        "profile_reason": profile.reason,
        "markers": dict(profile.markers),
        "root": root,
        "backend": probe_backend(backend)[0],
        "features": {n: d.as_dict() for n, d in decisions.items()},
    }
