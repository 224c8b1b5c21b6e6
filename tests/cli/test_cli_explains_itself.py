"""First contact, round 3: a CLI that says which build it is, which backend it would use and why,
what every feature would do, how far a long command has got, and never exits 0 on a missed target.
Commands run in subprocesses as a user runs them; Paddle is hidden as in test_first_contact."""

from __future__ import annotations

import json
import os
import re
import tomllib
import zipfile

import pytest

from test_first_contact import BLOCK_PADDLE, REPO, cli, run  # noqa: F401


@pytest.fixture(scope="module")
def no_paddle(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("no_paddle_round3")
    (folder / "sitecustomize.py").write_text(BLOCK_PADDLE)
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def _cpu_paddle() -> bool:
    import paddle

    return not paddle.is_compiled_with_cuda()


# --- versions ----------------------------------------------------------------------------------


def test_version_names_the_package_version_and_the_checkout():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"fd-async-copy {re.escape(version)} \((git \S+|built from git \S+|build commit unknown: "
                        r"built without git)\)\n", done.stdout), done.stdout
    if (REPO / ".git").exists():
        assert "(git " in done.stdout


def test_version_is_bumped_past_the_first_release_with_a_licence_and_authors():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert tuple(int(p) for p in project["version"].split(".")) >= (0, 2, 0)
    import fd_async_copy_plugin

    assert fd_async_copy_plugin.__version__ == project["version"]  # the package says the same
    assert project["license-files"] == ["LICENSE"] and project["authors"][0]["name"]
    licence = (REPO / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence


def test_the_wheel_carries_the_licence(checkout_wheel):
    wheel = checkout_wheel
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        licences = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
        assert licences, names
        assert "Apache License" in archive.read(licences[0]).decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Author: fd-async-copy-plugin developers" in metadata or "fd-async-copy-plugin developers" in metadata


# --- doctor ------------------------------------------------------------------------------------


def _doctor_json(env=None) -> dict:
    done = cli("doctor", "--json", env=env)
    return json.loads(done.stdout)


@pytest.mark.skipif("not _cpu_paddle()", reason="a CPU Paddle build: auto cannot use cuda")
def test_doctor_shows_the_backend_enable_would_use_and_why():
    report = _doctor_json()
    assert report["backend"] == "none"
    assert "needs CUDA" in report["backend_reason"] and "FD_ASYNC_COPY_BACKEND=host" in report["backend_reason"]
    bad = _doctor_json({"FD_ASYNC_COPY_BACKEND": "tpu"})
    assert bad["backend"] == "none" and "FD_ASYNC_COPY_BACKEND='tpu' is invalid" in bad["backend_reason"]
    host = _doctor_json({"FD_ASYNC_COPY_BACKEND": "host"})
    assert host["backend"] == "host" and "synchronous host copies" in host["backend_reason"]
    text = cli("doctor").stdout
    assert re.search(r"^  backend\s+none - backend 'auto' needs CUDA", text, re.M), text


def test_doctor_without_paddle_shows_no_backend_and_the_paddle_to_install(no_paddle):
    report = _doctor_json(no_paddle)
    assert report["backend"] == "none" and "Paddle is not importable" in report["backend_reason"]


def test_doctor_says_same_reason_only_under_the_same_reason():
    from fd_async_copy_plugin.cli.doctor import format_report

    report = _doctor_json()
    report["features"] = {
        "stop_flag": {"state": "skipped", "reason": "A"},
        "sampled_tokens": {"state": "skipped", "reason": "needs stop_flag, which is skipped: A"},
        "sync_scope": {"state": "skipped", "reason": "A"},
        "step_syncs": {"state": "skipped", "reason": "A"},
    }
    rows = {line.split()[0]: line for line in format_report(report).split("  features\n")[1].splitlines()}
    assert rows["sync_scope"].endswith(" A")  # differs from the line above it
    assert rows["step_syncs"].endswith("(same reason as above)")


def test_doctor_json_lists_every_feature_with_the_opt_in_overlap_explained():
    from fd_async_copy_plugin.registry.catalog import feature_catalog

    KNOWN_FEATURES = feature_catalog().names

    report = _doctor_json()
    assert set(report["features"]) == set(KNOWN_FEATURES)
    overlap = report["features"]["overlap"]
    assert overlap["state"] == "not requested"
    assert "opt-in: FD_ASYNC_COPY_FEATURES=all,overlap" in overlap["reason"] and "If requested: " in overlap["reason"]
    only = _doctor_json({"FD_ASYNC_COPY_FEATURES": "logprobs"})
    assert only["features"]["stop_flag"]["state"] == "not requested"
    assert "add it to request it" in only["features"]["stop_flag"]["reason"]


def test_a_bad_option_shows_the_commands_own_usage():
    done = cli("doctor", "--bogus")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: fd-async-copy doctor") and "unrecognized arguments: --bogus" in done.stderr


def test_no_ccache_warning_from_the_plugins_own_imports():
    done = cli("doctor")
    assert "No ccache found" not in done.stderr, done.stderr


# --- long commands show progress; bench judges its target ---------------------------------------


def test_selftest_shows_each_workload_as_it_finishes_and_records_its_build(tmp_path):
    done = cli("selftest", "--steps", "4", "--backend", "host", "--allow-skip", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    progress = [line for line in done.stderr.splitlines() if line.startswith("selftest [")]
    assert len(progress) == len(report["scenarios"]) and progress[0].startswith("selftest [ 1/")
    assert all(line.endswith((" ok", " not compared")) for line in progress), progress
    assert report["versions"]["fd_async_copy_plugin"] and "git_describe" in report["versions"]
    assert "To copy construct from a tensor" not in done.stderr and "No ccache found" not in done.stderr


def test_build_ops_says_what_it_is_compiling(tmp_path, monkeypatch):
    from fd_async_copy_plugin.ops import build

    def no_compiler(command, cwd, verbose, what):
        raise build.BuildError(f"{what} stopped by the test")

    monkeypatch.setenv("FD_ASYNC_COPY_OPS_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_run", no_compiler)
    said = []
    with pytest.raises(build.BuildError):
        build.build_ops(cuda=False, progress=said.append)
    assert said and said[0].startswith("compiling fd_async_copy_ops.so") and "paddle.utils.cpp_extension" in said[0]


def test_bench_verdict_and_exit_code_follow_the_target(monkeypatch, capsys):
    from fd_async_copy_plugin.cli import bench

    assert bench.verdict(1.2, smoke=False) == (bench.verdict(1.2, smoke=False)[0], False)
    assert "target NOT met (1.200 > 1.05" in bench.verdict(1.2, smoke=False)[0]
    assert bench.verdict(0.99, smoke=False)[1] and "not judged" in bench.verdict(9.0, smoke=True)[0]
    monkeypatch.setattr(bench, "verdict", lambda ratio, smoke: ("verdict: target NOT met (planted)", False))

    class Args:
        batch, top_k, vocab, steps, repeats, smoke, json = 16, 20, 512, 12, 2, True, False

    assert bench.run(Args()) == 1
    out = capsys.readouterr()
    assert "verdict: target NOT met (planted)" in out.out
    assert "timing: round 1/2 done" in out.err


def test_bench_explains_its_columns_wait_codes_and_step_counts():
    done = cli("bench", "--smoke")
    assert done.returncode == 0, done.stderr[-2000:]
    text = done.stdout
    assert "blk D2H blocking device->host copies" in text and "rd>wait yes" in text
    for code in ("S1 token count", "S2 bad_tokens_len", "S3/S7 exist_prefill", "T the CPU infer_seed", "S5 ", "L1-3 "):
        assert code in text, code
    assert "timed: the decode steps of every round after the first 3 of each run" in text
    assert re.search(r"^host time per decode step .* timed$", text, re.M)
    assert "verdict: not judged (--smoke" in text
    assert all(len(line) <= 100 for line in text.splitlines()), max(text.splitlines(), key=len)


def test_bench_json_records_versions_and_the_verdict():
    done = cli("bench", "--smoke", "--json")
    report = json.loads(done.stdout)
    assert report["versions"]["fd_async_copy_plugin"] and report["versions"]["paddle"]
    assert report["target_met"] is True and report["verdict"].startswith("verdict: not judged")


@pytest.mark.parametrize("command", ["selftest", "bench"])
def test_json_without_paddle_is_a_json_error_object(no_paddle, command):
    done = cli(command, "--json", env=no_paddle)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["command"] == command
    assert "Paddle is not importable" in report["error"] and report["versions"]["fd_async_copy_plugin"]


# --- build-ops -----------------------------------------------------------------------------------


def test_build_ops_rejects_no_cuda_with_require_cuda():
    done = cli("build-ops", "--no-cuda", "--require-cuda")
    assert done.returncode == 2 and "--no-cuda and --require-cuda contradict each other" in done.stderr


def test_build_ops_names_a_cuda_home_without_nvcc():
    done = cli("build-ops", env={"CUDA_HOME": "/nonexistent"})
    assert "CUDA_HOME='/nonexistent' has no executable bin/nvcc" in done.stderr, done.stderr
    from fd_async_copy_plugin.ops.cache import find_nvcc

    saved = {k: os.environ.get(k) for k in ("CUDA_HOME", "PATH")}
    try:
        os.environ.update(CUDA_HOME="/nonexistent", PATH="/nonexistent-bin")
        nvcc, why = find_nvcc()
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    if nvcc is None:
        assert "CUDA_HOME='/nonexistent' has no executable bin/nvcc" in why
    else:  # /usr/local/cuda exists here: used, and the ignored CUDA_HOME is named
        assert "CUDA_HOME='/nonexistent'" in why


def test_after_a_failed_build_the_advice_is_not_to_run_build_ops_again():
    from fd_async_copy_plugin.cli.build_ops import _after_failure

    text = "custom ops unavailable: fd_async_copy_ops.so is not built in /x; run `fd-async-copy build-ops`"
    assert "fix the error above" in _after_failure(text, failed=True)
    assert "run `fd-async-copy build-ops`" not in _after_failure(text, failed=True)
    assert _after_failure(text, failed=False) == text


def test_a_failed_build_does_not_send_the_user_in_a_circle(tmp_path):
    done = cli("build-ops", "--no-cuda", env={"CXX": "/bin/false", "CC": "/bin/false",
                                              "FD_ASYNC_COPY_OPS_DIR": str(tmp_path)})
    assert done.returncode == 1
    after = done.stdout.split("FAILED", 1)[1].split("\n", 1)[1]
    assert "run `fd-async-copy build-ops`" not in after, after


def test_build_ops_clean_removes_folders_of_deleted_paddles_only(tmp_path):
    cache = tmp_path / "fd_async_copy"
    gone, kept = cache / "paddle-0-cp311-gone", cache / "paddle-0-cp311-kept"
    for folder, location in ((gone, tmp_path / "deleted-venv" / "paddle"), (kept, REPO)):
        folder.mkdir(parents=True)
        manifest = {"fingerprint": {"paddle_build": f"abc@{location}"}}
        (folder / "fd_async_copy_ops.so.build.json").write_text(json.dumps(manifest))
    done = cli("build-ops", "--clean", "--json", env={"XDG_CACHE_HOME": str(tmp_path)})
    report = json.loads(done.stdout)
    assert report["removed"] == [str(gone)] and not gone.exists() and kept.exists()
    assert f"removed {gone}" in done.stderr


def test_build_ops_without_paddle_prints_no_empty_state(no_paddle):
    done = cli("build-ops", env=no_paddle)
    assert done.returncode == 1
    assert "ops dir: None" not in done.stdout and "usable: False ()" not in done.stdout
    (line,) = done.stdout.strip().splitlines()
    assert line.startswith("build-ops FAILED: Paddle is not importable") and "paddlepaddle-gpu" in line
