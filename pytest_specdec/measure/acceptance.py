"""Acceptance from each request's own figures (vLLM's `metrics.speculative_decoding`): one run's, checked against
the counters' deltas of the same run, and a test's, over its valid spec runs; each with a confidence interval over
requests, per dataset category, and the histogram of steps by accepted draft tokens.

Why per request: the counters give one number per run, so a run's acceptance has no spread of its own and a
category's acceptance needs a test per category. The requests' figures give both from one run. They are only
trusted where they add up to the counters (`disagreement`): the counters stay the gate's source, and a run
whose two sources disagree is invalid with both figures named.

The interval is the ratio estimator's (Cochran, Sampling Techniques, 6.3): acceptance = Σ accepted ÷ Σ drafted
over independent units, its variance linearised as Σ (accepted_i − R · drafted_i)² / ((n − 1) · n · mean drafted²),
with Student's t at n − 1 degrees of freedom. The units are a run's requests; over a test's runs they are its
prompts (each prompt's requests summed), since at temperature 0 a prompt's requests in two runs accept alike and
are not independent draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from pytest_specdec.vllm.request_metrics import WHERE, RequestSpecDecode

if TYPE_CHECKING:
    from pytest_specdec.measure.types import RequestSample
    from pytest_specdec.vllm.counters import Counters

#: Where a test's or a run's acceptance comes from: each request's own figures (checked against the counters),
#: or the counters alone (no per-request figures: no speculation, an older vLLM, someone else's server).
Source = Literal["per-request", "counters"]
PER_REQUEST: Source = "per-request"
COUNTERS: Source = "counters"
#: The two-sided level of the intervals.
CI_LEVEL = 0.95
#: How a run's invalid reason starts when its requests' figures and the counters disagree.
MISMATCH = "per-request acceptance disagrees with vLLM's counters"


def ratio_ci(accepted: Sequence[float], drafted: Sequence[float], level: float = CI_LEVEL
             ) -> tuple[float, float] | None:
    """The confidence interval of Σ accepted ÷ Σ drafted over independent units (the ratio estimator, linearised;
    t at n − 1 df), clipped to [0, 1]. None for fewer than two units or nothing drafted. A unit that drafted nothing
    counts as a unit of weight 0, as in the ratio it estimates."""
    if len(accepted) != len(drafted):
        raise ValueError(f"ratio_ci: {len(accepted)} accepted counts but {len(drafted)} drafted")
    if not 0 < level < 1:
        raise ValueError(f"ratio_ci: level must be in (0, 1), got {level}")
    n, total = len(drafted), sum(drafted)
    if n < 2 or total <= 0:
        return None
    from scipy.stats import t

    rate = sum(accepted) / total
    s2 = sum((a - rate * d) ** 2 for a, d in zip(accepted, drafted, strict=True)) / (n - 1)
    se = math.sqrt(s2 / n) / (total / n)
    half = float(t.ppf((1 + level) / 2, n - 1)) * se
    return max(0.0, rate - half), min(1.0, rate + half)


def _merged(items: Iterable[RequestSpecDecode]) -> RequestSpecDecode:
    """Several requests' figures summed (histograms of different k padded with zero steps)."""
    items = list(items)
    width = max((len(i.histogram) for i in items), default=1)
    hist = [sum(i.histogram[j] if j < len(i.histogram) else 0 for i in items) for j in range(width)]
    return RequestSpecDecode(drafts=sum(i.drafts for i in items), draft_tokens=sum(i.draft_tokens for i in items),
                             accepted_tokens=sum(i.accepted_tokens for i in items), histogram=tuple(hist))


