"""``fd-async-copy ab`` arguments, and the server launcher: the FastDeploy command line and the
environment of each side, and the start/health/stop cycle with a stand-in server process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from fd_async_copy_plugin.serving_ab import ABOptions, LaunchOptions, run_ab_launching
from fd_async_copy_plugin.serving_ab.launcher import ServerPorts, ServerStartError, server_command, server_env

HERE = Path(__file__).resolve().parent


def test_fastdeploy_server_command():
    ports = ServerPorts(8180, 8181, 8182, 8183)
    cmd = server_command("/models/Qwen2-0.5B", ports, python="/py", extra_args=["--max-model-len", "4096"])
    assert cmd[:3] == ["/py", "-m", "fastdeploy.entrypoints.openai.api_server"]
    value = lambda flag: cmd[cmd.index(flag) + 1]  # noqa: E731
    assert value("--model") == "/models/Qwen2-0.5B"
    assert (value("--host"), value("--port"), value("--metrics-port")) == ("127.0.0.1", "8180", "8181")
    assert (value("--engine-worker-queue-port"), value("--cache-queue-port")) == ("8182", "8183")
    assert value("--max-logprobs") == "20"
    # logprobs on, prefix caching off: FastDeploy refuses prompt_logprobs otherwise
    assert "--enable-logprob" in cmd and "--no-enable-prefix-caching" in cmd
    assert cmd[-2:] == ["--max-model-len", "4096"]


def test_each_side_gets_the_plugin_only_on_the_candidate():
    env = {"FD_PLUGINS": "other,fd_async_copy", "PATH": "/bin"}
    base = server_env(env, plugin=False)
    candidate = server_env(env, plugin=True)
    assert (base["FD_PLUGINS"], base["FD_ASYNC_COPY"]) == ("other", "0")
    assert (candidate["FD_PLUGINS"], candidate["FD_ASYNC_COPY"]) == ("other,fd_async_copy", "1")
    assert base["FD_USE_GET_SAVE_OUTPUT_V1"] == candidate["FD_USE_GET_SAVE_OUTPUT_V1"] == "1"
    assert env == {"FD_PLUGINS": "other,fd_async_copy", "PATH": "/bin"}  # the caller's env is untouched
    assert "FD_PLUGINS" not in server_env({}, plugin=False)
    assert server_env({}, plugin=True)["FD_PLUGINS"] == "fd_async_copy"
    assert server_env({"FD_USE_GET_SAVE_OUTPUT_V1": "0"}, plugin=True)["FD_USE_GET_SAVE_OUTPUT_V1"] == "0"
    assert "FD_USE_GET_SAVE_OUTPUT_V1" not in server_env({}, plugin=True, prompt_logprobs=False)


def test_picked_ports_are_distinct():
    ports = ServerPorts.pick()
    assert len({ports.http, ports.metrics, ports.engine_worker_queue, ports.cache_queue}) == 4


def _stand_in_launch(tmp_path, *server_args):
    return LaunchOptions(
        model_path="/unused/model",
        python=sys.executable,
        server_args=server_args,
        log_dir=tmp_path / "logs",
        start_timeout=60.0,
        health_poll_s=0.1,
        server_module="fake_openai_server",  # a stand-in for fastdeploy.entrypoints.openai.api_server
    )


def _stand_in_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def test_launching_runs_base_then_candidate_with_their_environments_and_stops_both(tmp_path):
    opts = ABOptions(requests=8, concurrency=2, long_max_tokens=8, warmup=0)
    report = run_ab_launching(_stand_in_launch(tmp_path), opts, _stand_in_env(), log=lambda msg: None)
    assert report.exit_code == 0 and report.comparison.count("identical") == 8
    base_log = (tmp_path / "logs" / "base.log").read_text()
    candidate_log = (tmp_path / "logs" / "candidate.log").read_text()
    assert "FD_PLUGINS=<unset> FD_ASYNC_COPY=0 FD_USE_GET_SAVE_OUTPUT_V1=1" in base_log
    assert "FD_PLUGINS=fd_async_copy FD_ASYNC_COPY=1 FD_USE_GET_SAVE_OUTPUT_V1=1" in candidate_log
    assert base_log.count("serving on") == candidate_log.count("serving on") == 1


def test_a_server_that_dies_at_start_is_reported_with_its_log(tmp_path):
    with pytest.raises(ServerStartError, match="refusing to start"):
        run_ab_launching(_stand_in_launch(tmp_path, "--fail-start"), ABOptions(requests=1), _stand_in_env(),
                         log=lambda msg: None)  # fmt: skip


def test_cli_requires_two_urls_or_a_model_path(run_ab_cli, capsys):
    assert run_ab_cli() == 2
    assert run_ab_cli("--base-url", "http://127.0.0.1:1") == 2
    assert run_ab_cli("--base-url", "http://a:1", "--candidate-url", "http://b:1", "--model-path", "/m") == 2
    assert run_ab_cli("--base-url", "http://a:1", "--candidate-url", "http://b:1", "--concurrency", "0") == 2
    assert "either --base-url and --candidate-url, or --model-path" in capsys.readouterr().err


def test_cli_reports_a_launch_failure_with_exit_code_4(run_ab_cli, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _stand_in_env()["PYTHONPATH"])
    from fd_async_copy_plugin.cli import ab

    monkeypatch.setattr(ab, "launch_options_from_args", lambda args: _stand_in_launch(tmp_path, "--fail-start"))
    assert run_ab_cli("--model-path", "/unused", "--requests", "1") == 4
    assert "base server exited with code 3" in capsys.readouterr().err


def test_the_package_cli_dispatches_ab(capsys, fake_servers):
    from fd_async_copy_plugin.cli import main

    a, b = fake_servers(), fake_servers()
    code = main(["ab", "--base-url", a.url, "--candidate-url", b.url, "--requests", "4", "--max-tokens", "4", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["identical"] == 4


def test_a_launched_server_is_stopped_with_its_whole_process_group(tmp_path):
    from fd_async_copy_plugin.serving_ab.check import launched_server
    from fd_async_copy_plugin.serving_ab.client import get_json

    server = launched_server("base", _stand_in_launch(tmp_path), _stand_in_env(), plugin=False, prompt_logprobs=True)
    with server as url:
        assert get_json(url, "/health")[0] == 200
        pid = server.process.pid
    assert server.process.returncode == 0  # SIGTERM handled: a clean shutdown, not a kill
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_ab_rejects_a_malformed_url_as_a_usage_error(capsys):
    from fd_async_copy_plugin.cli import main

    assert main(["ab", "--base-url", "localhost:8180", "--candidate-url", "http://127.0.0.1:1"]) == 2
    assert "is not an http(s) URL" in capsys.readouterr().err


def test_features_per_side_for_measuring_one_feature():
    """``--base-features all --candidate-features all,overlap``: both sides run the plugin, and the
    A/B measures what ``overlap`` adds (TPOT side by side, outputs compared)."""
    base = server_env({}, plugin=True, features="all", prompt_logprobs=False)
    candidate = server_env({"FD_ASYNC_COPY_FEATURES": "logprobs"}, plugin=True, features="all,overlap",
                           prompt_logprobs=False)
    assert (base["FD_ASYNC_COPY"], base["FD_ASYNC_COPY_FEATURES"]) == ("1", "all")
    assert candidate["FD_ASYNC_COPY_FEATURES"] == "all,overlap" and "FD_USE_GET_SAVE_OUTPUT_V1" not in candidate
    assert "FD_ASYNC_COPY_FEATURES" not in server_env({}, plugin=False, features="all")


def test_features_per_side_are_validated_and_need_launched_servers():
    import subprocess
    import sys

    def ab(*argv):
        return subprocess.run([sys.executable, "-m", "fd_async_copy_plugin.cli", "ab", *argv],
                              capture_output=True, text=True, timeout=120)

    bad = ab("--model-path", "/nonexistent", "--candidate-features", "all,overlapp")
    assert bad.returncode == 2 and "overlapp" in bad.stderr
    urls = ab("--base-url", "http://127.0.0.1:1", "--candidate-url", "http://127.0.0.1:2", "--base-features", "all")
    assert urls.returncode == 2 and "--model-path" in urls.stderr


# --- first contact: only a FastDeploy server is sent requests; nothing left in the cwd unasked ------


class _CountingFileServer:
    """A plain HTTP server (404 for everything, HTML body), counting what it was asked."""

    def __init__(self) -> None:
        import http.server
        import threading

        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                hits.append((self.command, self.path))
                body = b"<html><body>404 Not Found</body></html>"
                self.send_response(404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_ab_refuses_a_server_that_is_not_fastdeploy_before_sending_requests(capsys, fake_servers):
    from fd_async_copy_plugin.cli import main

    plain, fd = _CountingFileServer(), fake_servers()
    try:
        code = main(["ab", "--base-url", fd.url, "--candidate-url", plain.url, "--requests", "2"])
    finally:
        plain.close()
    err = capsys.readouterr().err
    assert code == 4
    assert f"candidate server {plain.url} is not a FastDeploy OpenAI-compatible server" in err
    assert "GET /health answered 404" in err
    assert all(method == "GET" for method, _ in plain.hits), plain.hits  # no request of the set was sent


def test_ab_warns_when_base_and_candidate_are_the_same_server(capsys, fake_servers):
    from fd_async_copy_plugin.cli import main

    server = fake_servers()
    code = main(["ab", "--base-url", server.url, "--candidate-url", server.url + "/", "--requests", "2",
                 "--max-tokens", "4", "--json"])
    assert code == 0
    assert "WARNING: --base-url and --candidate-url are the same server" in capsys.readouterr().err


def test_ab_model_path_keeps_its_logs_out_of_the_current_directory():
    import argparse
    import tempfile

    from fd_async_copy_plugin.cli import ab

    parser = argparse.ArgumentParser(prog="fd-async-copy")
    ab.add_parser(parser.add_subparsers(dest="command", required=True))
    launch = ab.launch_options_from_args(parser.parse_args(["ab", "--model-path", "/m"]))
    assert Path(tempfile.gettempdir()) in launch.log_dir.parents and launch.log_dir.name.startswith("fd-async-copy-ab-logs-")
    launch.log_dir.rmdir()
    asked = ab.launch_options_from_args(parser.parse_args(["ab", "--model-path", "/m", "--server-log-dir", "here"]))
    assert asked.log_dir == Path("here")
