"""Exact comparison of two runs of the same request set.

"Exact" means: token ids and text equal, and every float (logprobs, prompt logprobs) equal bit for
bit - ``-0.0`` differs from ``0.0``, a NaN equals only a NaN with the same payload, and the
smallest possible change (one unit in the last place) is a divergence. An int and a float that are
numerically equal (``1`` vs ``1.0``) differ too: the servers serialised different types.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Iterator

from .client import RequestResult, ServerRun
from .request_set import ABRequest

ABSENT = "<absent>"

IDENTICAL = "identical"
DIVERGENT = "divergent"
BOTH_FAILED = "both_failed"


def float_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _same_scalar(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return float_bits(a) == float_bits(b)
    return a == b


def iter_differences(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Yield ``(path, a_value, b_value)`` for every leaf where ``a`` and ``b`` differ, in order."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in b:
                yield sub, a[key], ABSENT
            elif key not in a:
                yield sub, ABSENT, b[key]
            else:
                yield from iter_differences(a[key], b[key], sub)
        return
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from iter_differences(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            n = min(len(a), len(b))
            yield (
                f"{path}[{n}]",
                a[n] if n < len(a) else ABSENT,
                b[n] if n < len(b) else ABSENT,
            )
        return
    if not _same_scalar(a, b):
        yield path, a, b


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    return next(iter_differences(a, b, path), None)


@dataclass
class Divergence:
    """The first difference of one request, plus which top-level fields differ at all."""

    request: ABRequest
    path: str
    base: Any
    candidate: Any
    fields: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request.index,
            "label": self.request.label,
            "path": self.path,
            "base": describe_pair(self.base, self.candidate)[0],
            "candidate": describe_pair(self.base, self.candidate)[1],
            "fields": self.fields,
        }


@dataclass
class RequestOutcome:
    request: ABRequest
    verdict: str  # IDENTICAL, DIVERGENT or BOTH_FAILED
    divergence: Divergence | None = None
    detail: str = ""


@dataclass
class Comparison:
    outcomes: list[RequestOutcome]

    @property
    def divergences(self) -> list[Divergence]:
        return [o.divergence for o in self.outcomes if o.divergence is not None]

    def count(self, verdict: str) -> int:
        return sum(1 for o in self.outcomes if o.verdict == verdict)


def _field_name(path: str) -> str:
    """``choices[0].logprobs[3].logprob`` -> ``choices[0].logprobs``; ``usage.x`` -> ``usage``."""
    parts = path.split(".")
    if parts[0].startswith("choices[") and len(parts) > 1:
        return f"{parts[0]}.{parts[1].split('[')[0]}"
    return parts[0].split("[")[0]


def _differing_fields(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(_field_name(path) for path, _, _ in iter_differences(a, b)))


def compare_results(base: RequestResult, candidate: RequestResult) -> RequestOutcome:
    request = base.request
    if not base.ok or not candidate.ok:
        if not base.ok and not candidate.ok and base.status == candidate.status:
            return RequestOutcome(request, BOTH_FAILED, detail=f"base: {base.error}; candidate: {candidate.error}")
        return RequestOutcome(
            request,
            DIVERGENT,
            Divergence(
                request,
                "<response>",
                base.error or "ok",
                candidate.error or "ok",
                ["<response>"],
            ),
        )
    a = base.transcript.comparable()
    b = candidate.transcript.comparable()
    diff = first_difference(a, b)
    if diff is None:
        return RequestOutcome(request, IDENTICAL)
    path, x, y = diff
    return RequestOutcome(request, DIVERGENT, Divergence(request, path, x, y, _differing_fields(a, b)))


def compare_runs(base: ServerRun, candidate: ServerRun) -> Comparison:
    if [r.request.index for r in base.results] != [r.request.index for r in candidate.results]:
        raise ValueError("the two runs did not send the same request set")
    return Comparison([compare_results(a, b) for a, b in zip(base.results, candidate.results)])


def describe_pair(a: Any, b: Any, context: int = 30) -> tuple[str, str]:
    """Both sides of a difference; two long strings are cut to a window around the first change."""
    if isinstance(a, str) and isinstance(b, str) and a != ABSENT and b != ABSENT:
        i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if i > context or max(len(a), len(b)) - i > 2 * context:
            start = max(0, i - context)
            where = f" (from char {start}; first difference at char {i})"
            return repr(a[start : i + 2 * context]) + where, repr(b[start : i + 2 * context]) + where
    return describe(a), describe(b)


def describe(value: Any, limit: int = 160) -> str:
    """A value as a reader needs it: floats with their exact bits, long values shortened."""
    if isinstance(value, float):
        return f"{value!r} ({value.hex()}, bits 0x{float_bits(value):016x})"
    if isinstance(value, str):
        text = repr(value)
    else:
        text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."
