"""Fixtures for the registry tests: a small FastDeploy-shaped package written to a temp dir.

The registry is generic (it patches whatever targets a feature declares), so these tests use a
synthetic package with distinct names per test; the real features are tested against the
reference replica elsewhere.
"""

from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

import fd_async_copy_plugin

_counter = itertools.count()

FILES = {
    "__init__.py": "",
    "worker/__init__.py": "",
    "worker/base.py": """
        class RunnerBase:
            def not_need_stop(self):
                return "base"
    """,
    "worker/gpu_model_runner.py": """
        from ..model_executor.pre_and_post_process import post_process
        from .base import RunnerBase

        class GPUModelRunner(RunnerBase):
            def execute_model(self):
                return post_process("runner")

            @staticmethod
            def helper():
                return "helper"
    """,
    "model_executor/__init__.py": "",
    "model_executor/pre_and_post_process.py": """
        def save_output_topk(*args):
            return ("save", args)

        def post_process(x):
            return ("post", x)
    """,
}


@pytest.fixture
def fakefd(tmp_path, monkeypatch):
    """Write a fresh package ``fakefd_N`` and return its name; unloads it afterwards."""
    name = f"fakefd_{next(_counter)}"
    for relative, body in FILES.items():
        path = tmp_path / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    fd_async_copy_plugin.disable()
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


@pytest.fixture
def manager():
    """The process-wide manager, disabled before and after the test."""
    fd_async_copy_plugin.disable()
    mgr = fd_async_copy_plugin._get_manager()
    yield mgr
    fd_async_copy_plugin.disable()
    if mgr.pm is not None:
        for plugin in list(mgr.pm.get_plugins()):
            if mgr.pm.get_name(plugin) and mgr.pm.get_name(plugin).startswith("test-"):
                mgr.pm.unregister(plugin)
