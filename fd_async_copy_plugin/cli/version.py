"""Which build of the plugin is running: the package version and, from a checkout, ``git describe``."""

from __future__ import annotations

import subprocess
from pathlib import Path

DISTRIBUTION = "fd-async-copy-plugin"


def package_version() -> str:
    """The version of the code that runs: a checkout's pyproject.toml (installed metadata can be
    stale there, e.g. an old egg-info in the working directory), else the installed distribution's."""
    import re
    from importlib import metadata

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        found = re.search(r'^name = "fd-async-copy-plugin"\n(?:.*\n)*?version = "([^"]+)"', pyproject.read_text(), re.M)
        if found:
            return found.group(1)
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def git_describe(repo: Path | None = None) -> str | None:
    """``git describe --always --dirty --tags`` of the checkout the package runs from (or ``repo``,
    as setup.py asks at build time), else None (an installed wheel, no git, or a checkout of another
    project above site-packages)."""
    repo = Path(__file__).resolve().parents[2] if repo is None else Path(repo)
    if not (repo / ".git").exists() or not (repo / "pyproject.toml").is_file():
        return None
    try:
        done = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty", "--tags"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def build_commit() -> str | None:
    """The commit an installed build was made from (written by setup.py at build time), or None
    (a checkout run in place, or a build made without git)."""
    try:
        from .. import _build_info
    except ImportError:
        return None
    return getattr(_build_info, "COMMIT", None)


def versions() -> dict:
    """The versions a report records: plugin (and git describe), Python, Paddle, FastDeploy."""
    import platform

    report = {"fd_async_copy_plugin": package_version(), "git_describe": git_describe(),
              "build_commit": build_commit(), "python": platform.python_version()}
    try:
        import paddle

        report["paddle"] = str(paddle.__version__)
    except Exception as exc:  # a report must still come out
        report["paddle"] = f"not importable ({type(exc).__name__}: {exc})"
    return report


def version_line() -> str:
    """The version and the build: ``git describe`` in a checkout, else the commit the installed
    package was built from, else says that the build is unknown."""
    describe = git_describe()
    if describe:
        return f"fd-async-copy {package_version()} (git {describe})"
    commit = build_commit()
    if commit:
        return f"fd-async-copy {package_version()} (built from git {commit})"
    return f"fd-async-copy {package_version()} (build commit unknown: built without git)"
