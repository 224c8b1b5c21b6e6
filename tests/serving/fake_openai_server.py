"""A small, real OpenAI-compatible HTTP server on 127.0.0.1 for testing the A/B check.

Standard library only (http.server in a thread, random free port). Generation is a deterministic
toy model: the next token and its logprobs are a hash of the context and the server's model seed,
so two servers with the same seed give bit-identical answers, like two correct FastDeploy builds.
It speaks the parts of FastDeploy's API the check uses: /v1/completions and /v1/chat/completions,
streaming (SSE over chunked transfer encoding) and not, ``logprobs``/``top_logprobs``,
FastDeploy's ``prompt_logprobs`` and ``return_token_ids``, ``stream_options.include_usage``,
/v1/models and /health. A ``Tamper`` makes one request's answer differ in one place.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 512
EOS = 0
TOP = 21  # candidates per position: enough for top_logprobs 20 plus the sampled token

_WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
    "tau upsilon phi chi psi omega river stone bridge cloud market bread honey tower bell map letter"
).split()


def token_text(token_id: int) -> str:
    if token_id == EOS:
        return ""
    word = _WORDS[token_id % len(_WORDS)]
    return f" {word}{token_id // len(_WORDS)}" if token_id >= len(_WORDS) else f" {word}"


def tokenize(text: str) -> list[int]:
    return [1 + zlib.crc32(w.encode()) % (VOCAB - 1) for w in text.split()]


def f32(x: float) -> float:
    """Round to float32 and back, as FastDeploy's fp32 logprobs reach JSON."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def flip_last_bit(x: float) -> float:
    """The next double after/before ``x``: the smallest possible change of a JSON float."""
    (bits,) = struct.unpack("<Q", struct.pack("<d", x))
    return struct.unpack("<d", struct.pack("<Q", bits ^ 1))[0]


def candidates(model_seed: int, context: list[int]) -> tuple[list[int], list[float]]:
    """The toy model: TOP distinct token ids with strictly decreasing fp32 logprobs."""
    digest = hashlib.sha256(f"{model_seed}:{len(context)}:{context[-16:]}".encode()).digest()
    rng = random.Random(digest)
    ids = rng.sample(range(VOCAB), TOP)
    lps, x = [], -rng.random() * 0.7
    for _ in range(TOP):
        lps.append(f32(x))
        x -= 0.05 + rng.random() * 1.5
    return ids, lps


@dataclass(frozen=True)
class Tamper:
    """Change the answer to the request whose prompt contains ``match``.

    kinds: ``token`` (sample the second candidate at ``position``; the rest of the answer follows
    from it), ``logprob_bit`` (flip the last bit of the sampled token's logprob at ``position``),
    ``prompt_logprob_bit`` (flip the last bit of the prompt token's logprob at prompt ``position``),
    ``http_error`` (answer 500). ``occurrences`` (1-based counts of matching requests seen by this
    server) limits it to some of them: a server that answers the same request differently when asked
    again, as a nondeterministic server would.
    """

    match: str
    kind: str
    position: int = 0
    occurrences: tuple[int, ...] | None = None


@dataclass
class Step:
    token: int
    logprob: float
    top: list[tuple[int, float]]


def generate(model_seed: int, prompt_ids: list[int], max_tokens: int, tamper: Tamper | None) -> tuple[list[Step], str]:
    context, steps = list(prompt_ids), []
    for position in range(max_tokens):
        ids, lps = candidates(model_seed, context)
        choice = 1 if tamper and tamper.kind == "token" and tamper.position == position else 0
        logprob = lps[choice]
        if tamper and tamper.kind == "logprob_bit" and tamper.position == position:
            logprob = flip_last_bit(logprob)
        steps.append(Step(ids[choice], logprob, list(zip(ids, lps))))
        context.append(ids[choice])
        if ids[choice] == EOS:
            return steps, "stop"
    return steps, "length"


def prompt_logprobs(model_seed: int, prompt_ids: list[int], k: int, tamper: Tamper | None) -> list:
    """FastDeploy's shape: ``[None, {token_id: {logprob, rank, decoded_token}}, ...]``."""
    out: list = [None]
    for p in range(1, len(prompt_ids)):
        ids, lps = candidates(model_seed, prompt_ids[:p])
        actual = prompt_ids[p]
        if actual in ids:
            rank = ids.index(actual) + 1
            lp = lps[rank - 1]
        else:
            rank = TOP + 1 + actual % 50
            lp = f32(lps[-1] - 1.0 - (actual % 7) * 0.25)
        if tamper and tamper.kind == "prompt_logprob_bit" and tamper.position == p:
            lp = flip_last_bit(lp)
        entry = {str(actual): {"logprob": lp, "rank": rank, "decoded_token": token_text(actual)}}
        for j, (tid, tlp) in enumerate(zip(ids[:k], lps[:k])):
            entry.setdefault(str(tid), {"logprob": tlp, "rank": j + 1, "decoded_token": token_text(tid)})
        out.append(entry)
    return out


