"""The one run record: one run of one arm (`ArmRun`), typed, built once per run by the runner and read as it
is by the summary, the explain split, the gate and the baselines; its one stored shape (`RUN_FIELDS`, read by
`from_entry`, written by the baseline file's module, `gate.baselines.arm_run_entry`) is a baseline night's run and
the core of a results file's run. And the one pairing rule (`pairs`): which runs of two interleaved arms are
compared with each other.

It sits in `measure/`, below the gate, so a run measured tonight never goes through a dict to reach the
gate: only what is written (the results file, a baseline) and what is read back from a file is converted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pytest_specdec.errors import field_problem
from pytest_specdec.measure.figures import tau

if TYPE_CHECKING:
    from pytest_specdec.measure.metrics import RunMetrics

#: Every latency a run keeps as percentiles, by its `RunMetrics` field (the gate's registry names each one's P95
#: after it: ``tpot_ms`` → ``tpot_p95_ms``; tests/unit/test_record.py holds the two to each other).
DISTRIBUTIONS: tuple[str, ...] = ("tpot_ms", "ttft_ms", "e2e_ms", "itl_token_ms", "itl_chunk_ms")
#: The percentiles a stored run keeps of each distribution.
PERCENTILES: tuple[str, ...] = ("p50", "p95", "p99")

_NUMBER = (int, float, type(None))
_REASONS = (list,)
#: Every field of a stored run and the types it may hold; all must be there.
RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "index": (int,), "valid": (bool,), "invalid_reasons": _REASONS, "latency_untrusted": _REASONS,
    "output_tok_s": _NUMBER, "n_requests": _NUMBER, "total_output_tokens": _NUMBER, "drafts": _NUMBER,
    "draft_tokens": _NUMBER, "accepted_tokens": _NUMBER, "accepted_per_pos": (list, type(None)),
    "acceptance_rate": _NUMBER, "draft_coverage": _NUMBER,
    **{name: (dict, type(None)) for name in DISTRIBUTIONS}, "hd_p95_ms": (dict,), "goodput_req_s": _NUMBER,
}
#: The stored run's fields that may be absent: goodput is there only for a test with SLOs (and files written
#: before it was measured have none), so an absent one reads as None.
OPTIONAL_RUN_FIELDS: frozenset[str] = frozenset({"goodput_req_s"})


def numbers_problem(values: Iterable[tuple[str, Any]]) -> str:
    """What is wrong with the first figure that is not a finite number >= 0 or null ("" when none), worded
    as `field_problem` words it. The verdicts take logs and ratios of these, and pool every file into the
    variance priors, so one NaN or string would break every compared test."""
    for where, value in values:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{where} is {value!r}, not a number"
        if not math.isfinite(value) or value < 0:
            return f"{where} is {value!r}, not a finite number >= 0"
    return ""


def run_problem(run: Any) -> str:
    """What is wrong with one stored run ("" when nothing), by its path in the run: a missing field, one of
    the wrong type, or a figure the verdicts compute with that is not a finite number >= 0."""
    problem = field_problem(run, RUN_FIELDS, required=RUN_FIELDS.keys() - OPTIONAL_RUN_FIELDS)
    if problem:
        return problem
    figures = [(f".{k}", run.get(k)) for k, kinds in RUN_FIELDS.items() if kinds is _NUMBER]
    figures += [(f".accepted_per_pos[{n}]", v) for n, v in enumerate(run["accepted_per_pos"] or [])]
    figures += [(f".hd_p95_ms.{k}", v) for k, v in run["hd_p95_ms"].items()]
    figures += [(f".{name}.{p}", v) for name in DISTRIBUTIONS for p, v in (run[name] or {}).items()]
    return numbers_problem(figures)


def runs_problem(runs: Sequence[Any]) -> str:
    """What is wrong with a stored list of runs ("" when nothing): the first bad run's problem, by its index
    (`"[2].valid is 'x', not bool"`), so every reader of stored runs words it the same way."""
    for i, run in enumerate(runs):
        problem = run_problem(run)
        if problem:
            return f"[{i}]{problem}"
    return ""


def _percentiles(d: Mapping[str, Any] | None) -> Mapping[str, float] | None:
    return None if d is None else {p: d[p] for p in PERCENTILES if p in d}


@dataclass(frozen=True)
class ArmRun:
    """One run of one arm as it is stored: its validity, its figures, and the per-run P95s the verdicts read."""

    index: int
    valid: bool
    invalid_reasons: tuple[str, ...]
    latency_untrusted: tuple[str, ...]  # why its latencies are left out (a coalesced stream); empty: trusted
    output_tok_s: float | None
    n_requests: int | None
    total_output_tokens: int | None
    drafts: int | None  # None: no spec-decode counters (the reference arm)
    draft_tokens: int | None
    accepted_tokens: int | None
    accepted_per_pos: tuple[int, ...] | None  # accepted tokens per draft position (counts)
    acceptance_rate: float | None
    draft_coverage: float | None
    latencies_ms: Mapping[str, Mapping[str, float] | None]  # by DISTRIBUTIONS name: p50/p95/p99
    hd_p95_ms: Mapping[str, float | None]  # per-run P95 (Harrell-Davis) by LATENCIES name
    #: requests that met every SLO of the test per second (`metrics.good_requests`); None: the test set no SLOs
    goodput_req_s: float | None = None
    #: The ABBA block of its pair where the arms ran in blocks (one server at a time, `measure.schedule`); None:
    #: interleaved. An A/B verdict's unit is then the block (`gate.ab.block_means`).
    block: int | None = None

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per verification step (vLLM's acceptance length, τ: `figures.tau`)."""
        return tau(self.drafts, self.accepted_tokens)

    @property
    def timed(self) -> bool:
        """Its latencies can be trusted: the stream arrived as the engine made it."""
        return not self.latency_untrusted

    def figure(self, metric: str, *, untimed_too: bool = False) -> float | None:
        """This run's value of a per-run verdict metric (``output_tok_s``, ``acceptance_rate``, ``draft_coverage``,
        ``acceptance_length``, a ``<latency>_p95_ms`` or ``<latency>_p99_ms``), whatever its validity; None where
        it has none, and for a latency of a run whose stream was coalesced unless ``untimed_too``. The one
        definition that the nightly's per-run values (`gate.nights.Night.metric_values`) and an A/B session's pairs
        read."""
        if metric.endswith("_p95_ms"):
            return self.hd_p95_ms.get(metric.removesuffix("_p95_ms")) if self.timed or untimed_too else None
        if metric.endswith("_p99_ms"):  # the run's P99 as vllm bench serve computes it (no per-run Harrell-Davis)
            p99 = (self.latencies_ms.get(metric.removesuffix("_p99_ms") + "_ms") or {}).get("p99")
            return p99 if self.timed or untimed_too else None
        value: float | None = getattr(self, metric)
        return value

    @classmethod
    def measured(cls, index: int, metrics: RunMetrics, hd_p95_ms: Mapping[str, float | None],
                 invalid: Sequence[str] = (), untrusted: Sequence[str] = (), block: int | None = None) -> ArmRun:
        """A run measured tonight, from its figures (the runner builds it once per record, `RunRecord.record`)."""
        spec = metrics.spec
        rates = None if spec is None else spec.per_position_acceptance
        return cls(index=index, valid=not invalid, invalid_reasons=tuple(invalid), latency_untrusted=tuple(untrusted),
                   output_tok_s=metrics.output_tok_s, n_requests=metrics.n_requests,
                   total_output_tokens=metrics.total_output_tokens,
                   drafts=None if spec is None else spec.drafts,
                   draft_tokens=None if spec is None else spec.draft_tokens,
                   accepted_tokens=None if spec is None else spec.accepted_tokens,
                   # accepted tokens per draft position as counts, as the counters gave them (the rates times drafts)
                   accepted_per_pos=None if spec is None or rates is None else tuple(round(a * spec.drafts)
                                                                                     for a in rates),
                   acceptance_rate=None if spec is None else spec.acceptance_rate,
                   draft_coverage=None if spec is None else spec.draft_coverage,
                   latencies_ms={name: _percentiles(getattr(metrics, name)) for name in DISTRIBUTIONS},
                   hd_p95_ms=dict(hd_p95_ms), goodput_req_s=metrics.goodput_req_s, block=block)

    @classmethod
    def from_entry(cls, d: Mapping[str, Any]) -> ArmRun:
        """A stored run: a baseline's, or a results file's (which has more beside these fields); the readers
        have checked it (`run_problem`)."""
        per_pos = d.get("accepted_per_pos")
        return cls(index=d["index"], valid=d["valid"], invalid_reasons=tuple(d.get("invalid_reasons") or ()),
                   latency_untrusted=tuple(d.get("latency_untrusted") or ()), output_tok_s=d.get("output_tok_s"),
                   n_requests=d.get("n_requests"), total_output_tokens=d.get("total_output_tokens"),
                   drafts=d.get("drafts"), draft_tokens=d.get("draft_tokens"), accepted_tokens=d.get("accepted_tokens"),
                   accepted_per_pos=None if per_pos is None else tuple(per_pos),
                   acceptance_rate=d.get("acceptance_rate"), draft_coverage=d.get("draft_coverage"),
                   latencies_ms={name: _percentiles(d.get(name)) for name in DISTRIBUTIONS},
                   hd_p95_ms=dict(d.get("hd_p95_ms") or {}), goodput_req_s=d.get("goodput_req_s"),
                   block=d.get("block"))


