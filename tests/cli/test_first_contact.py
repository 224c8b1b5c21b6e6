"""A new user's first contact: every way the set-up can be wrong gives one actionable line and a
documented exit code. Each case runs the real command in a subprocess, the way a user would.

Paddle is hidden with an import blocker (a ``sitecustomize`` that raises ``ModuleNotFoundError``
for ``paddle``), never uninstalled; the C++ compiler with a PATH that has every tool but compilers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BLOCK_PADDLE = textwrap.dedent(
    """
    import sys

    class _NoPaddle:
        def find_spec(self, name, path=None, target=None):
            if name == "paddle" or name.startswith("paddle."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoPaddle())
    """
)


def run(args, env=None, timeout=300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FD_ASYNC_COPY")}
    if "FD_ASYNC_COPY_OPS_DIR" in os.environ:
        base["FD_ASYNC_COPY_OPS_DIR"] = os.environ["FD_ASYNC_COPY_OPS_DIR"]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})})


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "fd_async_copy_plugin.cli", *args], env=env)


@pytest.fixture(scope="module")
def no_paddle(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("no_paddle")
    (folder / "sitecustomize.py").write_text(BLOCK_PADDLE)
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def test_the_blocker_really_hides_paddle(no_paddle):
    done = run([sys.executable, "-c", "import paddle"], env=no_paddle)
    assert done.returncode == 1 and "No module named 'paddle'" in done.stderr


def test_doctor_without_paddle_says_which_paddle_to_install_and_exits_1(no_paddle):
    done = cli("doctor", env=no_paddle)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    paddle_line = " ".join(done.stdout.split("\n  custom ops")[0].split("paddle ", 1)[1].split())
    assert "NOT INSTALLED" in paddle_line
    assert "paddlepaddle-gpu" in paddle_line and "next to FastDeploy" in paddle_line
    assert "CPU paddlepaddle==3.3.0" in paddle_line and "tests" in paddle_line
    assert all(len(line) <= 100 for line in done.stdout.splitlines())


def test_doctor_json_without_paddle_still_reports_every_feature(no_paddle):
    import json

    done = cli("doctor", "--json", env=no_paddle)
    report = json.loads(done.stdout)
    assert report["paddle"]["installed"] is False
    assert {e["state"] for e in report["features"].values()} == {"skipped", "not requested"}  # overlap: opt-in
    assert all("paddlepaddle-gpu" in e["reason"] for e in report["features"].values())


def test_status_and_help_work_without_paddle(no_paddle):
    done = run([sys.executable, "-c", "import fd_async_copy_plugin as p; print(p.status()['enabled'])"], env=no_paddle)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    for command in ((), ("doctor",), ("selftest",), ("bench",), ("ab",), ("build-ops",)):
        done = cli(*command, "--help", env=no_paddle)
        assert done.returncode == 0, (command, done.stderr)
        assert not re.search(r"``|:class:|:func:|\*\*", done.stdout), (command, done.stdout)


@pytest.mark.parametrize("command", [("selftest", "--steps", "2"), ("bench", "--smoke"), ("selftest", "--json")])
def test_selftest_and_bench_without_paddle_say_which_paddle_to_install_and_exit_1(no_paddle, command):
    done = cli(*command, env=no_paddle)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    if "--json" in command:  # the report is a JSON error object (test_cli_explains_itself)
        assert json.loads(done.stdout)["ok"] is False
    else:
        assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"fd-async-copy {command[0]} FAILED: Paddle is not importable (No module named 'paddle')")
    assert "paddlepaddle-gpu" in line and "next to FastDeploy" in line and "CPU paddlepaddle==3.3.0" in line


def test_every_bad_variable_is_listed_at_once_and_doctor_exits_1():
    done = cli("doctor", env={"FD_ASYNC_COPY": "yes", "FD_ASYNC_COPY_BACKEND": "gpu", "FD_ASYNC_COPY_FEATURES": "all"})
    assert done.returncode == 1
    errors = [line for line in done.stdout.splitlines() if line.startswith("  CONFIG ERROR")]
    assert len(errors) == 2
    assert "FD_ASYNC_COPY='yes'" in errors[0] and "FD_ASYNC_COPY_BACKEND='gpu'" in errors[1]


def test_doctor_keeps_a_gap_between_every_variable_and_its_value():
    done = cli("doctor", env={"FD_ASYNC_COPY_RING_MAX_BYTES": "65536"})
    lines = done.stdout.split("  environment\n", 1)[1].split("  features")[0].splitlines()
    rows = {line.split()[0]: line for line in lines if line.startswith("    FD_")}
    assert "FD_ASYNC_COPY_RING_MAX_BYTES" in rows and "FD_ASYNC_COPY" in rows, lines
    for name, line in rows.items():
        assert line.startswith(f"    {name}  "), line  # at least two spaces: never `NAME(unset)`
    assert len({line.index(line.split()[1]) for line in rows.values()}) == 1  # values in one column
    assert "'65536'" in rows["FD_ASYNC_COPY_RING_MAX_BYTES"]


def test_build_ops_without_a_cxx_compiler_is_one_line_naming_g_plus_plus_and_cxx(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    compilers = re.compile(r"^(g\+\+|gcc|c\+\+|cc|cpp|clang|x86_64-linux-gnu-|aarch64-linux-gnu-)")
    for folder in ("/usr/bin", "/bin"):
        for entry in os.scandir(folder):
            if not compilers.match(entry.name) and not (tools / entry.name).exists():
                (tools / entry.name).symlink_to(entry.path)
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), str(tools)]),
           "FD_ASYNC_COPY_OPS_DIR": str(tmp_path / "ops"), "CXX": "", "CC": ""}
    done = run([sys.executable, "-m", "fd_async_copy_plugin.cli", "build-ops", "--no-cuda"], env=env)
    assert done.returncode == 1
    (failure,) = [line for line in done.stdout.splitlines() if "FAILED" in line]
    assert "no C++ compiler" in failure and "g++" in failure and "CXX" in failure
    assert "Traceback" not in done.stdout + done.stderr


def test_a_failing_compiler_is_summarised_with_the_log_behind_a_file(tmp_path):
    env = {"CXX": "/bin/false", "CC": "/bin/false", "FD_ASYNC_COPY_OPS_DIR": str(tmp_path)}
    done = cli("build-ops", "--no-cuda", env=env)
    assert done.returncode == 1
    (failure,) = [line for line in done.stdout.splitlines() if "FAILED" in line]
    assert "failed with exit code" in failure and f"full log: {tmp_path / 'build-ops.log'}" in failure
    assert "--verbose" in failure
    assert "/bin/false" in (tmp_path / "build-ops.log").read_text()


def test_ab_checks_both_servers_before_sending_anything():
    done = cli("ab", "--base-url", "http://127.0.0.1:1", "--candidate-url", "http://127.0.0.1:2")
    assert done.returncode == 4
    (line,) = done.stderr.strip().splitlines()
    assert "base server http://127.0.0.1:1 is not reachable" in line
    assert "candidate server http://127.0.0.1:2 is not reachable" in line
    assert "requests to" not in done.stderr  # nothing was sent


def test_selftest_rejects_an_unknown_backend():
    done = cli("selftest", "--backend", "gpu")
    assert done.returncode == 2 and "invalid choice: 'gpu'" in done.stderr


def test_selftest_names_a_skipped_feature_and_fails_unless_allowed(tmp_path):
    env = {"FD_ASYNC_COPY_OPS_DIR": str(tmp_path)}  # no ops built there: stop_flag is skipped
    done = cli("selftest", "--steps", "4", "--backend", "host", env=env)
    assert done.returncode == 1, done.stdout[-2000:]
    (result,) = [line for line in done.stdout.splitlines() if line.startswith("  result:")]
    assert "FAIL: not tested: overlap, sampled_tokens, step_syncs, stop_flag" in result and "--allow-skip" in result
    assert "not compared (stop_flag, sampled_tokens, step_syncs, overlap not applied)" in " ".join(done.stdout.split())
    assert "stop_flag: skipped: custom ops unavailable" in done.stdout
    assert all(len(line) <= 100 for line in done.stdout.splitlines())
    allowed = cli("selftest", "--steps", "4", "--backend", "host", "--allow-skip", env=env)
    assert allowed.returncode == 0
    assert "result: PASS with overlap, sampled_tokens, step_syncs, stop_flag skipped (--allow-skip)" in allowed.stdout


def test_licence_is_an_spdx_string_and_the_build_backend_supports_it():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"  # a TOML table is deprecated (warnings)
    requires = project["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in requires)
    assert not {"wrapt", "packaging"} & {re.split(r"[<>=]", d)[0] for d in project["project"]["dependencies"]}
