"""The A/B check itself: send the same request set to the base and the candidate server (one after
the other, so they never compete for the GPU), compare, and build the report."""

from __future__ import annotations

import http.client
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

from .client import ServerRun, ServerURL, get_json, run_request_set, served_model_name
from .compare import compare_runs
from .launcher import API_SERVER_MODULE, LaunchedServer, ServerPorts, ServerStartError, server_command, server_env
from .report import ABReport
from .request_set import ABRequest, build_request_set, warmup_requests


@dataclass
class ABOptions:
    requests: int = 64
    seed: int = 0
    concurrency: int = 8
    model: str | None = None
    long_max_tokens: int = 128
    prompt_logprobs: bool = True
    timeout: float = 300.0
    warmup: int = 2
    #: Run the base set twice and compare base with itself: shows whether exact equality can be
    #: expected at this concurrency at all (batch composition can change floating-point results).
    control: bool = False
    api_key: str | None = None


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run_side(name: str, url: ServerURL, requests: list[ABRequest], opts: ABOptions, log) -> ServerRun:
    if opts.warmup:
        warm = run_request_set(
            url, warmup_requests(opts.warmup, model=requests[0].body["model"]), timeout=opts.timeout, api_key=opts.api_key
        )
        failed = [r.error for r in warm.results if not r.ok]
        if failed:
            log(f"{name}: warm-up request failed: {failed[0]}")
    log(f"{name}: {len(requests)} requests to {url} with {opts.concurrency} concurrent clients ...")
    run = run_request_set(url, requests, concurrency=opts.concurrency, timeout=opts.timeout, api_key=opts.api_key)
    failed = sum(1 for r in run.results if not r.ok)
    log(f"{name}: done in {run.wall_s:.1f} s" + (f", {failed} failed" if failed else ""))
    return run


def run_ab_servers(
    base: Callable[[], ContextManager[ServerURL]],
    candidate: Callable[[], ContextManager[ServerURL]],
    opts: ABOptions,
    log: Callable[[str], None] = _stderr,
) -> ABReport:
    """Core of the check; ``base``/``candidate`` open a server (already running or launched)."""
    notes: list[str] = []
    with base() as base_url:
        model = opts.model or served_model_name(base_url, api_key=opts.api_key) or "default"
        requests = build_request_set(
            opts.requests,
            opts.seed,
            model=model,
            long_max_tokens=opts.long_max_tokens,
            prompt_logprobs=opts.prompt_logprobs,
        )
        base_run = _run_side("base", base_url, requests, opts, log)
        control_run = _run_side("base (control)", base_url, requests, opts, log) if opts.control else None
    with candidate() as candidate_url:
        candidate_run = _run_side("candidate", candidate_url, requests, opts, log)
    if not opts.prompt_logprobs:
        notes.append("prompt logprobs were not requested (--no-prompt-logprobs)")
    return ABReport.build(
        base_run,
        candidate_run,
        compare_runs(base_run, candidate_run),
        model=model,
        seed=opts.seed,
        control=compare_runs(base_run, control_run) if control_run is not None else None,
        notes=notes,
    )


class _Running:
    """A server that is already up: opening it just yields its URL."""

    def __init__(self, url: ServerURL) -> None:
        self.url = url

    def __enter__(self) -> ServerURL:
        return self.url

    def __exit__(self, *exc) -> None:
        return None


class ServerUnreachable(ServerStartError):
    """A server given by URL does not answer: nothing was sent to either server."""


def check_reachable(servers: dict[str, ServerURL], timeout: float = 10.0, api_key: str | None = None) -> None:
    """Raise ``ServerUnreachable`` naming every server that does not answer as a FastDeploy
    OpenAI-compatible server - ``GET /health`` 200 and ``GET /v1/models`` 200 with an OpenAI model
    list - before a single request of the set is sent (any other HTTP server is refused)."""
    down = []
    for name, url in servers.items():
        try:
            problem = not_fastdeploy(url, timeout, api_key)
        except (OSError, http.client.HTTPException) as exc:
            down.append(f"{name} server {url} is not reachable ({type(exc).__name__}: {exc})")
            continue
        if problem:
            down.append(f"{name} server {url} is not a FastDeploy OpenAI-compatible server ({problem})")
    if down:
        raise ServerUnreachable("; ".join(down) + "; start it, or check --base-url/--candidate-url")