# ---- pairs -----------------------------------------------------------------------------------------


class Indexed(Protocol):
    """What the pairing reads of a run: its run index and its validity."""

    @property
    def index(self) -> int: ...

    @property
    def valid(self) -> bool: ...


R = TypeVar("R", bound=Indexed)


@dataclass(frozen=True)
class Pair(Generic[R]):
    """The runs of two arms at one run index (``first``: the reference, or an A/B's base; ``second``: the spec
    arm, or the candidate); a side is None where that arm has no run at the index."""

    index: int
    first: R | None
    second: R | None

    @property
    def kept(self) -> bool:
        return self.first is not None and self.second is not None and self.first.valid and self.second.valid

    def why_dropped(self, names: tuple[str, str] = ("reference", "spec")) -> str:
        """Why the pair leaves the comparison ("" when it is kept): which arm's run is missing or invalid."""
        bad = [f"no {name} run" if run is None else f"the {name} run is invalid"
               for name, run in zip(names, (self.first, self.second), strict=True) if run is None or not run.valid]
        return " and ".join(bad)


def pairs(first: Iterable[R], second: Iterable[R]) -> list[Pair[R]]:
    """The one pairing rule of two interleaved arms: a pair is the two arms' runs of the same run index (the
    arms alternate run by run, or block by block, and the index is the interleaving's), one pair per index that
    either arm has, in index order. A pair is kept when both runs are there and valid; a run invalid on one arm
    drops its pair alone (`Pair.why_dropped` says why, `dropped` lists them, so it is never silent)."""
    a = {r.index: r for r in first}
    b = {r.index: r for r in second}
    return [Pair(i, a.get(i), b.get(i)) for i in sorted(a.keys() | b.keys())]


