"""The A/B check's parts: SSE parsing, exact comparison, the request set, transcripts, stats, verdict."""

from __future__ import annotations

import io
import itertools
import math

import pytest

from fd_async_copy_plugin.serving_ab.client import RequestResult, ServerRun, ServerURL
from fd_async_copy_plugin.serving_ab.compare import (
    ABSENT,
    BOTH_FAILED,
    DIVERGENT,
    IDENTICAL,
    Comparison,
    Divergence,
    RequestOutcome,
    describe_pair,
    first_difference,
)
from fd_async_copy_plugin.serving_ab.report import ABReport
from fd_async_copy_plugin.serving_ab.request_set import CHAT, COMPLETIONS, build_request_set
from fd_async_copy_plugin.serving_ab.sse import iter_sse_data
from fd_async_copy_plugin.serving_ab.stats import compute_stats, ratios
from fd_async_copy_plugin.serving_ab.transcript import StreamAssembler, Transcript, transcript_from_response


def sse(raw: bytes) -> list[str]:
    return list(iter_sse_data(io.BytesIO(raw).readline))


# --- SSE ------------------------------------------------------------------------------------------


def test_sse_events_end_at_blank_lines_and_multi_line_data_is_joined():
    assert sse(b"data: a\n\ndata: b\ndata: c\n\n") == ["a", "b\nc"]


def test_sse_comments_other_fields_crlf_and_missing_space_are_handled():
    raw = b": keep-alive\r\nevent: message\r\nid: 7\r\ndata:{\"x\":1}\r\n\r\n"
    assert sse(raw) == ['{"x":1}']


def test_sse_stops_at_done_and_keeps_an_unterminated_last_event():
    assert sse(b"data: a\n\ndata: [DONE]\n\ndata: after\n\n") == ["a"]
    assert sse(b"data: a\n\ndata: tail") == ["a", "tail"]


# --- exact comparison ------------------------------------------------------------------------------


def test_floats_compare_bit_for_bit():
    x = -0.1968482881784439
    y = math.nextafter(x, 0.0)
    assert first_difference(x, x) is None
    assert first_difference(x, y) == ("", x, y)
    assert first_difference(0.0, -0.0) is not None
    assert first_difference(float("nan"), float("nan")) is None  # same NaN bits
    assert first_difference(1, 1.0) is not None  # int vs float: a different serialisation
    assert first_difference(True, 1) is not None


def test_difference_paths_name_the_first_leaf_and_length_changes():
    a = {"choices": [{"token_ids": [1, 2, 3], "logprobs": [{"logprob": -1.0}]}]}
    b = {"choices": [{"token_ids": [1, 2], "logprobs": [{"logprob": -1.0, "rank": 1}]}]}
    assert first_difference(a, b) == ("choices[0].token_ids[2]", 3, ABSENT)
    a["choices"][0]["token_ids"] = [1, 2]
    assert first_difference(a, b) == ("choices[0].logprobs[0].rank", ABSENT, 1)


def test_long_strings_are_shown_around_their_first_difference():
    a = "x" * 200 + "BASE" + "y" * 100
    b = "x" * 200 + "CAND" + "y" * 100
    shown_a, shown_b = describe_pair(a, b)
    assert "first difference at char 200" in shown_a
    assert "BASE" in shown_a and "CAND" in shown_b and len(shown_a) < 150


# --- request set -----------------------------------------------------------------------------------


def test_request_set_is_fixed_by_its_seed():
    assert [r.body for r in build_request_set(40, 3)] == [r.body for r in build_request_set(40, 3)]
    assert [r.body for r in build_request_set(40, 3)] != [r.body for r in build_request_set(40, 4)]


def test_every_block_of_32_covers_every_combination_once_and_all_requests_are_greedy():
    requests = build_request_set(64, 0, long_max_tokens=77)
    for block in (requests[:32], requests[32:]):
        combos = {(r.path, r.stream, r.top_logprobs, r.body["max_tokens"]) for r in block}
        assert combos == set(itertools.product((COMPLETIONS, CHAT), (False, True), (None, 0, 5, 20), (1, 77)))
    for r in requests:
        assert (r.body["temperature"], r.body["top_p"], r.body["return_token_ids"]) == (0, 1, True)
        assert r.body.get("stream_options") == ({"include_usage": True} if r.stream else None)
        if r.path == CHAT:
            assert r.body["messages"][-1]["role"] == "user"
            assert ("top_logprobs" in r.body) == (r.body.get("logprobs") is True)
    assert {r.body.get("prompt_logprobs") for r in requests} == {None, 0, 5, 20}


