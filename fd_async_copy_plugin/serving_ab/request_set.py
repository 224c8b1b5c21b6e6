"""The fixed, seeded set of OpenAI-compatible requests the A/B check sends to both servers.

Every request is greedy (``temperature`` 0, ``top_p`` 1) so that an unpatched and a patched
FastDeploy must produce the same tokens. With one client (``--concurrency 1``) any difference is the
plugin's; with concurrent clients FastDeploy may batch requests differently from run to run and its
kernels are not batch-invariant, so ``--control`` (the base run twice) tells which requests are
stable enough to judge.
The set covers the output paths the plugin changes: sampled token ids (every request), the stop
flag (``max_tokens`` 1 finishes on the first step, long requests run many decode steps and may stop
on EOS), sampled-token logprobs with top-k 0/5/20, and prompt logprobs (FastDeploy's
``prompt_logprobs`` extension, which needs ``FD_USE_GET_SAVE_OUTPUT_V1=1`` and ``--enable-logprob``
on the server), on both endpoints, streaming and not.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT)
TOP_LOGPROBS = (None, 0, 5, 20)
PROMPT_LOGPROBS = (None, 0, 5, 20)

# A neutral word list for prompts; the model's answer does not matter, only that both servers agree.
_WORDS = (
    "the river carries light over stones while a small boat waits near the old bridge and "
    "children count clouds above the market where bread cheese apples and honey are sold "
    "every morning before the bells of the tower ring seven times for the travellers who "
    "arrive from the northern hills with maps letters stories and questions about weather "
    "numbers music gardens machines rivers mountains libraries oceans forests engines"
).split()

_OPENERS = (
    "Continue the story:",
    "Summarise in one sentence:",
    "List three facts about",
    "Translate into French:",
    "Write a short poem about",
    "Explain step by step:",
    "Answer briefly:",
    "Describe",
)


@dataclass(frozen=True)
class ABRequest:
    """One request of the set: where it goes, the JSON body, and a label for reports."""

    index: int
    path: str
    body: dict[str, Any] = field(hash=False)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def top_logprobs(self) -> int | None:
        if self.path == CHAT:
            return self.body.get("top_logprobs") if self.body.get("logprobs") else None
        return self.body.get("logprobs")

    @property
    def prompt_text(self) -> str:
        if self.path == CHAT:
            return "\n".join(m["content"] for m in self.body["messages"])
        return self.body["prompt"]

    @property
    def label(self) -> str:
        kind = "chat" if self.path == CHAT else "completions"
        mode = "stream" if self.stream else "non-stream"
        lp = self.top_logprobs
        plp = self.body.get("prompt_logprobs")
        return (
            f"#{self.index} {kind} {mode} max_tokens={self.body['max_tokens']} "
            f"logprobs={'-' if lp is None else lp} prompt_logprobs={'-' if plp is None else plp}"
        )


def _prompt(rng: random.Random, max_words: int) -> str:
    n = rng.randint(3, max_words)
    return f"{rng.choice(_OPENERS)} {' '.join(rng.choice(_WORDS) for _ in range(n))}"


def _body(
    path: str,
    prompt: str,
    *,
    model: str,
    stream: bool,
    max_tokens: int,
    top_logprobs: int | None,
    prompt_logprobs: int | None,
    system: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model}
    if path == CHAT:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        body["messages"] = messages
        if top_logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = top_logprobs
    else:
        body["prompt"] = prompt
        if top_logprobs is not None:
            body["logprobs"] = top_logprobs
    body.update(
        temperature=0,
        top_p=1,
        max_tokens=max_tokens,
        stream=stream,
        # FastDeploy extension: also return prompt/completion token ids, compared exactly.
        return_token_ids=True,
    )
    if stream:
        body["stream_options"] = {"include_usage": True}
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    return body


def build_request_set(
    count: int = 64,
    seed: int = 0,
    *,
    model: str = "default",
    long_max_tokens: int = 128,
    max_prompt_words: int = 48,
    prompt_logprobs: bool = True,
) -> list[ABRequest]:
    """``count`` requests, identical for the same arguments.

    Every block of 32 consecutive requests holds each combination of endpoint x streaming x
    top-k (none/0/5/20) x max_tokens (1/long) exactly once, in a seeded order; prompt logprobs
    (none/0/5/20) cycle over the block independently so that they meet every endpoint and mode.
    ``prompt_logprobs=False`` leaves them out (servers started without FD_USE_GET_SAVE_OUTPUT_V1).
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if long_max_tokens < 2:
        raise ValueError(f"long_max_tokens must be >= 2, got {long_max_tokens}")
    rng = random.Random(seed)
    combos = list(itertools.product(ENDPOINTS, (False, True), TOP_LOGPROBS, (1, long_max_tokens)))
    requests: list[ABRequest] = []
    block: list[tuple] = []
    for index in range(count):
        if not block:
            block = combos[:]
            rng.shuffle(block)
        path, stream, top_logprobs, max_tokens = block.pop()
        plp = PROMPT_LOGPROBS[index % len(PROMPT_LOGPROBS)] if prompt_logprobs else None
        system = "You are a concise assistant." if path == CHAT and rng.random() < 0.5 else None
        body = _body(
            path,
            _prompt(rng, max_prompt_words),
            model=model,
            stream=stream,
            max_tokens=max_tokens,
            top_logprobs=top_logprobs,
            prompt_logprobs=plp,
            system=system,
        )
        requests.append(ABRequest(index=index, path=path, body=body))
    return requests


def warmup_requests(count: int, *, model: str = "default") -> list[ABRequest]:
    """Short unscored requests sent before timing starts (first-request compile/capture costs)."""
    return [
        ABRequest(
            index=-1 - i,
            path=COMPLETIONS,
            body=_body(
                COMPLETIONS,
                f"Warm up {i}",
                model=model,
                stream=False,
                max_tokens=8,
                top_logprobs=None,
                prompt_logprobs=None,
                system=None,
            ),
        )
        for i in range(count)
    ]
