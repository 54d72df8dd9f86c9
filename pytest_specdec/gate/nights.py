"""The one run record: one run of one arm (`ArmRun`) and one session's runs of one test (`Night`), typed,
with the one stored shape of each (`to_entry`/`from_entry`). A baseline file's `sessions` are `Night`
entries; a results file's runs are `ArmRun` entries with more beside them, read by `Night.from_test`;
tonight's runs come from `Night.from_result`. All of them feed the one definition of every verdict metric's
per-run values (`Night.metric_values`), so a stored night and tonight can never be measured by two rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import SpecDecError, field_problem
from pytest_specdec.gate.registry import METRICS
from pytest_specdec.measure.probe import COMPONENTS, state_problem

if TYPE_CHECKING:
    from pytest_specdec.measure.runner import CaseResult, RunRecord

#: The latencies whose per-run P95 (Harrell-Davis, ms) gets a verdict, by `RunRecord.hd_p95_ms` key.
LATENCIES: tuple[str, ...] = tuple(m.name.removesuffix("_p95_ms") for m in METRICS
                                   if m.absolute and m.kind == "latency")
#: Every latency a run keeps as percentiles (`ttft_ms`, ..., `itl_token_ms`, `itl_chunk_ms`): the registry's
#: P95 metrics by their distribution's name.
DISTRIBUTIONS: tuple[str, ...] = tuple(m.name.replace("_p95_ms", "_ms") for m in METRICS
                                       if m.kind == "latency" and m.name.endswith("_p95_ms"))
#: The percentiles a stored run keeps of each distribution.
PERCENTILES: tuple[str, ...] = ("p50", "p95", "p99")


class RecordError(SpecDecError):
    """A stored run or night that cannot be read; the message follows its path in the file."""


_NUMBER = (int, float, type(None))
_REASONS = (list,)
#: Every field of a stored run and the types it may hold; all must be there.
RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "index": (int,), "valid": (bool,), "invalid_reasons": _REASONS, "latency_untrusted": _REASONS,
    "output_tok_s": _NUMBER, "n_requests": _NUMBER, "total_output_tokens": _NUMBER, "drafts": _NUMBER,
    "draft_tokens": _NUMBER, "accepted_tokens": _NUMBER, "accepted_per_pos": (list, type(None)),
    "acceptance_rate": _NUMBER, "draft_coverage": _NUMBER,
    **{name: (dict, type(None)) for name in DISTRIBUTIONS}, "hd_p95_ms": (dict,),
}
#: Every field of a stored night besides its runs.
NIGHT_FIELDS: dict[str, tuple[type, ...]] = {"started": (str,), "under_test": (dict,), "speedup_per_pair": (list,)}


def _numbers(values: Iterable[tuple[str, Any]]) -> str:
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
    problem = field_problem(run, RUN_FIELDS)
    if problem:
        return problem
    figures = [(f".{k}", run[k]) for k, kinds in RUN_FIELDS.items() if kinds is _NUMBER]
    figures += [(f".accepted_per_pos[{n}]", v) for n, v in enumerate(run["accepted_per_pos"] or [])]
    figures += [(f".hd_p95_ms.{k}", v) for k, v in run["hd_p95_ms"].items()]
    figures += [(f".{name}.{p}", v) for name in DISTRIBUTIONS for p, v in (run[name] or {}).items()]
    return _numbers(figures)


def pairs_problem(speedups: Any) -> str:
    """What is wrong with a stored speedup per pair ("" when nothing)."""
    if not isinstance(speedups, list):
        return f".speedup_per_pair is {speedups!r}, not list"
    return _numbers((f".speedup_per_pair[{n}]", v) for n, v in enumerate(speedups))


def state_figures(state: Any) -> dict[str, float] | None:
    """The probe's figures of a checked stored state (None: not probed)."""
    return None if state is None else {name: float(state[name]) for name in COMPONENTS}