def _completion_logprobs(steps: list[Step], k: int, offset: int) -> dict:
    tokens, token_logprobs, top, text_offset = [], [], [], []
    for s in steps:
        tokens.append(token_text(s.token))
        token_logprobs.append(s.logprob)
        top.append({token_text(t): lp for t, lp in s.top[:k]})
        text_offset.append(offset)
        offset += len(token_text(s.token))
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": text_offset}


def _chat_logprobs(steps: list[Step], k: int) -> dict:
    def entry(t, lp):
        text = token_text(t)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    return {"content": [{**entry(s.token, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top[:k]]} for s in steps]}


class FakeOpenAIServer:
    """``with FakeOpenAIServer(...) as server: server.url`` - stops by itself on exit."""

    def __init__(
        self,
        *,
        model_seed: int = 1234,
        model_name: str = "fake-model",
        tamper: Tamper | None = None,
        tokens_per_chunk: int = 1,
        crlf: bool = False,
        comments: bool = False,
        wait_for_in_flight: int = 0,
        port: int = 0,
    ) -> None:
        self.port = port  # 0: a free port chosen by the OS
        self.model_seed = model_seed
        self.model_name = model_name
        self.tamper = tamper
        self.tokens_per_chunk = tokens_per_chunk
        self.crlf = crlf
        self.comments = comments
        # Hold every request until this many are in flight at once (max 5 s): proves concurrency.
        self.wait_for_in_flight = wait_for_in_flight
        self.requests_seen = 0
        self.tamper_matches = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._enough_in_flight = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeOpenAIServer":
        server = self

        class Handler(_Handler):
            fake = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # --- bookkeeping used by the handler ---
    def _enter_request(self) -> None:
        with self._lock:
            self.requests_seen += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.wait_for_in_flight and self.in_flight >= self.wait_for_in_flight:
                self._enough_in_flight.set()
        if self.wait_for_in_flight:
            self._enough_in_flight.wait(timeout=5.0)

    def _leave_request(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def tamper_for(self, prompt_text: str) -> Tamper | None:
        if not self.tamper or self.tamper.match not in prompt_text:
            return None
        with self._lock:
            self.tamper_matches += 1
            seen = self.tamper_matches
        if self.tamper.occurrences is not None and seen not in self.tamper.occurrences:
            return None
        return self.tamper


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeOpenAIServer

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def _send_json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self._leave_once()  # before the body: once the client has read it, it may send its next request
        self.wfile.write(body)

    def _leave_once(self) -> None:
        """A request stops counting as in flight before its last bytes go out - never after the client
        has read them (it may then send its next request before this thread runs again)."""
        if getattr(self, "_in_flight", False):
            self._in_flight = False
            self.fake._leave_request()

    def do_GET(self):
        if self.path == "/health":
            self._send_json(200, {})
        elif self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": self.fake.model_name, "object": "model"}]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        self.fake._enter_request()
        self._in_flight = True
        try:
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            if body.get("model") not in (self.fake.model_name, "default"):
                return self._send_json(404, {"error": {"message": f"model {body.get('model')!r} not served"}})
            self._answer(body, chat=self.path == "/v1/chat/completions")
        finally:
            self._leave_once()

    def _answer(self, body: dict, chat: bool) -> None:
        fake = self.fake
        if chat:
            prompt_text = "\n".join(m["content"] for m in body["messages"])
            prompt_ids = []
            for m in body["messages"]:
                prompt_ids += tokenize(f"<{m['role']}> {m['content']}")
            prompt_ids += tokenize("<assistant>")
            k = body.get("top_logprobs") or 0 if body.get("logprobs") else None
        else:
            prompt_text = body["prompt"]
            prompt_ids = tokenize(prompt_text)
            k = body.get("logprobs")
        tamper = fake.tamper_for(prompt_text)
        if tamper and tamper.kind == "http_error":
            return self._send_json(500, {"error": {"message": "tampered: internal error"}})
        steps, finish = generate(fake.model_seed, prompt_ids, int(body.get("max_tokens") or 16), tamper)
        plp_k = body.get("prompt_logprobs")
        plp = prompt_logprobs(fake.model_seed, prompt_ids, plp_k, tamper) if plp_k is not None else None
        meta = {
            "rti": bool(body.get("return_token_ids")),
            "prompt_ids": prompt_ids,
            "k": k,
            "plp": plp,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(steps), "total_tokens": len(prompt_ids) + len(steps)},
        }
        if body.get("stream"):
            self._stream(body, chat, steps, finish, meta)
        else:
            self._send_json(200, self._full(chat, steps, finish, meta))

    def _envelope(self, chat: bool, choices: list, **extra) -> dict:
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.fake.model_name,
            "choices": choices,
            **extra,
        }

    def _full(self, chat: bool, steps: list[Step], finish: str, meta: dict) -> dict:
        text = "".join(token_text(s.token) for s in steps)
        ids = [s.token for s in steps]
        k = meta["k"]
        if chat:
            message = {"role": "assistant", "content": text}
            if meta["rti"]:
                message.update(prompt_token_ids=meta["prompt_ids"], completion_token_ids=ids)
            choice = {"index": 0, "message": message, "logprobs": _chat_logprobs(steps, k) if k is not None else None}
        else:
            choice = {"index": 0, "text": text, "logprobs": _completion_logprobs(steps, k, 0) if k is not None else None}
            if meta["rti"]:
                choice.update(prompt_token_ids=meta["prompt_ids"], completion_token_ids=ids)
        choice.update(prompt_logprobs=meta["plp"], finish_reason=finish)
        return self._envelope(chat, [choice], usage=meta["usage"])

    def _stream(self, body: dict, chat: bool, steps: list[Step], finish: str, meta: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        nl = "\r\n" if self.fake.crlf else "\n"

        def emit(data: str) -> None:
            event = (f": keep-alive{nl}" if self.fake.comments else "") + f"data: {data}{nl}{nl}"
            raw = event.encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

        k = meta["k"]
        first = {"index": 0, "prompt_logprobs": meta["plp"], "finish_reason": None}
        if chat:
            first["delta"] = {"role": "assistant", "content": ""}
            if meta["rti"]:
                first["delta"]["prompt_token_ids"] = meta["prompt_ids"]
        else:
            first["text"] = ""
            if meta["rti"]:
                first["prompt_token_ids"] = meta["prompt_ids"]
        emit(json.dumps(self._envelope(chat, [first])))
        offset, n = 0, self.fake.tokens_per_chunk
        for start in range(0, len(steps), n):
            part = steps[start : start + n]
            text = "".join(token_text(s.token) for s in part)
            last = start + n >= len(steps)
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "logprobs": _chat_logprobs(part, k) if k is not None else None}
                if meta["rti"]:
                    choice["delta"]["completion_token_ids"] = [s.token for s in part]
            else:
                choice = {"index": 0, "text": text, "logprobs": _completion_logprobs(part, k, offset) if k is not None else None}
                if meta["rti"]:
                    choice["completion_token_ids"] = [s.token for s in part]
            choice["finish_reason"] = finish if last else None
            choice["arrival_time"] = time.time()
            offset += len(text)
            emit(json.dumps(self._envelope(chat, [choice])))
        if (body.get("stream_options") or {}).get("include_usage"):
            emit(json.dumps(self._envelope(chat, [], usage=meta["usage"])))
        self._leave_once()  # the client is done at [DONE]
        emit("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main(argv: list[str] | None = None) -> int:
    """Stand-in for ``python -m fastdeploy.entrypoints.openai.api_server`` in launcher tests: takes
    the same ``--port`` argument (ignores the rest; always binds 127.0.0.1), prints the plugin environment it
    was started with, serves until SIGTERM. ``--fail-start`` exits at once with code 3."""
    import argparse
    import os
    import signal

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-start", action="store_true")
    args, _ = parser.parse_known_args(argv)
    print(" ".join(f"{k}={os.environ.get(k, '<unset>')}" for k in ("FD_PLUGINS", "FD_ASYNC_COPY", "FD_USE_GET_SAVE_OUTPUT_V1")), flush=True)
    if args.fail_start:
        print("refusing to start (--fail-start)", flush=True)
        return 3
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FakeOpenAIServer(port=args.port) as fake:
        print(f"serving on {fake.url}", flush=True)
        stop.wait(timeout=600)  # bounded: a forgotten stand-in ends by itself
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
