"""``--version`` names the build after a plain ``pip install .`` too: setup.py writes the commit it
was built from into the package; a checkout run in place says ``git describe``."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _describe() -> str:
    return subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty", "--tags"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _setup_module():
    spec = importlib.util.spec_from_file_location("fdac_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() is not called
    return module


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = tmp_path_factory.mktemp("wheel")
    # a copy without build outputs: pip builds in the tree, and a build/ left there keeps old files
    source = tmp_path_factory.mktemp("src") / "checkout"
    shutil.copytree(REPO, source, symlinks=True,
                    ignore=shutil.ignore_patterns(".venv*", "build", "dist", "*.egg-info", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return next(out.glob("*.whl"))


def test_a_built_wheel_names_the_commit_it_was_built_from(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as archive:
        info = archive.read("fd_async_copy_plugin/_build_info.py").decode()
        archive.extractall(tmp_path / "site")
    assert f"COMMIT = {_describe()!r}" in info
    # installed code (no checkout above it): --version names the build from that file
    done = subprocess.run([sys.executable, "-m", "fd_async_copy_plugin.cli", "--version"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"fd-async-copy \S+ \(built from git {re.escape(_describe())}\)\n", done.stdout), done.stdout


def test_the_build_info_falls_back_when_git_is_unavailable(tmp_path):
    setup = _setup_module()
    target = setup.write_build_info(tmp_path / "lib", repo=tmp_path)  # no .git there: an sdist
    namespace: dict = {}
    exec(target.read_text(), namespace)
    assert namespace["COMMIT"] is None
    assert setup.write_build_info(tmp_path / "lib2").read_text().endswith(f"COMMIT = {_describe()!r}\n")


def test_version_line_prefers_the_checkout_then_the_build_then_says_unknown(monkeypatch):
    from fd_async_copy_plugin.cli import version

    monkeypatch.setattr(version, "git_describe", lambda: "abc1234")
    monkeypatch.setattr(version, "build_commit", lambda: "def5678")
    assert version.version_line().endswith("(git abc1234)")
    monkeypatch.setattr(version, "git_describe", lambda: None)
    assert version.version_line().endswith("(built from git def5678)")
    monkeypatch.setattr(version, "build_commit", lambda: None)
    assert version.version_line().endswith("(build commit unknown: built without git)")
