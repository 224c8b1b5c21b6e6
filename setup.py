"""Build script: package discovery that pyproject.toml alone cannot express.

`patches/` lives at the top level of the repository (one module per feature, visible at a glance)
and is the package `fd_async_copy_plugin.patches` through the link `fd_async_copy_plugin/patches ->
../patches`: a checkout imports it as installed code does (from the repository root, or with
`PYTHONPATH=<checkout>`), and a wheel holds the files themselves. A top-level module called
`patches` is never installed.

`custom_ops/` (C++/CUDA sources) is installed as data under `fd_async_copy_plugin/_custom_ops`
(package-data in pyproject.toml) so that `fd-async-copy build-ops` can compile them after a plain
`pip install`. Nothing is compiled at install time: the ops are tied to the Paddle that imports
them (see fd_async_copy_plugin/ops/build.py).
"""

from setuptools import find_packages, setup

PACKAGES = find_packages(include=["fd_async_copy_plugin", "fd_async_copy_plugin.*"]) + [
    "fd_async_copy_plugin._custom_ops",
]
assert "fd_async_copy_plugin.patches" in PACKAGES, "the link fd_async_copy_plugin/patches -> ../patches is missing"

setup(
    packages=PACKAGES,
    package_dir={"fd_async_copy_plugin._custom_ops": "custom_ops"},
)
