"""Build script: package discovery that pyproject.toml alone cannot express.

`patches/` lives at the top level of the repository (one module per feature, visible at a glance)
but is installed as `fd_async_copy_plugin.patches`: a top-level module called `patches` must never
be installed.
"""

from setuptools import find_packages, setup

PACKAGES = find_packages(include=["fd_async_copy_plugin", "fd_async_copy_plugin.*"]) + [
    "fd_async_copy_plugin.patches"
]

setup(
    packages=PACKAGES,
    package_dir={"fd_async_copy_plugin.patches": "patches"},
)
