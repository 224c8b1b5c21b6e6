"""Throughput and per-token latency of one run, and the candidate/base ratios.

- output tokens/s: generated tokens of the successful requests / wall time of the whole run
  (first request sent to last answer read), at the run's concurrency.
- TPOT (time per output token): per streamed request with 2+ tokens,
  (last byte - first output chunk) / (tokens - 1); mean and median over those requests.
- TTFT: first output chunk - request sent, streamed requests only.
Non-streamed requests count towards throughput and latency only.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from .client import ServerRun

#: Metrics where a larger candidate/base ratio is better; for the others smaller is better.
HIGHER_IS_BETTER = ("output_tokens_per_s", "requests_per_s")

METRICS = (
    ("output_tokens_per_s", "output tokens/s"),
    ("requests_per_s", "requests/s"),
    ("tpot_mean_ms", "TPOT mean (ms)"),
    ("tpot_median_ms", "TPOT median (ms)"),
    ("ttft_mean_ms", "TTFT mean (ms)"),
    ("latency_mean_ms", "latency mean (ms)"),
)


@dataclass
class ServerStats:
    requests: int
    failed: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float | None
    requests_per_s: float | None
    tpot_mean_ms: float | None
    tpot_median_ms: float | None
    ttft_mean_ms: float | None
    latency_mean_ms: float | None

    def to_json(self) -> dict:
        return asdict(self)


def _mean_ms(values: list[float]) -> float | None:
    return statistics.fmean(values) * 1000.0 if values else None


def compute_stats(run: ServerRun) -> ServerStats:
    ok = [r for r in run.results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    wall = run.wall_s
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    ttfts = [t for t in (r.ttft for r in ok) if t is not None]
    return ServerStats(
        requests=len(run.results),
        failed=len(run.results) - len(ok),
        output_tokens=tokens,
        wall_s=wall,
        output_tokens_per_s=tokens / wall if wall > 0 else None,
        requests_per_s=len(ok) / wall if wall > 0 else None,
        tpot_mean_ms=_mean_ms(tpots),
        tpot_median_ms=statistics.median(tpots) * 1000.0 if tpots else None,
        ttft_mean_ms=_mean_ms(ttfts),
        latency_mean_ms=_mean_ms([r.latency for r in ok]),
    )


def ratios(base: ServerStats, candidate: ServerStats) -> dict[str, float | None]:
    """candidate / base per metric (None where either side has no value or base is 0)."""
    out: dict[str, float | None] = {}
    for key, _ in METRICS:
        a, b = getattr(base, key), getattr(candidate, key)
        out[key] = b / a if a and b is not None else None
    return out