def test_prompt_logprobs_can_be_left_out_and_bad_sizes_are_refused():
    assert all("prompt_logprobs" not in r.body for r in build_request_set(32, 0, prompt_logprobs=False))
    with pytest.raises(ValueError):
        build_request_set(0)
    with pytest.raises(ValueError):
        build_request_set(4, long_max_tokens=1)


def test_server_urls_accept_a_trailing_v1():
    assert str(ServerURL.parse("http://127.0.0.1:8180/v1/")) == "http://127.0.0.1:8180"
    assert str(ServerURL.parse("localhost:9")) == "http://localhost:9"
    with pytest.raises(ValueError):
        ServerURL.parse("ftp://x")


# --- transcripts -----------------------------------------------------------------------------------


def test_streamed_and_whole_completions_reduce_to_the_same_transcript():
    whole = {
        "id": "cmpl-1", "created": 1,
        "choices": [{"index": 0, "text": " a b", "prompt_token_ids": [5, 6], "completion_token_ids": [1, 2],
                     "logprobs": {"tokens": [" a", " b"], "token_logprobs": [-0.5, -0.25],
                                  "top_logprobs": [{" a": -0.5, " c": -2.0}, {" b": -0.25, " d": -3.0}]},
                     "prompt_logprobs": [None, {"6": {"logprob": -1.5, "rank": 2}}], "finish_reason": "length"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 9}},
    }  # fmt: skip
    chunks = [
        {"id": "x", "choices": [{"index": 0, "text": "", "prompt_token_ids": [5, 6],
                                 "prompt_logprobs": [None, {"6": {"logprob": -1.5, "rank": 2}}]}]},
        {"id": "y", "choices": [{"index": 0, "text": " a", "completion_token_ids": [1], "arrival_time": 3.0,
                                 "logprobs": {"tokens": [" a"], "token_logprobs": [-0.5],
                                              "top_logprobs": [{" a": -0.5, " c": -2.0}]}}]},
        {"id": "z", "choices": [{"index": 0, "text": " b", "completion_token_ids": [2], "finish_reason": "length",
                                 "logprobs": {"tokens": [" b"], "token_logprobs": [-0.25],
                                              "top_logprobs": [{" b": -0.25, " d": -3.0}]}}]},
        {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}},
    ]  # fmt: skip
    assembler = StreamAssembler()
    carried = [assembler.add(c) for c in chunks]
    assert carried == [False, True, True, False]  # the first output chunk sets time-to-first-token
    assert assembler.transcript.comparable() == transcript_from_response(whole).comparable()
    entry = transcript_from_response(whole).choices[0].logprobs[1]
    assert entry == {"tokens": " b", "token_logprobs": -0.25, "top_logprobs": [[" b", -0.25], [" d", -3.0]]}


def test_streamed_and_whole_chat_answers_reduce_to_the_same_transcript():
    lp = lambda t, v: {"token": t, "logprob": v, "top_logprobs": [{"token": t, "logprob": v}]}  # noqa: E731
    whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi you", "completion_token_ids": [3, 4]},
                          "logprobs": {"content": [lp("hi", -0.1), lp(" you", -0.2)]}, "finish_reason": "stop"}]}
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "hi", "completion_token_ids": [3]},
                      "logprobs": {"content": [lp("hi", -0.1)]}}]},
        {"choices": [{"index": 0, "delta": {"content": " you", "completion_token_ids": [4]},
                      "logprobs": {"content": [lp(" you", -0.2)]}, "finish_reason": "stop"}]},
    ]  # fmt: skip
    assembler = StreamAssembler()
    for c in chunks:
        assembler.add(c)
    assert assembler.transcript.comparable() == transcript_from_response(whole).comparable()
    assert assembler.transcript.output_tokens == 2  # no usage: counted from the token ids


