"""A new user's run, word for word: the two commands of the README's "Set-up on a fresh machine"
section, each in a fresh venv over a copy of this checkout, must exit 0; then, in the first venv
with Paddle uninstalled, every command a user meets first gives one line and exit code 1 (or 0).

The commands are read from README.md, so this test cannot drift from what the README tells a user.
Running them takes minutes and needs a package index (PyPI or the one pip is configured with), so
those tests are opt-in: ``FD_ASYNC_COPY_FRESH_VENV_TEST=1 python -m pytest tests/cli/test_new_user_fresh_venv.py``.
The README parsing itself always runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPT_IN = "FD_ASYNC_COPY_FRESH_VENV_TEST"
SECTION = "## Set-up on a fresh machine"

fresh_venv = pytest.mark.skipif(
    os.environ.get(OPT_IN) != "1", reason=f"takes minutes and needs a package index: set {OPT_IN}=1"
)


def setup_commands(readme: str) -> list[str]:
    """The shell commands of the README's set-up section: one per ```bash block, in order."""
    start = readme.index(SECTION) + len(SECTION)
    following = re.search(r"^## ", readme[start:], flags=re.MULTILINE)
    section = readme[start:start + following.start()] if following else readme[start:]
    blocks = re.findall(r"^```(?:bash|sh)\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    return [" ".join(line.strip() for line in block.strip().splitlines()) for block in blocks]


def test_the_readme_set_up_section_has_exactly_the_selftest_and_the_test_commands():
    commands = setup_commands((REPO / "README.md").read_text())
    assert len(commands) == 2, commands
    selftest, tests = commands
    for command in commands:
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && "), command
        assert "fd-async-copy build-ops" in command, command
    assert "pip install paddlepaddle==3.3.0 ." in selftest and selftest.endswith("fd-async-copy selftest")
    assert 'pip install -e ".[test]"' in tests and tests.endswith("python -m pytest -q")


def test_the_parser_reads_only_the_set_up_section():
    readme = "\n".join([
        "# x", "```bash", "outside before", "```",
        SECTION, "text", "```bash", "first \\", "  continued", "```", "more", "```python", "not shell", "```",
        "```bash", "second", "```",
        "## Next", "```bash", "outside after", "```", "",
    ])
    assert setup_commands(readme) == ["first \\ continued", "second"]


# --- the run itself (opt-in) -----------------------------------------------------------------


def _copy_checkout(dest: Path) -> Path:
    """The checkout as a user would have it: a git clone (the tests that read ``git describe`` need
    its history; links stay links), with the working tree's tracked and untracked-but-not-ignored
    files laid over it, nothing git ignores (no venvs, builds or caches). Without git, a copy of
    everything but those."""
    cloned = subprocess.run(["git", "clone", "--quiet", str(REPO), str(dest)], capture_output=True)
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if cloned.returncode == 0 and listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            source, target = REPO / name, dest / name
            if source.is_symlink() or not source.is_file():
                continue  # links come with the clone; a file deleted in the working tree is not copied
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    else:
        ignore = shutil.ignore_patterns(".git", ".venv*", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.so")
        shutil.copytree(REPO, dest, ignore=ignore, dirs_exist_ok=True, symlinks=True)
    return dest


def _user_env(tmp: Path) -> dict:
    """A shell as a new user's: no active venv, none of this test run's Python or plugin settings;
    built ops go to a folder of the test."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FD_ASYNC_COPY", "PYTHON", "PYTEST")) and k not in ("VIRTUAL_ENV", OPT_IN)}
    ours = {str(Path(sys.executable).parent), os.environ.get("VIRTUAL_ENV", "") + "/bin"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p not in ours)
    env["FD_ASYNC_COPY_OPS_DIR"] = str(tmp / "ops")
    return env


def _bash(command: str, cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _tail(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"


@pytest.fixture(scope="module")
def selftest_venv(tmp_path_factory) -> tuple[Path, dict]:
    """README command 1 in a fresh venv over a fresh copy; the checkout (with its .venv) and env."""
    tmp = tmp_path_factory.mktemp("new_user_selftest")
    checkout, env = _copy_checkout(tmp / "checkout"), _user_env(tmp)
    command = setup_commands((REPO / "README.md").read_text())[0]
    done = _bash(command, checkout, env, timeout=1800)
    assert done.returncode == 0, _tail(done)
    assert re.search(r"^\s*result: PASS", done.stdout, flags=re.MULTILINE), _tail(done)
    return checkout, env


@fresh_venv
def test_readme_command_1_builds_the_ops_and_the_selftest_passes(selftest_venv):
    checkout, _ = selftest_venv
    assert (checkout / ".venv" / "bin" / "fd-async-copy").exists()


@fresh_venv
def test_readme_command_2_installs_the_test_extra_and_the_tests_pass(tmp_path):
    checkout, env = _copy_checkout(tmp_path / "checkout"), _user_env(tmp_path)
    command = setup_commands((REPO / "README.md").read_text())[1]
    done = _bash(command, checkout, env, timeout=5400)
    assert done.returncode == 0, _tail(done)
    assert re.search(r"\d+ passed", done.stdout), _tail(done)


@fresh_venv
def test_without_paddle_each_first_command_is_one_line_and_its_exit_code(selftest_venv):
    """The venv of command 1, Paddle uninstalled: what a user meets next to FastDeploy's missing Paddle."""
    checkout, env = selftest_venv
    activate = ". .venv/bin/activate && "
    done = _bash(activate + "pip uninstall -y paddlepaddle", checkout, env, timeout=600)
    assert done.returncode == 0, _tail(done)
    cases = {
        "fd-async-copy selftest --steps 2": (1, "selftest FAILED: Paddle is not importable"),
        "fd-async-copy bench --smoke": (1, "bench FAILED: Paddle is not importable"),
        "fd-async-copy build-ops --no-cuda":
            (1, "build-ops FAILED: Paddle is not importable (No module named 'paddle')"),
        "python -c 'import fd_async_copy_plugin as p; print(p.status()[\"enabled\"])'": (0, "False"),
    }
    for command, (code, message) in cases.items():
        done = _bash(activate + command, checkout, env, timeout=600)
        assert done.returncode == code, (command, _tail(done))
        assert "Traceback" not in done.stdout + done.stderr, (command, _tail(done))
        assert message in done.stdout + done.stderr, (command, _tail(done))
    done = _bash(activate + "fd-async-copy doctor", checkout, env, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, _tail(done)
    assert "NOT INSTALLED" in done.stdout and "paddlepaddle-gpu" in done.stdout, _tail(done)
    for command in ("fd-async-copy --help", "fd-async-copy selftest --help", "fd-async-copy bench --help"):
        done = _bash(activate + command, checkout, env, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, _tail(done))