def _percentiles(d: Mapping[str, Any] | None) -> Mapping[str, float] | None:
    return None if d is None else {p: d[p] for p in PERCENTILES if p in d}


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

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per verification step (vLLM's acceptance length, τ): 1 + accepted ÷ drafts."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts and self.accepted_tokens is not None else None

    @property
    def timed(self) -> bool:
        """Its latencies can be trusted: the stream arrived as the engine made it."""
        return not self.latency_untrusted

    def figure(self, metric: str, *, untimed_too: bool = False) -> float | None:
        """This run's value of a per-run verdict metric (``output_tok_s``, ``acceptance_rate``, ``draft_coverage``,
        ``acceptance_length`` or a ``<latency>_p95_ms``), whatever its validity; None where it has none, and for a
        latency of a run whose stream was coalesced unless ``untimed_too``. The one definition that the
        nightly's per-run values (`Night.metric_values`) and an A/B session's pairs read."""
        if metric.endswith("_p95_ms"):
            return self.hd_p95_ms.get(metric.removesuffix("_p95_ms")) if self.timed or untimed_too else None
        value: float | None = getattr(self, metric)
        return value

    @classmethod
    def from_record(cls, run: RunRecord) -> ArmRun:
        """A run measured tonight, as a results file records it (`RunRecord.to_dict`) and a baseline stores it."""
        return cls.from_entry(run.to_dict())

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
                   hd_p95_ms=dict(d.get("hd_p95_ms") or {}))

    def to_entry(self) -> dict[str, Any]:
        """The run as a baseline file stores it (every `RUN_FIELDS` key)."""
        return {
            "index": self.index, "valid": self.valid, "invalid_reasons": list(self.invalid_reasons),
            "latency_untrusted": list(self.latency_untrusted), "output_tok_s": self.output_tok_s,
            "n_requests": self.n_requests, "total_output_tokens": self.total_output_tokens, "drafts": self.drafts,
            "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
            "accepted_per_pos": None if self.accepted_per_pos is None else list(self.accepted_per_pos),
            "acceptance_rate": self.acceptance_rate, "draft_coverage": self.draft_coverage,
            **{name: None if v is None else dict(v) for name, v in self.latencies_ms.items()},
            "hd_p95_ms": dict(self.hd_p95_ms),
        }


