"""The A/B check end to end over real HTTP against loopback fake servers: identical servers pass,
and a single changed token, a single last-bit logprob change or a failed request is flagged."""

from __future__ import annotations

import json
import re

from fake_openai_server import Tamper

from fd_async_copy_plugin.serving_ab import build_request_set

REQUESTS, LONG, CONCURRENCY = 32, 24, 4
COMMON = ("--requests", str(REQUESTS), "--max-tokens", str(LONG), "--concurrency", str(CONCURRENCY), "--warmup", "1")


def ab_json(run_ab_cli, capsys, base, candidate, *extra):
    code = run_ab_cli("--base-url", base.url, "--candidate-url", candidate.url, *COMMON, "--json", *extra)
    return code, json.loads(capsys.readouterr().out)


def pick(predicate):
    """A request of the default set (seed 0) the servers will see; its prompt identifies it."""
    return next(r for r in build_request_set(REQUESTS, 0, long_max_tokens=LONG) if predicate(r))


def test_identical_servers_pass_with_full_coverage(run_ab_cli, capsys, fake_servers):
    base, candidate = fake_servers(), fake_servers()
    code, report = ab_json(run_ab_cli, capsys, base, candidate)
    assert code == 0
    assert report["verdict"] == "identical"
    assert (report["identical"], report["divergent"], report["both_failed"]) == (REQUESTS, 0, 0)
    assert report["model"] == "fake-model"  # taken from /v1/models; the fake rejects other names
    cov = report["coverage"]
    assert cov["token_ids"] == REQUESTS
    assert cov["logprobs_answered"] == cov["logprobs_requested"] == REQUESTS * 3 // 4
    assert cov["prompt_logprobs_answered"] == cov["prompt_logprobs_requested"] == REQUESTS * 3 // 4
    stats = report["stats"]
    assert stats["base"]["output_tokens"] == stats["candidate"]["output_tokens"] > REQUESTS
    assert stats["base"]["failed"] == stats["candidate"]["failed"] == 0
    assert report["ratio_candidate_over_base"]["output_tokens_per_s"] > 0
    assert base.requests_seen == candidate.requests_seen == REQUESTS + 1  # + one warm-up


def test_stream_chunking_and_sse_framing_do_not_count_as_divergence(run_ab_cli, capsys, fake_servers):
    base = fake_servers()
    candidate = fake_servers(tokens_per_chunk=3, crlf=True, comments=True)
    code, report = ab_json(run_ab_cli, capsys, base, candidate)
    assert (code, report["identical"]) == (0, REQUESTS)


def test_requests_are_sent_by_concurrent_clients(run_ab_cli, capsys, fake_servers):
    # Each server holds every request until CONCURRENCY are in flight at once (at most 5 s).
    base = fake_servers(wait_for_in_flight=CONCURRENCY)
    candidate = fake_servers(wait_for_in_flight=CONCURRENCY)
    code, _ = ab_json(run_ab_cli, capsys, base, candidate, "--warmup", "0")
    assert code == 0
    assert base.max_in_flight == candidate.max_in_flight == CONCURRENCY


def test_one_changed_token_in_one_request_is_flagged(run_ab_cli, capsys, fake_servers):
    target = pick(lambda r: r.path.endswith("chat/completions") and r.stream and r.body["max_tokens"] == LONG
                  and r.top_logprobs == 5)
    base, candidate = fake_servers(), fake_servers(tamper=Tamper(target.prompt_text, "token", position=4))
    code = run_ab_cli("--base-url", base.url, "--candidate-url", candidate.url, *COMMON)
    text = capsys.readouterr().out
    assert code == 1
    assert "RESULT: DIVERGENT (31 identical, 1 divergent" in text
    assert target.label in text
    assert "at choices[0].token_ids[4]" in text
    assert "fields that differ: choices[0].token_ids, choices[0].text, choices[0].logprobs" in text