def test_an_error_event_inside_a_stream_is_recorded():
    assembler = StreamAssembler()
    assembler.add({"error": {"message": "engine died", "code": "400"}})
    assert assembler.transcript.error == "engine died"


# --- stats and verdict -----------------------------------------------------------------------------


def _result(request, *, started, first, finished, tokens, ok=True):
    transcript = Transcript(completion_tokens=tokens)
    return RequestResult(request, transcript if ok else None, 200 if ok else 500, None if ok else "HTTP 500",
                         started, first, finished)  # fmt: skip


def test_throughput_and_time_per_output_token_come_from_the_recorded_times():
    reqs = build_request_set(3, 0)
    run = ServerRun("http://b", 2, started=10.0, finished=12.0, results=[
        _result(reqs[0], started=10.0, first=10.5, finished=11.5, tokens=11),  # TPOT (1.0 s / 10) = 100 ms
        _result(reqs[1], started=10.0, first=None, finished=11.0, tokens=5),   # not streamed: no TPOT
        _result(reqs[2], started=10.0, first=None, finished=12.0, tokens=0, ok=False),
    ])  # fmt: skip
    stats = compute_stats(run)
    assert (stats.requests, stats.failed, stats.output_tokens) == (3, 1, 16)
    assert stats.output_tokens_per_s == pytest.approx(8.0)
    assert stats.tpot_mean_ms == pytest.approx(100.0)
    assert stats.ttft_mean_ms == pytest.approx(500.0)
    faster = compute_stats(ServerRun("http://c", 2, started=0.0, finished=1.0, results=run.results))
    assert ratios(stats, faster)["output_tokens_per_s"] == pytest.approx(2.0)
    assert ratios(stats, faster)["tpot_mean_ms"] == pytest.approx(1.0)


def _report(outcomes, control=None):
    reqs = build_request_set(1, 0)
    run = ServerRun("http://x", 1, started=0.0, finished=1.0,
                    results=[_result(reqs[0], started=0.0, first=None, finished=1.0, tokens=1)])  # fmt: skip
    return ABReport.build(run, run, Comparison(outcomes), model="m", seed=0, control=control)


def test_verdict_and_exit_code():
    (req,) = build_request_set(1, 0)
    same = RequestOutcome(req, IDENTICAL)
    diff = RequestOutcome(req, DIVERGENT, Divergence(req, "choices[0].token_ids[0]", 1, 2))
    both = RequestOutcome(req, BOTH_FAILED, detail="HTTP 400 twice")
    assert (_report([same]).verdict, _report([same]).exit_code) == ("identical", 0)
    assert (_report([same, diff]).verdict, _report([same, diff]).exit_code) == ("divergent", 1)
    assert _report([same, both]).exit_code == 3
    assert _report([]).exit_code == 3  # nothing compared proves nothing
    assert _report([same], control=Comparison([diff])).exit_code == 3
    # the base disagrees with itself on that very request: nothing is proven about the plugin
    assert _report([diff], control=Comparison([diff])).exit_code == 3
    (other,) = [r for r in build_request_set(2, 0) if r.index != req.index][:1]
    stable_diff = RequestOutcome(other, DIVERGENT, Divergence(other, "choices[0].token_ids[0]", 1, 2))
    # a divergence on a request the base answered identically twice is the plugin's
    assert _report([stable_diff], control=Comparison([diff])).exit_code == 1


def test_a_malformed_answer_is_a_failed_request_not_a_crash():
    import http.server
    import threading

    from fd_async_copy_plugin.serving_ab.client import send_request

    class Broken(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'["not", "an", "object"]'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Broken)
    thread = threading.Thread(target=httpd.handle_request, daemon=True)  # exactly one request
    thread.start()
    try:
        request = next(r for r in build_request_set(8, 0) if not r.stream)
        result = send_request(ServerURL("http", "127.0.0.1", httpd.server_address[1]), request, timeout=10)
    finally:
        thread.join(timeout=10)
        httpd.server_close()
    assert not result.ok and result.error.startswith("AttributeError")