def not_fastdeploy(url: ServerURL, timeout: float, api_key: str | None) -> str:
    """Why ``url`` does not look like FastDeploy's api_server, or "" (raises OSError if unreachable).

    FastDeploy's ``fastdeploy/entrypoints/openai/api_server.py``: ``GET /health`` answers 200 when
    healthy, 404 while the engine is not, 304 while its workers are not alive; ``GET /v1/models``
    answers a ``ModelList`` (``{"object": "list", "data": [...]}``)."""
    status, _ = get_json(url, "/health", timeout=timeout, api_key=api_key)
    if status in (304, 404):
        return (f"GET /health answered {status}, expected 200 (FastDeploy answers {status} while its "
                f"{'workers are' if status == 304 else 'engine is'} not ready; a plain web server answers 404)")
    if status != 200:
        return f"GET /health answered {status}, expected 200"
    status, payload = get_json(url, "/v1/models", timeout=timeout, api_key=api_key)
    if status != 200:
        return f"GET /v1/models answered {status}, expected 200"
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return "GET /v1/models did not answer an OpenAI model list ({\"object\": \"list\", \"data\": [...]})"
    return ""


def same_server(base: ServerURL, candidate: ServerURL) -> bool:
    return str(base).rstrip("/").lower() == str(candidate).rstrip("/").lower()


def run_ab(base_url: str, candidate_url: str, opts: ABOptions, log: Callable[[str], None] = _stderr) -> ABReport:
    """A/B against two running servers (both checked to answer before anything is sent)."""
    base, candidate = ServerURL.parse(base_url), ServerURL.parse(candidate_url)
    if same_server(base, candidate):
        log(f"WARNING: --base-url and --candidate-url are the same server ({base}): this compares the "
            "server with itself, not FastDeploy without the plugin with FastDeploy with it")
    check_reachable({"base": base, "candidate": candidate}, api_key=opts.api_key)
    return run_ab_servers(lambda: _Running(base), lambda: _Running(candidate), opts, log)


@dataclass
class LaunchOptions:
    model_path: str
    python: str = sys.executable
    server_args: tuple[str, ...] = ()
    log_dir: Path = Path("fd-async-copy-ab-logs")
    start_timeout: float = 1200.0
    health_poll_s: float = 2.0
    #: The server module run with ``python -m`` (tests substitute a stand-in).
    server_module: str = API_SERVER_MODULE
    #: None: the base runs without the plugin; else with it and these FD_ASYNC_COPY_FEATURES (e.g.
    #: ``all`` against a candidate with ``all,overlap``: what one feature adds)
    base_features: str | None = None
    #: the candidate's FD_ASYNC_COPY_FEATURES (None: the caller's environment, else the default)
    candidate_features: str | None = None


def launched_server(side: str, launch: LaunchOptions, env, *, plugin: bool, prompt_logprobs: bool,
                    features: str | None = None) -> LaunchedServer:
    ports = ServerPorts.pick()
    return LaunchedServer(
        side,
        server_command(
            launch.model_path, ports, python=launch.python, extra_args=launch.server_args, module=launch.server_module
        ),
        server_env(env, plugin=plugin, prompt_logprobs=prompt_logprobs, features=features),
        ServerURL("http", "127.0.0.1", ports.http),
        launch.log_dir / f"{side}.log",
        start_timeout=launch.start_timeout,
        poll_interval=launch.health_poll_s,
    )


def run_ab_launching(launch: LaunchOptions, opts: ABOptions, env, log: Callable[[str], None] = _stderr) -> ABReport:
    """Start the base server, run, stop it; then the same for the candidate (plugin on)."""

    def base():
        with_plugin = launch.base_features is not None
        what = f"plugin on, features {launch.base_features}" if with_plugin else "plugin off"
        log(f"starting base server ({what}), log in {launch.log_dir / 'base.log'} ...")
        return launched_server("base", launch, env, plugin=with_plugin, prompt_logprobs=opts.prompt_logprobs,
                               features=launch.base_features)

    def candidate():
        log(f"starting candidate server (plugin on), log in {launch.log_dir / 'candidate.log'} ...")
        return launched_server("candidate", launch, env, plugin=True, prompt_logprobs=opts.prompt_logprobs,
                               features=launch.candidate_features)

    return run_ab_servers(base, candidate, opts, log)