@dataclass(frozen=True)
class Night:
    """One session's runs of one test: both arms, the speedup of each interleaved pair, when it started and
    what was under test (a results file keeps the latter per session, not per test: empty there)."""

    reference: tuple[ArmRun, ...]
    spec: tuple[ArmRun, ...]
    speedup_per_pair: tuple[float | None, ...]
    started: str = ""
    under_test: Mapping[str, Any] = field(default_factory=dict)
    #: The machine probe's figures while the test ran (`measure/probe.py`): what the ratio metrics are
    #: conditioned on (`gate/machine.py`); None where it was not probed (an external endpoint, an older file).
    machine_state: Mapping[str, float] | None = None

    @classmethod
    def from_result(cls, result: CaseResult, started: str = "", under_test: Mapping[str, Any] | None = None
                    ) -> Night:
        """Tonight's runs."""
        state = result.machine_state
        return cls(tuple(map(ArmRun.from_record, result.reference_runs)), tuple(map(ArmRun.from_record, result.runs)),
                   tuple(result.speedup_per_pair), started, dict(under_test or {}),
                   None if state is None else state.to_dict())

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> Night:
        """A baseline file's session: ``{"started", "under_test", "runs": {"reference": [...], "spec": [...]},
        "speedup_per_pair"}`` (the reader has checked it)."""
        runs = entry["runs"]
        return cls(tuple(map(ArmRun.from_entry, runs["reference"])), tuple(map(ArmRun.from_entry, runs["spec"])),
                   tuple(entry.get("speedup_per_pair") or ()), entry.get("started") or "",
                   dict(entry.get("under_test") or {}), state_figures(entry.get("machine_state")))

    @classmethod
    def from_test(cls, test: Mapping[str, Any], started: str = "", where: str = "test") -> Night:
        """A results file's test, as its JSON holds it: its `reference_runs`, `runs` and `speedup_per_pair`
        (a test that never measured has none: no runs). A field the record cannot read is a RecordError
        naming ``where`` and the field's path."""
        lists: dict[str, Any] = {}
        for key in ("reference_runs", "runs", "speedup_per_pair"):
            lists[key] = test.get(key, [])
            if not isinstance(lists[key], list):
                raise RecordError(f"{where}.{key} is {lists[key]!r}, not list")
        problem = pairs_problem(lists["speedup_per_pair"])
        if problem:
            raise RecordError(f"{where}{problem}")
        for key in ("reference_runs", "runs"):
            for i, run in enumerate(lists[key]):
                problem = run_problem(run)
                if problem:
                    raise RecordError(f"{where}.{key}[{i}]{problem}")
        problem = state_problem(test.get("machine_state"))
        if problem:
            raise RecordError(f"{where}.machine_state{problem}")
        return cls(tuple(map(ArmRun.from_entry, lists["reference_runs"])), tuple(map(ArmRun.from_entry, lists["runs"])),
                   tuple(lists["speedup_per_pair"]), started, machine_state=state_figures(test.get("machine_state")))

    def to_entry(self) -> dict[str, Any]:
        """The night as a baseline file stores it in `sessions`: every run, invalid ones too (flagged)."""
        return {
            "started": self.started, "under_test": dict(self.under_test),
            "runs": {"reference": [r.to_entry() for r in self.reference], "spec": [r.to_entry() for r in self.spec]},
            "speedup_per_pair": list(self.speedup_per_pair),
            **({"machine_state": dict(self.machine_state)} if self.machine_state is not None else {}),
        }

    def arms_without_valid_run(self, *, spec: bool) -> list[str]:
        """The arms with no valid run (`dead_arms`); ``spec``: the test serves a spec arm."""
        return dead_arms(self.reference, self.spec if spec else None)

    def metric_values(self, *, untimed_too: bool = False) -> dict[str, list[float]]:
        """Per-run values of every verdict metric (valid runs only, None left out).

        The reference arm gives ``reference_tok_s``; the spec arm everything else; latencies come from the
        spec arm, or from the reference when the test has no spec arm (method ``none``), and only from runs
        whose stream was not coalesced (``untimed_too``: from those too, to tell a metric left out for
        coalesced streams from one no valid run or pair gives). A spec arm whose runs are all invalid gives
        nothing: never the other arm's figures in its place.
        """
        ref = [r for r in self.reference if r.valid]
        spec = [r for r in self.spec if r.valid]
        out: dict[str, list[float]] = {}

        def put(name: str, values: Sequence[float | None]) -> None:
            vals = [float(v) for v in values if v is not None]
            if vals:
                out[name] = vals

        put("speedup", self.speedup_per_pair)
        put("output_tok_s", [r.figure("output_tok_s") for r in spec])
        put("reference_tok_s", [r.figure("output_tok_s") for r in ref])
        put("acceptance_rate", [r.figure("acceptance_rate") for r in spec])
        width = max((len(r.accepted_per_pos or ()) for r in spec), default=0)
        for i in range(width):
            put(f"per_position_acceptance[{i}]", [
                r.accepted_per_pos[i] / r.drafts for r in spec
                if r.drafts and r.accepted_per_pos and i < len(r.accepted_per_pos)
            ])
        put("draft_coverage", [r.figure("draft_coverage") for r in spec])
        put("acceptance_length", [r.figure("acceptance_length") for r in spec])
        for name in LATENCIES:
            put(f"{name}_p95_ms", [r.figure(f"{name}_p95_ms", untimed_too=untimed_too)
                                   for r in (spec if self.spec else ref)])
        # The gated latency: spec P95 E2E ÷ reference P95 E2E of the same interleaved pair (run index), so
        # the machine's speed that night cancels as it does in the speedup. E2E, not TPOT or TTFT: a stream
        # whose chunks arrive merged still ends when the request ends.
        by_index = {r.index: r for r in ref}
        put("e2e_p95_ratio", [s_e2e / r_e2e for s in spec
                              if (r := by_index.get(s.index)) is not None
                              and (s_e2e := s.figure("e2e_p95_ms", untimed_too=untimed_too))
                              and (r_e2e := r.figure("e2e_p95_ms", untimed_too=untimed_too))])
        return out