def test_one_logprob_differing_in_its_last_bit_is_flagged(run_ab_cli, capsys, fake_servers):
    target = pick(lambda r: r.path == "/v1/completions" and not r.stream and r.body["max_tokens"] == LONG
                  and r.top_logprobs == 0)
    base, candidate = fake_servers(), fake_servers(tamper=Tamper(target.prompt_text, "logprob_bit", position=2))
    code, report = ab_json(run_ab_cli, capsys, base, candidate)
    assert code == 1
    [div] = report["divergences"]
    assert div["request"] == target.index
    assert div["path"] == "choices[0].logprobs[2].token_logprobs"
    bits = [int(re.search(r"bits 0x([0-9a-f]{16})", div[side]).group(1), 16) for side in ("base", "candidate")]
    assert bits[0] ^ bits[1] == 1  # one bit apart: a tolerance-based comparison would have passed


def test_last_bit_change_in_a_streamed_chat_logprob_is_flagged(run_ab_cli, capsys, fake_servers):
    target = pick(lambda r: r.path.endswith("chat/completions") and r.stream and r.body["max_tokens"] == LONG
                  and r.top_logprobs == 20)
    base, candidate = fake_servers(), fake_servers(tamper=Tamper(target.prompt_text, "logprob_bit", position=7))
    code, report = ab_json(run_ab_cli, capsys, base, candidate)
    assert code == 1
    assert [d["path"] for d in report["divergences"]] == ["choices[0].logprobs[7].logprob"]


def test_last_bit_change_in_a_prompt_logprob_is_flagged(run_ab_cli, capsys, fake_servers):
    target = pick(lambda r: r.body.get("prompt_logprobs") == 5 and r.stream)
    base, candidate = fake_servers(), fake_servers(tamper=Tamper(target.prompt_text, "prompt_logprob_bit", position=2))
    code, report = ab_json(run_ab_cli, capsys, base, candidate)
    assert code == 1
    [div] = report["divergences"]
    assert div["request"] == target.index
    assert div["path"].startswith("choices[0].prompt_logprobs[2].") and div["path"].endswith(".logprob")


def test_request_failing_on_the_candidate_only_is_a_divergence(run_ab_cli, capsys, fake_servers):
    target = pick(lambda r: not r.stream)
    base, candidate = fake_servers(), fake_servers(tamper=Tamper(target.prompt_text, "http_error"))
    code, report = ab_json(run_ab_cli, capsys, base, candidate)
    assert code == 1
    [div] = report["divergences"]
    assert (div["path"], div["base"]) == ("<response>", "'ok'")
    assert div["candidate"].startswith("'HTTP 500")


def test_request_failing_on_both_servers_is_inconclusive(run_ab_cli, capsys, fake_servers):
    target = pick(lambda r: r.stream)
    tamper = Tamper(target.prompt_text, "http_error")
    code, report = ab_json(run_ab_cli, capsys, fake_servers(tamper=tamper), fake_servers(tamper=tamper))
    assert code == 3
    assert (report["verdict"], report["divergent"], report["both_failed"]) == ("inconclusive", 0, 1)
    assert report["both_failed_requests"][0]["request"] == target.index


def test_control_run_exposes_a_base_that_disagrees_with_itself(run_ab_cli, capsys, fake_servers):
    target = pick(lambda r: r.top_logprobs == 5)
    # The base answers this request differently the second time it is asked (the control pass).
    flaky = Tamper(target.prompt_text, "logprob_bit", position=0, occurrences=(2,))
    code, report = ab_json(run_ab_cli, capsys, fake_servers(tamper=flaky), fake_servers(), "--control")
    assert code == 3
    assert (report["verdict"], report["divergent"], report["control"]["divergent"]) == ("inconclusive", 0, 1)


def test_control_run_of_a_deterministic_base_keeps_the_verdict(run_ab_cli, capsys, fake_servers):
    code, report = ab_json(run_ab_cli, capsys, fake_servers(), fake_servers(), "--control")
    assert (code, report["control"]["divergent"]) == (0, 0)
