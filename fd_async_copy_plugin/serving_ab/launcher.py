"""Start a FastDeploy OpenAI-compatible server for one side of the A/B check, and stop it again.

The two sides differ only in their environment: the candidate gets ``FD_PLUGINS`` containing
``fd_async_copy`` and ``FD_ASYNC_COPY=1``, the base gets neither (``fd_async_copy`` removed from
``FD_PLUGINS``, ``FD_ASYNC_COPY=0``). Both get the same command line, with logprobs enabled and
prefix caching off (FastDeploy refuses ``prompt_logprobs`` otherwise), and
``FD_USE_GET_SAVE_OUTPUT_V1=1`` unless the caller's environment sets it. The servers run one after
the other, each with the whole GPU, so their timings are comparable.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .client import ServerURL, get_json

API_SERVER_MODULE = "fastdeploy.entrypoints.openai.api_server"
PLUGIN_ENTRY_POINT = "fd_async_copy"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ServerPorts:
    http: int
    metrics: int
    engine_worker_queue: int
    cache_queue: int

    @classmethod
    def pick(cls, host: str = "127.0.0.1") -> "ServerPorts":
        ports: list[int] = []
        while len(ports) < 4:  # bounded: the OS hands out distinct ephemeral ports almost always
            p = free_port(host)
            if p not in ports:
                ports.append(p)
        return cls(*ports)


def server_command(
    model_path: str,
    ports: ServerPorts,
    *,
    python: str = sys.executable,
    host: str = "127.0.0.1",
    max_logprobs: int = 20,
    extra_args: Sequence[str] = (),
    module: str = API_SERVER_MODULE,
) -> list[str]:
    return [
        python, "-m", module,
        "--model", model_path,
        "--host", host,
        "--port", str(ports.http),
        "--metrics-port", str(ports.metrics),
        "--engine-worker-queue-port", str(ports.engine_worker_queue),
        "--cache-queue-port", str(ports.cache_queue),
        "--enable-logprob",
        "--max-logprobs", str(max_logprobs),
        "--no-enable-prefix-caching",
        *extra_args,
    ]  # fmt: skip


def server_env(base_env: Mapping[str, str], *, plugin: bool, prompt_logprobs: bool = True,
               features: str | None = None) -> dict[str, str]:
    """The environment of one side. FastDeploy splits FD_PLUGINS on "," without stripping spaces.
    ``features``: the side's ``FD_ASYNC_COPY_FEATURES`` (e.g. ``all,overlap``), with the plugin on."""
    env = dict(base_env)
    if plugin and features is not None:
        env["FD_ASYNC_COPY_FEATURES"] = features
    names = [n for n in env.get("FD_PLUGINS", "").split(",") if n and n != PLUGIN_ENTRY_POINT]
    if plugin:
        names.append(PLUGIN_ENTRY_POINT)
    if names:
        env["FD_PLUGINS"] = ",".join(names)
    else:
        env.pop("FD_PLUGINS", None)
    env["FD_ASYNC_COPY"] = "1" if plugin else "0"
    if prompt_logprobs:
        env.setdefault("FD_USE_GET_SAVE_OUTPUT_V1", "1")
    return env


class ServerStartError(RuntimeError):
    pass


class LaunchedServer:
    """``with LaunchedServer(...) as url:`` - the server runs in its own process group, so that
    stopping it also stops the engine and worker processes it spawned."""

    def __init__(
        self,
        name: str,
        command: list[str],
        env: Mapping[str, str],
        url: ServerURL,
        log_path: Path,
        *,
        start_timeout: float = 1200.0,
        stop_timeout: float = 60.0,
        poll_interval: float = 2.0,
    ) -> None:
        self.name = name
        self.command = command
        self.env = dict(env)
        self.url = url
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.poll_interval = poll_interval
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServerURL:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.url

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"{self.name} server exited with code {self.process.returncode} before it was ready; "
                    f"last log lines ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                status, _ = get_json(self.url, "/health", timeout=5.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(self.poll_interval)
        raise ServerStartError(
            f"{self.name} server not healthy after {self.start_timeout:g} s; last log lines ({self.log_path}):\n"
            f"{self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM the group, wait, then SIGKILL whatever is left of it (workers can outlive the server)."""
        if self.process is None:
            return
        pgid = self.process.pid  # start_new_session: the group id is the server's pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10.0
        while _signal_group(pgid, 0) and time.monotonic() < deadline:
            time.sleep(0.5)
        _signal_group(pgid, signal.SIGKILL)
        try:
            self.process.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a zombie leader on some kernels; treat the group as still there
        return True