def dropped(pairs_: Iterable[Pair[Any]], names: tuple[str, str] = ("reference", "spec")) -> list[tuple[int, str]]:
    """The dropped pairs, (run index, why), in index order."""
    return [(p.index, p.why_dropped(names)) for p in pairs_ if not p.kept]


def speedup(pair: Pair[ArmRun]) -> float | None:
    """One pair's speedup: spec tok/s ÷ reference tok/s; None where the pair is dropped or a run has no tok/s."""
    if not pair.kept:
        return None
    assert pair.first is not None and pair.second is not None
    r, s = pair.first.output_tok_s, pair.second.output_tok_s
    return s / r if r and s else None


def goodput_ratio(pair: Pair[ArmRun]) -> float | None:
    """One pair's goodput ratio: spec goodput ÷ reference goodput (requests meeting every SLO per second); None
    where the pair is dropped, the test set no SLOs, or either arm met no SLO (`goodput_undefined` says which)."""
    if not pair.kept:
        return None
    assert pair.first is not None and pair.second is not None
    r, s = pair.first.goodput_req_s, pair.second.goodput_req_s
    return s / r if r and s else None


def goodput_undefined(pairs_: Iterable[Pair[ArmRun]], names: tuple[str, str] = ("reference", "spec")
                      ) -> list[tuple[int, str]]:
    """The kept pairs of a test with SLOs whose goodput ratio is undefined, (run index, why), in index order: an
    arm whose run met no SLO has goodput 0, and a ratio with 0 on either side has no log (the gate compares rates
    on the log scale). Such a pair leaves the goodput verdict; this list is how it is said, never dropped silently
    (a spec arm at 0 beside a reference above it is the worst goodput, so its line names it)."""
    out = []
    for p in pairs_:
        if not p.kept or p.first is None or p.second is None or goodput_ratio(p) is not None:
            continue
        r, s = p.first.goodput_req_s, p.second.goodput_req_s
        if r is None and s is None:
            continue
        zero = [name for name, g in zip(names, (r, s), strict=True) if g == 0]
        why = f"the {' and the '.join(zero)} run{'s' if len(zero) > 1 else ''} met no SLO (goodput 0)" if zero else ""
        absent = [name for name, g in zip(names, (r, s), strict=True) if g is None]  # one arm counted against no SLO
        out.append((p.index, "; ".join(w for w in (why, *(f"the {name} run has no goodput" for name in absent)) if w)))
    return out


def speedup_per_pair(reference: Sequence[ArmRun], spec: Sequence[ArmRun]) -> list[float | None]:
    """The speedup of every pair (`pairs`), None for a dropped one: a test's ``speedup_per_pair``."""
    return [speedup(p) for p in pairs(reference, spec)]


def pair_speedups(reference: Sequence[ArmRun], spec: Sequence[ArmRun]) -> list[float]:
    """The speedups of the kept pairs only."""
    return [s for s in speedup_per_pair(reference, spec) if s is not None]


def dead_arms(reference: Sequence[Any], spec: Sequence[Any] | None, base: Sequence[Any] | None = None,
              base_reference: Sequence[Any] | None = None) -> list[str]:
    """The arms with no valid run, the reference first, of any runs with a ``valid`` flag (tonight's records or a
    stored night's; ``spec`` None: the test serves no spec arm; ``base``: an A/B session's base arm;
    ``base_reference``: the base install's reference in an upgrade A/B). One rule for the plugin's dead-arm error,
    the baseline writes and `compare`: an arm is never judged, stored or passed on another arm's figures."""
    arms = [("reference", reference), *((name, runs) for name, runs in (("spec", spec), ("base", base),
                                                                       ("base_reference", base_reference))
                                        if runs is not None)]
    return [arm for arm, runs in arms if not any(r.valid for r in runs)]
