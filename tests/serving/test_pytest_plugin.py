"""The pytest plugin ``fd_async_copy``, exercised the way users run it: a real pytest session in a
subprocess (``python -m pytest -p fd_async_copy ...``) on a small generated test file.

Autoloading is switched off in those sessions (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1), so ``-p
fd_async_copy`` itself must find the plugin through its ``pytest11`` entry point; a throw-away
dist-info on PYTHONPATH declares that entry point when the package is not pip-installed.

Two groups of tests:
- against the real ``fd_async_copy_plugin.enable()`` and the reference replica ``reference.fd24``;
- against a stand-in API (loaded with ``-p`` before the plugin), for the plugin's own logic where
  the real API cannot easily be made to fail on purpose (strict mode, ``enable()`` raising).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = "fd_async_copy_plugin.testing.reference.fd24"
ENV_KEYS = ("FD_PLUGINS", "FD_ASYNC_COPY", "FD_ASYNC_COPY_FEATURES", "FD_ASYNC_COPY_BACKEND", "FD_ASYNC_COPY_STRICT")
ALL_FEATURES = "logprobs,stop_flag,sampled_tokens,sync_scope,step_syncs,flag_race"
USAGE_ERROR = 4  # pytest.ExitCode.USAGE_ERROR

# The generated test module. At import (collection) time it records what it sees: the plugin's
# status, the FD_* environment, and a fingerprint of every function in the FastDeploy root (where
# its code was written: a patched name's code lives outside the root). A test starts a child process
# to see the environment subprocesses inherit. After the session (atexit) it records them again.
INNER_TEST = textwrap.dedent(
    '''
    import atexit, importlib, json, os, pkgutil, subprocess, sys
    import fd_async_copy_plugin as api

    ROOT = os.environ["INNER_ROOT"]
    ENV_KEYS = %(env_keys)r

    def env_view():
        return {k: os.environ.get(k) for k in ENV_KEYS}

    def code_file(value):
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        return code.co_filename if code is not None else None

    def fingerprint():
        package = importlib.import_module(ROOT)
        for info in pkgutil.walk_packages(package.__path__, ROOT + "."):
            importlib.import_module(info.name)
        out = {}
        for name, module in sorted(sys.modules.items()):
            if name != ROOT and not name.startswith(ROOT + "."):
                continue
            for attr, value in list(vars(module).items()):
                if code_file(value):
                    out[name + ":" + attr] = code_file(value)
                if isinstance(value, type) and value.__module__ == name:
                    for cattr, cvalue in list(vars(value).items()):
                        if code_file(cvalue):
                            out[name + ":" + attr + "." + cattr] = code_file(cvalue)
        return out

    def snapshot():
        return {"status": api.status(), "env": env_view(), "fingerprint": fingerprint()}

    facts = {"at_collection": snapshot()}

    def test_sees_the_session_state():
        probe = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %(env_keys)r}))"
        child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        facts["child_env"] = json.loads(child.stdout)
        facts["in_test_enabled"] = api.status()["enabled"]

    @atexit.register
    def _after_session():
        facts["after_session"] = snapshot()
        with open(os.environ["INNER_FACTS"], "w") as f:
            json.dump(facts, f, default=str)
    '''
) % {"env_keys": ENV_KEYS}

# Stand-in for the public API, for the plugin's own error handling. Loaded with -p before the plugin.
FAKE_API = textwrap.dedent(
    '''
    import json, os
    import fd_async_copy_plugin as api

    STATUS = {
        "enabled": True, "profile": "fastdeploy-2.4", "fastdeploy_version": "2.4.0", "backend": "host",
        "features": {
            "logprobs": {"state": "failed", "reason": "boom: target missing"},
            "stop_flag": {"state": "applied", "reason": ""},
        },
    }

    def _log(*entry):
        with open(os.environ["FAKE_API_CALLS"], "a") as f:
            f.write(json.dumps(entry) + "\\n")

    def enable(features=None, backend="auto", strict=False, root="fastdeploy"):
        _log("enable", features, backend, strict, root)
        if os.environ.get("FAKE_API_RAISES"):
            raise RuntimeError("no FastDeploy here")
        return STATUS

    def disable():
        _log("disable")

    def status():
        return STATUS

    api.enable, api.disable, api.status = enable, disable, status
    '''
)


def run_pytest(tmp_path: Path, *args: str, env: dict[str, str] | None = None, inner: str = INNER_TEST):
    """Run ``python -m pytest -p fd_async_copy ARGS`` on the generated test file; returns
    (completed process, facts recorded by the inner test or None)."""
    shim = tmp_path / "shim" / "fd_async_copy_pytest_shim-0.dist-info"
    shim.mkdir(parents=True)
    (shim / "METADATA").write_text("Metadata-Version: 2.1\nName: fd-async-copy-pytest-shim\nVersion: 0\n")
    (shim / "entry_points.txt").write_text("[pytest11]\nfd_async_copy = fd_async_copy_plugin.pytest_plugin\n")
    session = tmp_path / "session"
    session.mkdir()
    (session / "pytest.ini").write_text("[pytest]\n")
    (session / "test_inner.py").write_text(inner)
    (session / "fake_api.py").write_text(FAKE_API)
    facts = tmp_path / "facts.json"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("FD_", "PYTEST_"))}
    full_env.update(
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path / "shim"), str(session)]),
        INNER_ROOT=ROOT,
        INNER_FACTS=str(facts),
        FAKE_API_CALLS=str(tmp_path / "calls.jsonl"),
        **(env or {}),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "test_inner.py"],
        cwd=session,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, (json.loads(facts.read_text()) if facts.exists() else None)


def header_lines(stdout: str) -> list[str]:
    """The session header: the lines before the first collection/result line."""
    head = stdout.split("collected", 1)[0]
    return [line for line in head.splitlines() if line.startswith(("fd-async-copy", "  "))]


def unwrapped(lines: list[str], start: str) -> str:
    """The status line starting with ``start``, its wrapped continuation lines (4 more spaces) joined."""
    index = next(i for i, line in enumerate(lines) if line.startswith(start))
    parts = [lines[index]]
    for line in lines[index + 1:]:
        if not line.startswith("    "):
            break
        parts.append(line.strip())
    return " ".join(parts)


def fake_api_calls(tmp_path: Path) -> list[list]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


ACTIVE = ("-p", "fd_async_copy", "--fd-async-copy", f"--fd-async-copy-root={ROOT}", "--fd-async-copy-backend=host")


# --- real API --------------------------------------------------------------------------------------


def test_loading_the_plugin_alone_changes_nothing(tmp_path):
    proc, facts = run_pytest(tmp_path, "-p", "fd_async_copy", env={"FD_PLUGINS": "other"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [line for line in proc.stdout.splitlines() if line.startswith("fd-async-copy")]
    assert facts["at_collection"]["status"]["enabled"] is False
    assert facts["at_collection"]["env"] == {**dict.fromkeys(ENV_KEYS), "FD_PLUGINS": "other"}
    assert facts["child_env"] == facts["at_collection"]["env"]


def test_active_session_patches_before_collection_exports_env_and_reverts(tmp_path):
    proc, facts = run_pytest(tmp_path, *ACTIVE, env={"FD_PLUGINS": "other"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = header_lines(proc.stdout)
    assert header[0].startswith("fd-async-copy: enabled=True profile=")
    first = unwrapped(header, "fd-async-copy: ")
    assert "backend=host" in first and f"root={ROOT}" in first
    features_line = " ".join(unwrapped(header, "fd-async-copy features: ").split())
    assert [f.split("=")[0] for f in features_line.split(": ", 1)[1].split(", ")] == ALL_FEATURES.split(",")
    exported = {
        "FD_PLUGINS": "other,fd_async_copy",
        "FD_ASYNC_COPY": "1",
        "FD_ASYNC_COPY_FEATURES": ALL_FEATURES,
        "FD_ASYNC_COPY_BACKEND": "host",
        "FD_ASYNC_COPY_STRICT": None,
    }
    assert "fd-async-copy subprocess env: FD_PLUGINS=other,fd_async_copy FD_ASYNC_COPY=1" in proc.stdout
    # the test module saw the plugin enabled when it was imported, i.e. before collection finished
    assert facts["at_collection"]["status"]["enabled"] is True
    assert facts["at_collection"]["status"]["backend"] == "host"
    assert facts["in_test_enabled"] is True
    assert facts["at_collection"]["env"] == exported
    assert facts["child_env"] == exported  # what FastDeploy's server subprocesses would inherit
    # after the session: reverted, environment restored
    assert facts["after_session"]["status"]["enabled"] is False
    assert facts["after_session"]["env"] == {**dict.fromkeys(ENV_KEYS), "FD_PLUGINS": "other"}
    assert "fd-async-copy (state at session end)" in proc.stdout


def test_options_fall_back_to_the_fd_async_copy_variables(tmp_path):
    env = {"FD_ASYNC_COPY_FEATURES": "stop_flag", "FD_ASYNC_COPY_BACKEND": "host"}
    proc, facts = run_pytest(tmp_path, "-p", "fd_async_copy", "--fd-async-copy", f"--fd-async-copy-root={ROOT}", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(facts["at_collection"]["status"]["features"]) == ["stop_flag"]
    assert facts["child_env"]["FD_ASYNC_COPY_FEATURES"] == "stop_flag"
    assert facts["after_session"]["env"]["FD_ASYNC_COPY_FEATURES"] == "stop_flag"  # the user's value, restored


def test_patched_names_are_visible_to_test_modules_and_restored_after(tmp_path):
    off_dir, on_dir = tmp_path / "off", tmp_path / "on"
    off_dir.mkdir()
    on_dir.mkdir()
    _, off = run_pytest(off_dir, "-p", "fd_async_copy")
    proc, on = run_pytest(on_dir, *ACTIVE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "profile=fastdeploy-2.4" in header_lines(proc.stdout)[0]
    # features whose modules were not imported yet are pending in the header and applied on import
    summary = proc.stdout.split("fd-async-copy (state at session end)", 1)[1]
    assert "=applied" in summary and "=failed" not in summary
    unpatched, patched = off["at_collection"]["fingerprint"], on["at_collection"]["fingerprint"]
    changed = {name for name in unpatched if patched.get(name) != unpatched[name]}
    assert changed, "no FastDeploy name was replaced before the test module imported it"
    root_dir = str(REPO / "fd_async_copy_plugin" / "testing" / "reference" / "fd24")
    assert all(not patched[name].startswith(root_dir) for name in changed)
    assert on["after_session"]["fingerprint"] == unpatched  # every original restored


def _cuda_build() -> bool:
    import paddle

    return bool(paddle.is_compiled_with_cuda())


@pytest.mark.skipif("_cuda_build()", reason="needs a CPU Paddle build, where the cuda backend cannot start")
def test_unusable_backend_skips_features_but_strict_stops_the_session(tmp_path):
    cuda = ("-p", "fd_async_copy", "--fd-async-copy", f"--fd-async-copy-root={ROOT}", "--fd-async-copy-backend=cuda")
    (tmp_path / "lenient").mkdir()
    (tmp_path / "strict").mkdir()
    proc, facts = run_pytest(tmp_path / "lenient", *cuda)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # runs unpatched, and says why
    assert "fd-async-copy features: logprobs=skipped" in proc.stdout
    assert "  logprobs: skipped (backend stands down: " in proc.stdout
    proc, facts = run_pytest(tmp_path / "strict", *cuda, "--fd-async-copy-strict")
    assert proc.returncode == USAGE_ERROR
    assert "StrictModeError" in proc.stderr and facts is None


def test_sub_options_without_the_switch_are_a_usage_error(tmp_path):
    proc, _ = run_pytest(tmp_path, "-p", "fd_async_copy", "--fd-async-copy-backend=host")
    assert proc.returncode == USAGE_ERROR
    assert "--fd-async-copy-backend given without --fd-async-copy" in proc.stderr


def test_bad_values_are_a_usage_error(tmp_path):
    proc, _ = run_pytest(tmp_path, *ACTIVE, "--fd-async-copy-features=logprobs,bogus")
    assert proc.returncode == USAGE_ERROR
    assert "--fd-async-copy-features" in proc.stderr and "bogus" in proc.stderr


# --- stand-in API: the plugin's own error handling --------------------------------------------------

FAKE = ("-p", "fake_api", "-p", "fd_async_copy", "--fd-async-copy", "--fd-async-copy-backend=host")


def test_failed_features_are_shown_with_their_reason(tmp_path):
    proc, _ = run_pytest(tmp_path, *FAKE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fd-async-copy features: logprobs=failed, stop_flag=applied" in proc.stdout
    assert "  logprobs: failed (boom: target missing)" in proc.stdout
    assert fake_api_calls(tmp_path) == [["enable", ALL_FEATURES, "host", False, "fastdeploy"], ["disable"]]


def test_strict_stops_the_session_when_a_feature_is_not_applied(tmp_path):
    proc, facts = run_pytest(tmp_path, *FAKE, "--fd-async-copy-strict")
    assert proc.returncode == USAGE_ERROR
    assert "feature(s) not applied: logprobs: failed (boom: target missing)" in proc.stderr
    assert facts is None  # no test module was imported
    assert fake_api_calls(tmp_path) == [["enable", ALL_FEATURES, "host", True, "fastdeploy"], ["disable"]]


def test_an_enable_that_raises_stops_the_session(tmp_path):
    proc, facts = run_pytest(tmp_path, *FAKE, env={"FAKE_API_RAISES": "1"})
    assert proc.returncode == USAGE_ERROR
    assert "RuntimeError: no FastDeploy here" in proc.stderr
    assert facts is None


# --- first contact: what the user set is what the errors name; help and summary a user can read ---


def test_features_help_lists_every_feature(tmp_path):
    from fd_async_copy_plugin.registry.catalog import feature_catalog

    KNOWN_FEATURES = feature_catalog().names

    proc, _ = run_pytest(tmp_path, "-p", "fd_async_copy", "--help")
    assert proc.returncode == 0, proc.stderr
    help_text = " ".join(proc.stdout.split("--fd-async-copy-features", 1)[1].split("--fd-async-copy-backend")[0].split())
    for name in KNOWN_FEATURES:
        assert name in help_text, (name, help_text)
    assert "opt-in overlap" in help_text


def test_an_invalid_backend_variable_is_named_not_the_flag(tmp_path):
    proc, _ = run_pytest(tmp_path, "-p", "fd_async_copy", "--fd-async-copy", f"--fd-async-copy-root={ROOT}",
                         env={"FD_ASYNC_COPY_BACKEND": "tpu"})
    assert proc.returncode == USAGE_ERROR
    assert "FD_ASYNC_COPY_BACKEND='tpu'" in proc.stderr and "--fd-async-copy-backend" not in proc.stderr
    (tmp_path / "flag").mkdir()
    proc, _ = run_pytest(tmp_path / "flag", *ACTIVE, "--fd-async-copy-backend=tpu")
    assert proc.returncode == USAGE_ERROR and "--fd-async-copy-backend='tpu'" in proc.stderr


@pytest.mark.skipif("_cuda_build()", reason="needs a CPU Paddle build, where the cuda backend cannot start")
def test_strict_errors_name_what_the_user_set(tmp_path):
    cuda = ("-p", "fd_async_copy", "--fd-async-copy", f"--fd-async-copy-root={ROOT}", "--fd-async-copy-backend=cuda")
    (tmp_path / "env").mkdir()
    (tmp_path / "flag").mkdir()
    proc, _ = run_pytest(tmp_path / "env", *cuda, env={"FD_ASYNC_COPY_STRICT": "1"})
    assert proc.returncode == USAGE_ERROR
    assert "ERROR: FD_ASYNC_COPY_STRICT=1: " in proc.stderr and "--fd-async-copy-strict" not in proc.stderr
    proc, _ = run_pytest(tmp_path / "flag", *cuda, "--fd-async-copy-strict")
    assert proc.returncode == USAGE_ERROR
    assert "ERROR: --fd-async-copy-strict: " in proc.stderr and "FD_ASYNC_COPY_STRICT" not in proc.stderr


def test_no_fastdeploy_to_patch_is_a_usage_error_not_a_green_unpatched_run(tmp_path):
    proc, facts = run_pytest(tmp_path, "-p", "fd_async_copy", "--fd-async-copy", "--fd-async-copy-backend=host",
                             "--fd-async-copy-root=no_such_fastdeploy_here")
    assert proc.returncode == USAGE_ERROR, proc.stdout + proc.stderr
    assert "no FastDeploy to patch at root 'no_such_fastdeploy_here'" in proc.stderr and facts is None


def test_header_and_summary_fit_100_columns(tmp_path):
    proc, _ = run_pytest(tmp_path, *ACTIVE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours = [line for line in proc.stdout.splitlines() if line.startswith(("fd-async-copy", "    "))]
    assert ours and max(len(line) for line in ours) <= 100, max(ours, key=len)
