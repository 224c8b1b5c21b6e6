"""A small stdlib HTTP client for OpenAI-compatible servers: one request, or a request set with N
concurrent clients, timed per request (latency, time to first token).

It never raises for a failed request: transport errors, HTTP errors and errors streamed inside a
200 response are recorded on the ``RequestResult`` so that the comparison can report them.
"""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .request_set import ABRequest
from .sse import iter_sse_data
from .transcript import StreamAssembler, Transcript, transcript_from_response


@dataclass(frozen=True)
class ServerURL:
    """``http[s]://host:port[/prefix]``; a trailing ``/v1`` is accepted and dropped."""

    scheme: str
    host: str
    port: int
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> "ServerURL":
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) server URL: {url!r}")
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[: -len("/v1")]
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, prefix)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)


@dataclass
class RequestResult:
    request: ABRequest
    transcript: Transcript | None = None
    status: int | None = None
    #: Why there is no usable transcript (transport error, HTTP status, or an error event/body).
    error: str | None = None
    started: float = 0.0
    first_output: float | None = None
    finished: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.transcript is not None

    @property
    def latency(self) -> float:
        return self.finished - self.started

    @property
    def ttft(self) -> float | None:
        return None if self.first_output is None else self.first_output - self.started

    @property
    def output_tokens(self) -> int:
        return self.transcript.output_tokens if self.transcript is not None else 0

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (streamed requests with 2+ tokens only)."""
        n = self.output_tokens
        if self.first_output is None or n < 2:
            return None
        return (self.finished - self.first_output) / (n - 1)


@dataclass
class ServerRun:
    """One pass of a request set over one server."""

    url: str
    concurrency: int
    results: list[RequestResult] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.finished - self.started


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def send_request(server: ServerURL, request: ABRequest, *, timeout: float = 300.0, api_key: str | None = None) -> RequestResult:
    """Send one request and read the whole answer (``timeout`` bounds the request as a whole)."""
    result = RequestResult(request=request, started=time.perf_counter())
    deadline = result.started + timeout
    conn = server.connect(timeout)
    try:
        conn.request("POST", server.prefix + request.path, body=json.dumps(request.body), headers=_headers(api_key))
        resp = conn.getresponse()
        result.status = resp.status
        if resp.status != 200:
            body = resp.read(2000).decode("utf-8", "replace")
            result.error = f"HTTP {resp.status}: {body.strip()}"
            return result
        if request.stream:
            assembler = StreamAssembler()
            for data in iter_sse_data(resp.readline):
                if assembler.add(json.loads(data)) and result.first_output is None:
                    result.first_output = time.perf_counter()
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"stream still open after {timeout:g} s")
            result.transcript = assembler.transcript
        else:
            result.transcript = transcript_from_response(json.loads(resp.read()))
        if result.transcript.error is not None:
            result.error = f"server error: {result.transcript.error}"
    except Exception as exc:  # transport error, bad JSON, a malformed answer: a failed request, reported
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.finished = time.perf_counter()
        conn.close()
    return result


def run_request_set(
    server: ServerURL,
    requests: list[ABRequest],
    *,
    concurrency: int = 1,
    timeout: float = 300.0,
    api_key: str | None = None,
) -> ServerRun:
    """Send every request with ``concurrency`` clients at once; results keep the request order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    run = ServerRun(url=str(server), concurrency=concurrency, started=time.perf_counter())
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fd-ab-client") as pool:
        run.results = list(pool.map(lambda r: send_request(server, r, timeout=timeout, api_key=api_key), requests))
    run.finished = time.perf_counter()
    return run


def get_json(server: ServerURL, path: str, *, timeout: float = 10.0, api_key: str | None = None):
    """GET ``path``; returns (status, parsed JSON or None). Raises OSError if unreachable."""
    conn = server.connect(timeout)
    try:
        conn.request("GET", server.prefix + path, headers=_headers(api_key))
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, None
    finally:
        conn.close()


def served_model_name(server: ServerURL, *, api_key: str | None = None) -> str | None:
    """The first model id from ``/v1/models``, or None if the server does not say."""
    try:
        status, payload = get_json(server, "/v1/models", api_key=api_key)
    except (OSError, http.client.HTTPException):
        return None
    if status != 200 or not isinstance(payload, dict):
        return None
    models = payload.get("data") or []
    return models[0].get("id") if models and isinstance(models[0], dict) else None
