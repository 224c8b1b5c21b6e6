"""Request builders shared by the replica tests (imported by module name; not a test file)."""

from __future__ import annotations

from fd_async_copy_plugin.testing.reference import ROOTS
from fd_async_copy_plugin.testing.reference.driver import Request

FD24 = ROOTS["fd24"]
FD25 = ROOTS["fd25"]
EOS = 7


def request(rid: str, prompt, max_tokens: int = 6, **kwargs) -> Request:
    return Request(rid, list(prompt), max_tokens=max_tokens, eos_token_ids=[EOS], **kwargs)


def mixed_logprob_requests() -> list:
    """Five requests asking for 0, 1, 5, 20 and all (-1) top logprobs."""
    return [
        request(f"k{k}", range(1 + i, 12 + i), max_tokens=5 + i, logprobs=k)
        for i, k in enumerate((0, 1, 5, 20, -1))
    ]