@dataclass(frozen=True)
class Acceptance:
    """The acceptance of some units (requests, or prompts), with its interval over them."""

    units: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    ci: tuple[float, float] | None

    @property
    def rate(self) -> float | None:
        """Accepted ÷ draft tokens, as the counters' acceptance rate."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @classmethod
    def of(cls, units: Sequence[RequestSpecDecode], level: float = CI_LEVEL) -> Acceptance:
        total = _merged(units)
        return cls(units=len(units), drafts=total.drafts, draft_tokens=total.draft_tokens,
                   accepted_tokens=total.accepted_tokens,
                   ci=ratio_ci([u.accepted_tokens for u in units], [u.draft_tokens for u in units], level))


@dataclass(frozen=True)
class AcceptanceTable:
    """Acceptance over a set of units, overall and per dataset category, with the histogram of verify steps by the
    draft tokens they accepted (``histogram[j]``: steps that accepted exactly j; vLLM's `acceptance_histogram`)."""

    unit: Literal["request", "prompt"]  # what the intervals are over
    overall: Acceptance
    by_category: Mapping[str, Acceptance]
    histogram: tuple[int, ...]
    ci_level: float = CI_LEVEL

    @classmethod
    def of(cls, unit: Literal["request", "prompt"], units: Sequence[tuple[str, RequestSpecDecode]],
           level: float = CI_LEVEL) -> AcceptanceTable:
        """From (category, figures) per unit; a unit without a category is under ``""``."""
        categories: dict[str, list[RequestSpecDecode]] = {}
        for category, figures in units:
            categories.setdefault(category, []).append(figures)
        every = [figures for _, figures in units]
        return cls(unit=unit, overall=Acceptance.of(every, level),
                   by_category={c: Acceptance.of(items, level) for c, items in sorted(categories.items())},
                   histogram=_merged(every).histogram, ci_level=level)


@dataclass(frozen=True)
class RequestFigures:
    """One request's figures, with what they are grouped by: its prompt and the prompt's category."""

    prompt_id: str
    category: str
    figures: RequestSpecDecode


@dataclass(frozen=True)
class RunAcceptance:
    """One run's acceptance from its requests' own figures (the successful requests that carried them), and how
    many requests carried none: successful ones (`missing`) and failed ones (`failed`)."""

    requests: tuple[RequestFigures, ...]
    missing: int = 0
    failed: int = 0
    level: float = field(default=CI_LEVEL, repr=False)

    @cached_property
    def total(self) -> RequestSpecDecode:
        return _merged(r.figures for r in self.requests)

    @cached_property
    def table(self) -> AcceptanceTable:
        return AcceptanceTable.of("request", [(r.category, r.figures) for r in self.requests], self.level)

    def disagreement(self, delta: Counters | None) -> str:
        """Why this run's requests' figures cannot be trusted ("" when they add up to the counters' deltas of the
        run: accepted and draft tokens, drafts, and accepted tokens per position, which vLLM's histogram gives as
        the steps that accepted more than i). Not judged where the counters were not read or requests failed
        (their steps are in the counters and their figures never came): the run is invalid for that already."""
        if delta is None or self.failed:
            return ""
        if not delta.spec_decode:
            return (f"{MISMATCH}: the requests carried {WHERE}, but the server exports no spec-decode counters "
                    "(is this a server with speculation?)")
        if self.missing:
            return (f"{MISMATCH}: {self.missing} of {self.missing + len(self.requests)} successful requests carried "
                    f"no {WHERE}")
        t = self.total
        per_pos = [sum(t.histogram[i + 1:]) for i in range(len(t.histogram) - 1)]
        counted = [round(x) for x in delta.accepted_per_pos]
        width = max(len(per_pos), len(counted))
        per_pos += [0] * (width - len(per_pos))
        counted += [0] * (width - len(counted))
        pairs = [("accepted tokens", t.accepted_tokens, round(delta.accepted_tokens)),
                 ("draft tokens", t.draft_tokens, round(delta.draft_tokens)),
                 ("drafts", t.drafts, round(delta.drafts)),
                 ("accepted tokens per position", per_pos, counted)]
        differ = [f"{name} {mine} summed over the {len(self.requests)} requests, {theirs} by the counters"
                  for name, mine, theirs in pairs if mine != theirs]
        return f"{MISMATCH}: {'; '.join(differ)}" if differ else ""


def run_acceptance(samples: Iterable[RequestSample], level: float = CI_LEVEL) -> RunAcceptance | None:
    """One run's acceptance from its requests' figures; None when no request carried any (the counters serve
    alone)."""
    samples = list(samples)
    requests = tuple(RequestFigures(s.prompt_id, s.category, s.spec_decode) for s in samples
                     if s.error is None and s.spec_decode is not None)
    if not requests:
        return None
    missing = sum(1 for s in samples if s.error is None and s.spec_decode is None)
    return RunAcceptance(requests=requests, missing=missing, failed=sum(1 for s in samples if s.error is not None),
                         level=level)


def case_acceptance(runs: Sequence[RunAcceptance | None], level: float = CI_LEVEL) -> AcceptanceTable | None:
    """A test's acceptance over its valid spec runs (``runs``), by prompt: each prompt's requests summed over the
    runs, so the interval is over prompts. None unless every run has per-request figures: a test's acceptance is
    one source's, never a mix."""
    if not runs or any(r is None for r in runs):
        return None
    by_prompt: dict[str, tuple[str, list[RequestSpecDecode]]] = {}
    for run in runs:
        assert run is not None
        for r in run.requests:
            by_prompt.setdefault(r.prompt_id, (r.category, []))[1].append(r.figures)
    return AcceptanceTable.of("prompt", [(category, _merged(items)) for category, items in by_prompt.values()],
                              level)
