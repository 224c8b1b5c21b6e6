"""A/B serving check: the same greedy OpenAI-compatible requests to an unpatched (base) and a
patched (candidate) FastDeploy server; token ids, text and logprobs must be bit-identical.

Modules: ``request_set`` (the seeded requests), ``client`` (stdlib HTTP + SSE, N concurrent
clients), ``transcript`` (an answer reduced to what must match), ``compare`` (exact comparison),
``stats`` (tokens/s, TPOT), ``report`` (verdict, exit code, text/JSON), ``launcher`` (start FD
servers), ``check`` (the whole run). Standard library only.
"""

from .check import ABOptions, LaunchOptions, run_ab, run_ab_launching, run_ab_servers
from .report import EXIT_DIVERGENT, EXIT_IDENTICAL, EXIT_INCONCLUSIVE, ABReport
from .request_set import ABRequest, build_request_set

__all__ = [
    "ABOptions",
    "ABReport",
    "ABRequest",
    "EXIT_DIVERGENT",
    "EXIT_IDENTICAL",
    "EXIT_INCONCLUSIVE",
    "LaunchOptions",
    "build_request_set",
    "run_ab",
    "run_ab_launching",
    "run_ab_servers",
]
