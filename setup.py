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

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: written into the built package (never into the source tree): the commit a plain ``pip install .``
#: was built from, so ``fd-async-copy --version`` names the build outside a checkout too
BUILD_INFO = "fd_async_copy_plugin/_build_info.py"

PACKAGES = find_packages(include=["fd_async_copy_plugin", "fd_async_copy_plugin.*"]) + [
    "fd_async_copy_plugin._custom_ops",
]
assert "fd_async_copy_plugin.patches" in PACKAGES, "the link fd_async_copy_plugin/patches -> ../patches is missing"


def git_describe(repo: Path = HERE) -> str | None:
    """``git describe`` of the checkout being built, or None (an sdist, no git): the build goes on
    without it. The package's own function, loaded from its file (the package is not imported)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_fdac_version", HERE / "fd_async_copy_plugin" / "cli" / "version.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.git_describe(repo)


def write_build_info(build_lib: Path, repo: Path = HERE) -> Path:
    target = Path(build_lib) / BUILD_INFO
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f'"""Written at build time by setup.py."""\n\nCOMMIT = {git_describe(repo)!r}\n')
    return target


class BuildPyWithCommit(build_py):
    def run(self):
        super().run()
        write_build_info(Path(self.build_lib))


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__
    setup(
        packages=PACKAGES,
        package_dir={"fd_async_copy_plugin._custom_ops": "custom_ops"},
        cmdclass={"build_py": BuildPyWithCommit},
    )
