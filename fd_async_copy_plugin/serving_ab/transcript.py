"""A server's answer to one request, reduced to what must be bit-identical between A and B.

Streaming and non-streaming answers reduce to the same ``Transcript``: text and token ids are
concatenated over chunks and logprob entries are appended, so two servers that split a stream
into different chunks still compare equal. Volatile fields (ids, timestamps, arrival times,
cached-token counts) are dropped. Floats are kept as parsed from JSON: a JSON number written with
the shortest round-trip repr (Python, pydantic, orjson all do) parses back to the exact double the
server held, so comparing the parsed floats bit for bit compares the server's values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChoiceTranscript:
    index: int
    text: str = ""
    reasoning: str = ""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    #: One entry per generated token: ``{"token", "logprob", "top_logprobs", ...}`` (chat entries as
    #: sent; completions' parallel lists zipped per token, top-k dicts as ordered [token, logprob] pairs).
    logprobs: list[dict[str, Any]] | None = None
    #: FastDeploy's ``prompt_logprobs`` as sent: ``[None, {token_id: {logprob, rank, decoded_token}}, ...]``.
    prompt_logprobs: Any = None

    def comparable(self) -> dict[str, Any]:
        # Token ids first: the first difference reported is then the first changed token.
        return {
            "token_ids": self.token_ids,
            "text": self.text,
            "reasoning": self.reasoning,
            "prompt_token_ids": self.prompt_token_ids,
            "finish_reason": self.finish_reason,
            "logprobs": self.logprobs,
            "prompt_logprobs": self.prompt_logprobs,
        }

    @property
    def token_count(self) -> int | None:
        if self.token_ids is not None:
            return len(self.token_ids)
        if self.logprobs is not None:
            return len(self.logprobs)
        return None


@dataclass
class Transcript:
    choices: list[ChoiceTranscript] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: An error the server reported inside a 200 response (FastDeploy streams errors as data events).
    error: str | None = None

    def comparable(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "choices": [c.comparable() for c in sorted(self.choices, key=lambda c: c.index)],
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens},
        }

    @property
    def output_tokens(self) -> int:
        """Generated tokens: the server's usage count, else what the transcript itself shows."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return sum(c.token_count or 0 for c in self.choices)

    def choice(self, index: int) -> ChoiceTranscript:
        for c in self.choices:
            if c.index == index:
                return c
        c = ChoiceTranscript(index=index)
        self.choices.append(c)
        return c


def _completion_logprob_entries(logprobs: dict[str, Any]) -> list[dict[str, Any]]:
    """Zip the completions API's parallel lists into one entry per token."""
    columns = {k: v for k, v in logprobs.items() if isinstance(v, list)}
    length = max((len(v) for v in columns.values()), default=0)
    entries = []
    for i in range(length):
        entry: dict[str, Any] = {}
        for name, column in columns.items():
            value = column[i] if i < len(column) else "<missing>"
            if isinstance(value, dict):
                value = [[k, v] for k, v in value.items()]  # keep the server's rank order
            entry[name] = value
        entries.append(entry)
    return entries


def _logprob_entries(logprobs: Any) -> list[dict[str, Any]] | None:
    if not isinstance(logprobs, dict):
        return None
    if "content" in logprobs:  # chat format
        return list(logprobs["content"] or [])
    return _completion_logprob_entries(logprobs)


def _error_of(payload: dict[str, Any]) -> str | None:
    if "error" in payload and payload["error"]:
        err = payload["error"]
        return str(err.get("message", err)) if isinstance(err, dict) else str(err)
    if payload.get("object") == "error":
        return str(payload.get("message", payload))
    return None


def _absorb_choice(choice: ChoiceTranscript, raw: dict[str, Any]) -> bool:
    """Merge one (chunk or full) choice into ``choice``; returns whether it carried output."""
    carried = False
    message = raw.get("message") or raw.get("delta") or {}
    text = raw.get("text")
    if text is None:
        text = message.get("content")
    if text:
        choice.text += text
        carried = True
    reasoning = message.get("reasoning_content") or raw.get("reasoning_content")
    if reasoning:
        choice.reasoning += reasoning
        carried = True
    for source in (raw, message):
        ids = source.get("completion_token_ids")
        if ids is not None:
            choice.token_ids = (choice.token_ids or []) + list(ids)
            carried = carried or bool(ids)
        if source.get("prompt_token_ids") is not None:
            choice.prompt_token_ids = list(source["prompt_token_ids"])
    entries = _logprob_entries(raw.get("logprobs"))
    if entries is not None:
        choice.logprobs = (choice.logprobs or []) + entries
        carried = carried or bool(entries)
    if raw.get("prompt_logprobs") is not None:
        choice.prompt_logprobs = raw["prompt_logprobs"]
    if raw.get("finish_reason") is not None:
        choice.finish_reason = raw["finish_reason"]
    return carried


def _absorb_usage(transcript: Transcript, payload: dict[str, Any]) -> None:
    usage = payload.get("usage")
    if isinstance(usage, dict):
        transcript.prompt_tokens = usage.get("prompt_tokens")
        transcript.completion_tokens = usage.get("completion_tokens")


def transcript_from_response(payload: dict[str, Any]) -> Transcript:
    """A non-streaming response body."""
    transcript = Transcript(error=_error_of(payload))
    for raw in payload.get("choices") or []:
        _absorb_choice(transcript.choice(raw.get("index", 0)), raw)
    _absorb_usage(transcript, payload)
    return transcript


class StreamAssembler:
    """Builds a ``Transcript`` chunk by chunk; ``add`` says whether the chunk carried output."""

    def __init__(self) -> None:
        self.transcript = Transcript()

    def add(self, payload: dict[str, Any]) -> bool:
        error = _error_of(payload)
        if error is not None:
            self.transcript.error = error
            return False
        carried = False
        for raw in payload.get("choices") or []:
            carried = _absorb_choice(self.transcript.choice(raw.get("index", 0)), raw) or carried
        _absorb_usage(self.transcript, payload)
        return carried
