"""The A/B verdict, its exit code, and its text and JSON forms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .client import ServerRun
from .compare import BOTH_FAILED, IDENTICAL, Comparison, describe_pair
from .stats import HIGHER_IS_BETTER, METRICS, ServerStats, compute_stats, ratios

EXIT_IDENTICAL = 0
EXIT_DIVERGENT = 1
#: Nothing diverged, but the check does not prove equality: requests failed on both servers, the
#: base disagreed with itself (control run), or nothing was compared.
EXIT_INCONCLUSIVE = 3


@dataclass
class Coverage:
    """How many answers actually carried what the requests asked for (a server may ignore fields)."""

    requests: int = 0
    token_ids: int = 0
    logprobs_requested: int = 0
    logprobs_answered: int = 0
    prompt_logprobs_requested: int = 0
    prompt_logprobs_answered: int = 0

    @classmethod
    def of(cls, run: ServerRun) -> "Coverage":
        cov = cls(requests=len(run.results))
        for r in run.results:
            first = r.transcript.choices[0] if r.ok and r.transcript.choices else None
            if first is not None and first.token_ids is not None:
                cov.token_ids += 1
            if r.request.top_logprobs is not None:
                cov.logprobs_requested += 1
                cov.logprobs_answered += bool(first is not None and first.logprobs)
            if r.request.body.get("prompt_logprobs") is not None:
                cov.prompt_logprobs_requested += 1
                cov.prompt_logprobs_answered += bool(first is not None and first.prompt_logprobs)
        return cov


@dataclass
class ABReport:
    base_url: str
    candidate_url: str
    model: str
    seed: int
    concurrency: int
    comparison: Comparison
    base_stats: ServerStats
    candidate_stats: ServerStats
    coverage: Coverage
    #: base vs a second base run (``--control``): shows whether the server is deterministic at all.
    control: Comparison | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, base: ServerRun, candidate: ServerRun, comparison: Comparison, *, model: str, seed: int,
              control: Comparison | None = None, notes: list[str] | None = None) -> "ABReport":
        return cls(
            base_url=base.url,
            candidate_url=candidate.url,
            model=model,
            seed=seed,
            concurrency=base.concurrency,
            comparison=comparison,
            base_stats=compute_stats(base),
            candidate_stats=compute_stats(candidate),
            coverage=Coverage.of(base),
            control=control,
            notes=list(notes or []),
        )

    @property
    def unexplained_divergences(self) -> list:
        """A/B divergences on requests the base server answered identically twice (``--control``).

        A request on which the base disagrees with itself (different batching under concurrent
        clients, kernels that are not batch-invariant) proves nothing about the plugin.
        """
        if self.control is None:
            return list(self.comparison.divergences)
        noisy = {d.request.index for d in self.control.divergences}
        return [d for d in self.comparison.divergences if d.request.index not in noisy]

    @property
    def verdict(self) -> str:
        if self.unexplained_divergences:
            return "divergent"
        if self.comparison.divergences:
            return "inconclusive"  # every divergence is one the base also shows against itself
        if (
            self.comparison.count(BOTH_FAILED)
            or self.comparison.count(IDENTICAL) == 0
            or (self.control is not None and self.control.divergences)
        ):
            return "inconclusive"
        return "identical"

    @property
    def exit_code(self) -> int:
        return {"identical": EXIT_IDENTICAL, "divergent": EXIT_DIVERGENT}.get(self.verdict, EXIT_INCONCLUSIVE)

    def to_json(self, max_divergences: int = 100) -> dict[str, Any]:
        c = self.comparison
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "base_url": self.base_url,
            "candidate_url": self.candidate_url,
            "model": self.model,
            "seed": self.seed,
            "concurrency": self.concurrency,
            "requests": len(c.outcomes),
            "identical": c.count(IDENTICAL),
            "divergent": len(c.divergences),
            "both_failed": c.count(BOTH_FAILED),
            "divergences": [d.to_json() for d in c.divergences[:max_divergences]],
            "both_failed_requests": [
                {"request": o.request.index, "label": o.request.label, "detail": o.detail}
                for o in c.outcomes
                if o.verdict == BOTH_FAILED
            ][:max_divergences],
            "stats": {"base": self.base_stats.to_json(), "candidate": self.candidate_stats.to_json()},
            "ratio_candidate_over_base": ratios(self.base_stats, self.candidate_stats),
            "coverage": vars(self.coverage),
            "notes": self.notes,
        }
        if self.control is not None:
            out["control"] = {
                "divergent": len(self.control.divergences),
                "divergences": [d.to_json() for d in self.control.divergences[:max_divergences]],
            }
        return out

    def render_text(self, max_divergences: int = 5) -> str:
        c = self.comparison
        lines = [
            "fd-async-copy A/B serving check",
            f"  base:       {self.base_url}",
            f"  candidate:  {self.candidate_url}",
            f"  model {self.model!r}, {len(c.outcomes)} requests, seed {self.seed}, concurrency {self.concurrency}",
            "",
            f"  {'':<20}{'base':>14}{'candidate':>14}{'cand/base':>12}",
        ]
        r = ratios(self.base_stats, self.candidate_stats)
        for key, title in METRICS:
            a, b = getattr(self.base_stats, key), getattr(self.candidate_stats, key)
            better = "higher is better" if key in HIGHER_IS_BETTER else "lower is better"
            ratio = f"{r[key]:.3f}" if r[key] is not None else "-"
            lines.append(f"  {title:<20}{_num(a):>14}{_num(b):>14}{ratio:>12}   ({better})")
        lines.append(
            f"  {'output tokens':<20}{self.base_stats.output_tokens:>14}{self.candidate_stats.output_tokens:>14}"
        )
        cov = self.coverage
        lines += [
            "",
            f"  coverage: token ids in {cov.token_ids}/{cov.requests} answers, logprobs in "
            f"{cov.logprobs_answered}/{cov.logprobs_requested} that asked, prompt logprobs in "
            f"{cov.prompt_logprobs_answered}/{cov.prompt_logprobs_requested} that asked",
        ]
        for note in self.notes:
            lines.append(f"  note: {note}")
        if self.control is not None:
            lines.append(
                f"  control (base vs base again): {len(self.control.divergences)} divergent request(s)"
                + ("; A/B differences may not be the plugin's" if self.control.divergences else "")
            )
            for d in self.control.divergences[:max_divergences]:
                lines.append(f"    {d.request.label} at {d.path}: " + " vs ".join(describe_pair(d.base, d.candidate)))
        lines.append("")
        identical, divergent, failed = c.count(IDENTICAL), len(c.divergences), c.count(BOTH_FAILED)
        summary = f"{identical} identical, {divergent} divergent, {failed} failed on both servers"
        lines.append(f"RESULT: {self.verdict.upper()} ({summary})")
        if divergent:
            lines.append(f"first divergences (of {divergent}):")
            for d in c.divergences[:max_divergences]:
                lines.append(f"  {d.request.label}")
                lines.append(f"    at {d.path}")
                base, candidate = describe_pair(d.base, d.candidate)
                lines.append(f"      base:      {base}")
                lines.append(f"      candidate: {candidate}")
                if len(d.fields) > 1:
                    lines.append(f"    fields that differ: {', '.join(d.fields)}")
        if failed:
            lines.append("failed on both servers (not compared):")
            for o in [o for o in c.outcomes if o.verdict == BOTH_FAILED][:max_divergences]:
                lines.append(f"  {o.request.label}: {o.detail}")
        return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
