"""The results file as a format (`RESULTS_FILE`): read back as typed data, written in its one text form
(`render_results`), brought from each older schema to the next (the steps near the end), and the typed values the
gate, measurement and server layers hand over written in the form this file stores them (the ``*_entry`` functions
at the end, which `output.results` assembles; those classes write no JSON of their own). A value that another
format holds too is written once, in the lower module both can import: a crossover statistic by the crossover
record's (`gate.baselines.crossover_value_entry`), a machine state by the probe's, whose command prints it in that
form (`measure.probe.state_entry`).

`load` takes a parsed `reports/*.json` of this plugin's schema: what the HTML report, the pytest-benchmark
export, compare, history and any tool render from. An older file is an error naming the command that converts
it (``pytest-specdec convert-schema``, through this format's steps), so no reader guesses which version wrote a
field. A test's runs are the one run record (`gate.nights`): `TestEntry.night`.

The per-run figures and a test's summary stay mappings keyed by the metric registry's names
(`output_tok_s`, `reference_tok_s`, `tpot_ms`, ...), read by name where a chart or column needs one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import SpecDecError
from pytest_specdec.formats import RESULTS_SCHEMA, FileFormat
from pytest_specdec.gate.baselines import run_record
from pytest_specdec.gate.kinds import (
    EXACT,
    FAMILIES,
    GATED,
    INCONCLUSIVE,
    PERCENT,
    PERS,
    SHOWN,
    UNITS,
    Decision,
    Family,
    Per,
    Unit,
    check_decision,
    check_word,
    split_method,
)
from pytest_specdec.gate.machine import MachineFactor
from pytest_specdec.gate.nights import Night, RecordError
from pytest_specdec.output.fields import number

if TYPE_CHECKING:
    from pytest_specdec.gate.drift import Drift, DriftVerdict
    from pytest_specdec.gate.judge import CalibrationUsed
    from pytest_specdec.gate.machine import StateSummary, StateTolerance
    from pytest_specdec.gate.stats import Thresholds
    from pytest_specdec.gate.store import BaselineWrites, Hardware, Machine
    from pytest_specdec.gate.variance import NightPrior, NightVariance
    from pytest_specdec.measure.acceptance import Acceptance, AcceptanceTable, RunAcceptance
    from pytest_specdec.measure.explain import Explained, Split
    from pytest_specdec.measure.metrics import Chunking, RunMetrics
    from pytest_specdec.measure.saturation import RatePoint, Saturation
    from pytest_specdec.measure.summary import GoodputSummary, Summary
    from pytest_specdec.output.timing import SessionTime
    from pytest_specdec.servers.endpoints import EndpointFacts
    from pytest_specdec.servers.quiet import Quiet
    from pytest_specdec.vllm.install import Install

Figures = Mapping[str, Any]


class ResultsError(SpecDecError):
    """A results file this plugin cannot read; the message names the file's field."""


@dataclass(frozen=True)
class VerdictEntry:
    """One metric's verdict as a test recorded it (`output.results.verdict_entry`), its words checked when read. It has
    the fields `output.wording`'s formatters read (`wording.Judged`), so a results file is worded as the session
    worded it."""

    metric: str
    verdict: Decision
    family: Family  # gated: it can fail the test; shown: judged and shown, never fails
    baseline: float | None
    now: float | None
    delta: float | None
    unit: Unit  # of the change, the file's `delta_unit`: "%" or "points"
    ci: tuple[float, float] | None
    p: float | None
    n_baseline: int | None
    n_now: int | None
    threshold: float | None
    method: str  # the rule alone ("welch-log", "exact", ...)
    per: Per  # what one sample of the comparison was: a run, a pair, a session or a night
    note: str
    mde: float | None  # None beside an se: no bound; None without one: no variance model
    se: float | None
    df: float | None
    #: the verdict before the session's family adjustment, `{verdict, p, note}` (None: not recorded)
    unadjusted: Mapping[str, Any] | None = None

    @property
    def exact(self) -> bool:
        return self.method == EXACT

    @property
    def ci_low(self) -> float | None:
        return None if self.ci is None else self.ci[0]

    @property
    def ci_high(self) -> float | None:
        return None if self.ci is None else self.ci[1]

    @classmethod
    def from_dict(cls, metric: str, d: Mapping[str, Any], where: str = "verdict") -> VerdictEntry:
        """``where`` (the file and the verdict's place in it) is what an unknown word's error names. A file
        written before `per` was a field of its own has it as the suffix of `method` ("exact/pair"), split here."""
        ci = d.get("ci")
        lo, hi = (number(ci[0]), number(ci[1])) if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
        try:
            method, per = split_method(str(d.get("method") or ""), f"{where}.method")
            if "per" in d:
                per = check_word(d["per"], PERS, "comparison unit", f"{where}.per")
            verdict = check_decision(d.get("verdict"), f"{where}.verdict")
            family = check_word(d["family"], FAMILIES, "family", f"{where}.family")
            unit = check_word(d.get("delta_unit") or PERCENT, UNITS, "unit", f"{where}.delta_unit")
        except ValueError as exc:
            raise ResultsError(str(exc)) from None
        return cls(
            metric=metric, verdict=verdict, family=family,
            baseline=number(d.get("baseline")), now=number(d.get("now")), delta=number(d.get("delta")),
            unit=unit, ci=None if lo is None or hi is None else (lo, hi),
            p=number(d.get("p")), n_baseline=_int(d.get("n_baseline")), n_now=_int(d.get("n_now")),
            threshold=number(d.get("threshold")), method=method, per=per, note=str(d.get("note") or ""),
            mde=number(d.get("mde")), se=number(d.get("se")), df=number(d.get("df")),
            unadjusted=raw if isinstance(raw := d.get("unadjusted"), Mapping) else None)


@dataclass(frozen=True)
class BaselineEntry:
    """How a test met its stored baseline (`output.results.baseline_entry`)."""

    path: str
    status: str  # compared, missing, not-comparable, error, ...
    checked: bool  # False: the test opted out (`check=False`): judged and shown, never failed
    sessions: int
    looks: tuple[int, ...]
    gate: tuple[str, ...]
    inconclusive_gated: tuple[str, ...]
    unspent_runs: int
    stop_reason: str
    machine_deviation: float | None  # log of this test's reference speed vs the baseline's
    ci_level: float | None  # two-sided level of the CIs of Δ, a fraction; None: no CI was computed
    adjusted: str
    attribution: str | None
    under_test: Mapping[str, Any]
    under_test_diff: Mapping[str, Any]
    not_comparable_fields: Mapping[str, Any]
    error: str | None
    max_looks: int = 1
    comparability: Mapping[str, Any] | None = None  # tonight's conditions, as the baseline file records its own
    thresholds: Mapping[str, Any] | None = None  # the thresholds the test was judged with (`thresholds_entry`)
    split: Mapping[str, Any] | None = None  # the speedup's change baseline → now split (`measure.explain.Split`)
    #: other machines whose nights judged the test's acceptance, this machine having no baseline of it
    machines: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BaselineEntry:
        return cls(
            path=str(d.get("path") or ""), status=str(d.get("status") or ""), checked=d.get("checked") is not False,
            sessions=_int(d.get("sessions")) or 0,
            looks=tuple(x for x in (_int(v) for v in d.get("looks") or ()) if x is not None),
            gate=tuple(d.get("gate") or ()), inconclusive_gated=tuple(d["inconclusive_gated"]),
            unspent_runs=_int(d.get("unspent_runs")) or 0, stop_reason=str(d.get("stop_reason") or ""),
            machine_deviation=number(d.get("machine_deviation")), ci_level=number(d["ci_level"]),
            adjusted=str(d.get("adjusted") or ""), attribution=d.get("attribution"),
            under_test=d.get("under_test") or {}, under_test_diff=d.get("under_test_diff") or {},
            not_comparable_fields=d.get("not_comparable_fields") or {}, error=d.get("error"),
            max_looks=_int(d.get("max_looks")) or 1, comparability=d.get("comparability"),
            thresholds=d.get("thresholds"), split=d.get("split"), machines=tuple(d.get("machines") or ()))


@dataclass(frozen=True)
class ABEntry:
    """A test's `ab` section in an A/B session (`output.results.ab_entry`): what was compared, the verdicts (read as
    the nightly's), what a regression points at, how it was judged (its looks, gated metrics, level), and every run
    of the three or four arms, each named by its `arm`."""

    method: str
    base: Mapping[str, Any]  # draft, server, install, reference_server
    candidate: Mapping[str, Any]  # draft, server, install
    changed: Mapping[str, Any]  # key: [base, candidate]
    verdicts: Mapping[str, VerdictEntry]
    regressed: tuple[str, ...]
    attribution: str | None
    attribution_text: str | None
    split: Mapping[str, Any] | None
    adjusted: str
    thresholds: Mapping[str, Any] | None
    checked: bool
    gate: tuple[str, ...]
    looks: tuple[int, ...]
    max_looks: int
    planned_looks: tuple[int, ...]
    unspent_runs: int
    pairs: int
    max_pairs: int
    stop: str | None
    stop_reason: str
    alpha: float | None
    ci_level: float | None
    runs: tuple[Mapping[str, Any], ...]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> ABEntry:
        runs = d.get("runs")
        if not isinstance(runs, list):
            raise ResultsError(f"{where}.runs is {runs!r}, not a list of runs")
        thresholds, split = d.get("thresholds"), d.get("split")
        return cls(
            method=str(d.get("method") or ""), base=_mapping(d.get("base")), candidate=_mapping(d.get("candidate")),
            changed=_mapping(d.get("changed")),
            verdicts={k: VerdictEntry.from_dict(k, v, f"{where}.verdicts.{k}")
                      for k, v in (d.get("verdicts") or {}).items()},
            regressed=tuple(str(m) for m in d.get("regressed") or ()), attribution=d.get("attribution"),
            attribution_text=d.get("attribution_text"), split=split if isinstance(split, Mapping) else None,
            adjusted=str(d.get("adjusted") or ""), thresholds=thresholds if isinstance(thresholds, Mapping) else None,
            checked=d.get("checked") is not False, gate=tuple(str(m) for m in d.get("gate") or ()),
            looks=_ints(d.get("looks")), max_looks=_int(d.get("max_looks")) or 1,
            planned_looks=_ints(d.get("planned_looks")),
            unspent_runs=_int(d.get("unspent_runs")) or 0, pairs=_int(d.get("pairs")) or 0,
            max_pairs=_int(d.get("max_pairs")) or 0, stop=d.get("stop"), stop_reason=str(d.get("stop_reason") or ""),
            alpha=number(d.get("alpha")), ci_level=number(d.get("ci_level")), runs=tuple(runs))


@dataclass(frozen=True)
class AcceptanceEntry:
    """Acceptance from the requests' own figures over some units (`acceptance_entry`)."""

    units: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    acceptance_length: float | None
    ci: tuple[float, float] | None

    @classmethod
    def from_dict(cls, d: Any, where: str) -> AcceptanceEntry:
        """The figures as written; a count or rate of the wrong kind is an error naming its field."""
        if not isinstance(d, Mapping):
            raise ResultsError(f"{where} is {d!r}, not an object")
        counts = {}
        for key in ("units", "drafts", "draft_tokens", "accepted_tokens"):
            value = _int(d.get(key))
            if value is None or value < 0:
                raise ResultsError(f"{where}.{key} is {d.get(key)!r}, not a count")
            counts[key] = value
        ci = d.get("ci")
        lo, hi = (number(ci[0]), number(ci[1])) if isinstance(ci, list) and len(ci) == 2 else (None, None)
        if ci is not None and (lo is None or hi is None):
            raise ResultsError(f"{where}.ci is {ci!r}, not null or [low, high]")
        rates = {key: number(d.get(key)) for key in ("acceptance_rate", "acceptance_length")}
        bad = [key for key, value in rates.items() if d.get(key) is not None and value is None]
        if bad:
            raise ResultsError(f"{where}.{bad[0]} is {d.get(bad[0])!r}, not a number or null")
        return cls(units=counts["units"], drafts=counts["drafts"], draft_tokens=counts["draft_tokens"],
                   accepted_tokens=counts["accepted_tokens"], acceptance_rate=rates["acceptance_rate"],
                   acceptance_length=rates["acceptance_length"], ci=None if lo is None or hi is None else (lo, hi))


@dataclass(frozen=True)
class RequestAcceptanceEntry:
    """A test's acceptance from its requests' own figures (its summary's `request_acceptance`,
    `request_acceptance_entry`): overall, per dataset category, and the histogram of verify steps
    by the draft tokens they accepted; the intervals over `unit`s at `ci_level`."""

    unit: str
    ci_level: float
    overall: AcceptanceEntry
    by_category: Mapping[str, AcceptanceEntry]
    acceptance_histogram: tuple[int, ...]

    @classmethod
    def from_dict(cls, d: Any, where: str) -> RequestAcceptanceEntry:
        if not isinstance(d, Mapping):
            raise ResultsError(f"{where} is {d!r}, not an object")
        hist = d.get("acceptance_histogram")
        if not isinstance(hist, list) or any(_int(n) is None for n in hist):
            raise ResultsError(f"{where}.acceptance_histogram is {hist!r}, not a list of counts")
        categories = d.get("by_category")
        if not isinstance(categories, Mapping):
            raise ResultsError(f"{where}.by_category is {categories!r}, not an object")
        level = number(d.get("ci_level"))
        if level is None or not 0 < level < 1:
            raise ResultsError(f"{where}.ci_level is {d.get('ci_level')!r}, not a level in (0, 1)")
        return cls(unit=str(d.get("unit") or ""), ci_level=level, overall=AcceptanceEntry.from_dict(d, where),
                   by_category={str(c): AcceptanceEntry.from_dict(v, f"{where}.by_category.{c}")
                                for c, v in categories.items()},
                   acceptance_histogram=tuple(hist))


@dataclass(frozen=True)
class TestEntry:
    """One specdec test: its case, outcome, runs, verdicts and baseline."""

    __test__ = False  # a results entry, not a pytest test class

    nodeid: str
    params: Mapping[str, Any]
    outcome: str  # pytest's word: passed, failed, skipped (pending: never reported)
    when: str | None  # the phase that decided the outcome
    servers: Mapping[str, str]  # arm -> server spec key
    summary: Figures
    runs: tuple[Figures, ...]
    reference_runs: tuple[Figures, ...]
    speedup_per_pair: tuple[float | None, ...]
    night: Night  # the runs of both arms as the gate reads them (no runs: the test never measured)
    valid: bool
    invalid_runs: tuple[Figures, ...]
    latency_untrusted_runs: tuple[Figures, ...]
    verdicts: Mapping[str, VerdictEntry]
    baseline: BaselineEntry | None
    error: str | None = None
    server_logs: tuple[Mapping[str, str], ...] = ()
    distribution: Mapping[str, Any] | None = None
    sampling: Mapping[str, Any] | None = None
    #: temperature 0: spec vs reference outputs, with the prompts that differed (`measure.outputs.greedy_output_match`)
    output_match: Mapping[str, Any] | None = None
    #: an A/B session's candidate vs base (`output.results.ab_entry`)
    ab: ABEntry | None = None
    #: the test's other parametrize values (`gate.crossover_gate.recorded`): part of its sweep's identity
    callspec: Mapping[str, Any] = field(default_factory=dict)
    #: a rate sweep's point: its fraction, the saturation it is a fraction of and the request rate used
    rate_sweep: Mapping[str, Any] | None = None
    #: its drift within the session (`drift_entry`); None: no spec arm, or a file from before it
    drift: Mapping[str, Any] | None = None
    #: where its acceptance comes from: "per-request" (its requests' own figures) or "counters"
    acceptance_source: str = "counters"
    #: its acceptance from its requests' own figures (None: the counters served alone)
    request_acceptance: RequestAcceptanceEntry | None = None

    @property
    def failed(self) -> bool:
        return self.outcome == "failed"

    def drift_judged(self, where: str) -> Drift | None:
        """Its `drift` as the gate's typed value (`drift_of`); None without one."""
        return drift_of(self.drift, f"{where}.drift")

    @property
    def explained(self) -> dict[str, Any] | None:
        """The speedup explained (τ, step times, efficiency: `gate.verdicts.explained`, the one definition) from the
        test's runs, so a file written before the summary carried it reads the same; None without a spec arm."""
        from pytest_specdec.gate.verdicts import explained

        e = explained([self.night])
        return None if e is None else explained_entry(e)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str, started: str = "") -> TestEntry:
        if not isinstance(d.get("nodeid"), str):
            raise ResultsError(f"{where}: no `nodeid`")
        try:
            night = Night.from_test(d, started, where)
        except RecordError as exc:
            raise ResultsError(str(exc)) from None
        validity = d.get("validity") or {}
        verdicts = d.get("verdicts") or {}
        baseline = d.get("baseline")
        summary = d.get("summary") or {}
        requests = summary.get("request_acceptance")
        return cls(
            nodeid=d["nodeid"], params=d.get("params") or {}, outcome=str(d["outcome"]), when=d.get("when"),
            servers=d.get("servers") or {}, summary=d.get("summary") or {},
            runs=tuple(d.get("runs") or ()), reference_runs=tuple(d.get("reference_runs") or ()),
            speedup_per_pair=night.speedup_per_pair, night=night,
            valid=bool(validity.get("valid", True)), invalid_runs=tuple(validity.get("invalid_runs") or ()),
            latency_untrusted_runs=tuple(validity.get("latency_untrusted_runs") or ()),
            verdicts={k: VerdictEntry.from_dict(k, v, f"{where}.verdicts.{k}") for k, v in verdicts.items()},
            baseline=BaselineEntry.from_dict(baseline) if isinstance(baseline, Mapping) else None,
            error=d.get("error"), server_logs=tuple(d.get("server_logs") or ()), distribution=d.get("distribution"),
            sampling=d.get("sampling"), output_match=d.get("output_match"),
            ab=ABEntry.from_dict(ab, f"{where}.ab") if isinstance(ab := d.get("ab"), Mapping) else None,
            callspec=cs if isinstance(cs := d.get("callspec"), Mapping) else {},
            rate_sweep=d.get("rate_sweep") if isinstance(d.get("rate_sweep"), Mapping) else None,
            drift=d.get("drift") if isinstance(d.get("drift"), Mapping) else None,
            acceptance_source=str(summary.get("acceptance_source") or "counters"),
            request_acceptance=(None if requests is None
                                else RequestAcceptanceEntry.from_dict(requests, f"{where}.summary.request_acceptance")))


def drift_of(entry: Mapping[str, Any] | None, where: str) -> Drift | None:
    """A test's `drift` entry (`drift_entry`) read back as the gate's typed value: its verdicts as judged
    (each one's `unadjusted` word, p and note, where the session adjusted it) and as the session left them
    (`Drift.adjusted`; None in a file from before drift was adjusted). None without an entry; ResultsError names a
    malformed one."""
    from dataclasses import replace

    from pytest_specdec.gate.drift import Drift, DriftVerdict
    from pytest_specdec.gate.kinds import FAMILIES, UNITS, check_decision, check_word

    if entry is None:
        return None
    stood, raw, adjusted = [], [], False
    try:
        alpha = float(entry["alpha"])
        for metric, d in (entry.get("verdicts") or {}).items():
            at = f"{where}.verdicts.{metric}"
            ci = d.get("ci")
            v = DriftVerdict(
                str(d.get("metric", metric)), check_decision(d["verdict"], f"{at}.verdict"),
                check_word(d["family"], FAMILIES, "family", f"{at}.family"),
                check_word(d["unit"], UNITS, "unit", f"{at}.unit"), float(d["threshold"]), number(d.get("early")),
                number(d.get("late")), number(d.get("delta")), None if ci is None else (float(ci[0]), float(ci[1])),
                number(d.get("p")), _ints(d.get("early_runs")), _ints(d.get("late_runs")),
                tuple(str(x) for x in d.get("left_out") or ()), str(d.get("note") or ""))
            stood.append(v)
            before = d.get("unadjusted")
            adjusted = adjusted or isinstance(before, Mapping)
            raw.append(v if not isinstance(before, Mapping) else replace(
                v, verdict=check_decision(before.get("verdict"), f"{at}.unadjusted.verdict"),
                p=number(before.get("p")), note=str(before.get("note") or "")))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ResultsError(f"{where}: a malformed drift entry ({type(exc).__name__}: {exc})") from None
    return Drift(tuple(raw), alpha, tuple(stood) if adjusted else None)


@dataclass(frozen=True)
class GateEntry:
    """The session's gate settings and outcome that are not per test."""

    fail_inconclusive: bool = False
    fail_machine: bool = False
    machine_failed: bool = False
    night_variance: Mapping[str, Any] = field(default_factory=dict)
    #: how the session judged (`output.results.gate_settings`): alpha, multiplicity, min_night_sd, the thresholds
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BaselineUpdate:
    """What --update-baselines wrote at the session's end (`gate.store.BaselineWrites`); paths as the
    checkout names them. A file written without the flag, or before the field existed, has none."""

    root: str
    mode: str  # "all" or "missing"
    created: tuple[str, ...]
    updated: tuple[tuple[str, str], ...]  # (path, old → new headline figures and what was kept)
    unchanged: tuple[tuple[str, str], ...]  # (path, why not written)
    unused: tuple[str, ...]
    not_written: tuple[tuple[str, str], ...]  # (path, why)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> BaselineUpdate:
        if not isinstance(d, Mapping):
            raise ResultsError(f"{where}: expected an object, got {type(d).__name__}")

        def paths(key: str) -> tuple[str, ...]:
            items = d.get(key) or []
            if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
                raise ResultsError(f"{where}.{key}: expected a list of paths")
            return tuple(items)

        def pairs(key: str, what: str) -> tuple[tuple[str, str], ...]:
            items = d.get(key) or []
            if not isinstance(items, list) or not all(isinstance(x, Mapping) and isinstance(x.get("path"), str)
                                                      for x in items):
                raise ResultsError(f"{where}.{key}: expected a list of {{path, {what}}} objects")
            return tuple((x["path"], str(x.get(what) or "")) for x in items)

        return cls(root=str(d.get("root") or ""), mode=str(d.get("mode") or "all"), created=paths("created"),
                   updated=pairs("updated", "change"), unchanged=pairs("unchanged", "reason"),
                   unused=paths("unused"), not_written=pairs("not_written", "reason"))


@dataclass(frozen=True)
class Results:
    """One session's results file."""

    schema: int
    started: str
    duration_s: float | None
    profile: str | None
    environment: Mapping[str, Any]
    servers: Mapping[str, Mapping[str, Any]]  # spec key -> command, env, engine config, start-up time
    server_starts: int | None
    price: Mapping[str, Any] | None
    machine_factor: MachineFactor | None
    gate: GateEntry
    tests: tuple[TestEntry, ...]
    baseline_update: BaselineUpdate | None = None
    outputs_file: str | None = None  # --specdec-save-outputs: the side file's name, beside the results
    #: each sweep line's crossover and its verdict or error (`output.results.crossover_entry`)
    crossovers: tuple[CrossoverEntry, ...] = ()
    #: the session's machine state against its stored nights
    machine_state: MachineStateEntry | None = None
    #: what failed at the session's end, each ``{"what", "error"}`` (the rest was judged and written)
    errors: tuple[Mapping[str, str], ...] = ()
    #: a merged night (`pytest-specdec merge`): each shard's session start, so `history` reads its shards as its parts
    merged_from: tuple[str, ...] = ()


def render_results(results: Mapping[str, Any]) -> str:
    """A results file's text: the one form the session writes and `convert-schema` writes back (sorted keys, one
    value per line; a value JSON cannot hold, as its text)."""
    return json.dumps(results, indent=1, sort_keys=True, default=str)


def load(data: Any, name: str = "results") -> Results:
    """A parsed results file as typed data; ``name`` (the file's path) is what errors name: a field a reader
    needs and the file lacks is a ResultsError naming where it is missing, for every reader alike."""
    try:
        return _read(_current(data, name), name)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = _missing(data, exc.args[0]) if isinstance(exc, KeyError) else str(exc)
        raise ResultsError(f"{name}: not a pytest-specdec results file as this plugin writes them ({what})") from None


def _read(d: dict[str, Any], name: str) -> Results:
    started = str(d.get("started") or "")
    machine = d.get("machine_factor")
    gate = d.get("gate") or {}
    return Results(
        schema=d["schema"], started=started, duration_s=number(d.get("duration_s")),
        profile=d.get("profile"), environment=d.get("environment") or {}, servers=d.get("servers") or {},
        server_starts=_int(d.get("server_starts")), price=d.get("price"),
        machine_factor=MachineFactor.from_dict(machine) if machine else None,
        gate=GateEntry(**{k: gate[k] for k in ("fail_inconclusive", "fail_machine", "machine_failed",
                                                 "night_variance", "settings") if k in gate}),
        tests=tuple(TestEntry.from_dict(t, f"{name}: tests[{i}]", started) for i, t in enumerate(d.get("tests") or ())),
        baseline_update=(None if d.get("baseline_update") is None
                         else BaselineUpdate.from_dict(d["baseline_update"], f"{name}: baseline_update")),
        outputs_file=d.get("outputs_file") if isinstance(d.get("outputs_file"), str) else None,
        crossovers=tuple(CrossoverEntry.from_dict(x, f"{name}: crossovers[{i}]")
                         for i, x in enumerate(d.get("crossovers") or ())
                         if isinstance(x, Mapping)),
        machine_state=(None if d.get("machine_state") is None
                       else MachineStateEntry.from_dict(d["machine_state"], f"{name}: machine_state")),
        merged_from=tuple(str(m.get("started") or "") for m in d.get("merged_from") or () if isinstance(m, Mapping)),
        errors=tuple({"what": str(e.get("what")), "error": str(e.get("error"))} for e in d.get("errors") or ()
                     if isinstance(e, Mapping)))


#: The fields `schema.load` requires, per level of the file, to say where a missing one is missing.
_REQUIRED = {"test": ("nodeid", "outcome"), "verdict": ("family",), "baseline": ("inconclusive_gated", "ci_level"),
             "machine_factor": ("ci", "log", "n_tests", "threshold", "ci_level")}


def _missing(data: Any, key: Any) -> str:
    """Where a field the reader needed is missing: the first test, verdict or baseline without it."""
    machine = data.get("machine_factor")
    if isinstance(machine, dict) and key in _REQUIRED["machine_factor"] and key not in machine:
        return f"machine_factor has no `{key}`"
    for i, test in enumerate(data.get("tests") or []):
        if not isinstance(test, dict):
            return f"tests[{i}] is not an object"
        if key in _REQUIRED["test"] and key not in test:
            return f"tests[{i}] has no `{key}`"
        for metric, v in (test.get("verdicts") or {}).items():
            if isinstance(v, dict) and key in _REQUIRED["verdict"] and key not in v:
                return f"tests[{i}].verdicts.{metric} has no `{key}`"
        baseline = test.get("baseline")
        if isinstance(baseline, dict) and key in _REQUIRED["baseline"] and key not in baseline:
            return f"tests[{i}].baseline has no `{key}`"
    return f"field {key!r} is missing"


def _current(data: Any, name: str) -> dict[str, Any]:
    """The file as it is, when this plugin's schema wrote it; else an error naming the file, and for an older
    schema the command that converts it."""
    if not isinstance(data, dict):
        raise ResultsError(f"{name}: not a JSON object")
    if wrong := RESULTS_FILE.version_problem(data, name):
        raise ResultsError(wrong[0])
    return data


@dataclass(frozen=True)
class SweepPointEntry:
    """One point of a sweep line as the results hold it: its value on the axis and its pairs' speedups."""

    at: float | None  # the concurrency, or the fraction of saturation of a rate sweep
    speedups: tuple[float, ...]


@dataclass(frozen=True)
class MachineStateEntry:
    """The session's machine state against its stored nights as the results hold it (`gate.machine.StateSummary`, as
    `state_summary_entry` writes it): the one block at the session's end, read back for the terminal and the report
    alike."""

    tonight: Mapping[str, float] | None  # the probe's figures, the geometric mean over the session's tests
    stored: str  # the stored nights' states, as a range
    stored_nights: int
    tolerance_pct: float  # the ratios' tolerance (%)
    #: the tolerance per kind (`ratio`, `absolute`, `source`); None in a file written before tolerances per kind
    tolerance: Mapping[str, Any] | None
    n_compared: int
    #: each test whose gated ratio metrics no stored night of tonight's state could judge: (nodeid, its metrics)
    not_comparable: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def from_dict(cls, d: Any, where: str) -> MachineStateEntry:
        """The section as written; one that is not an object, or lacks a field, is an error naming it."""
        if not isinstance(d, Mapping):
            raise ResultsError(f"{where} is {type(d).__name__}, not an object")
        missing = [k for k in ("tonight", "stored", "stored_nights", "tolerance_pct", "n_compared", "not_comparable")
                   if k not in d]
        if missing:
            raise ResultsError(f"{where} has no `{missing[0]}`")
        tonight, tolerance = d["tonight"], d.get("tolerance")
        return cls(tonight=dict(tonight) if isinstance(tonight, Mapping) else None, stored=str(d["stored"]),
                   stored_nights=int(d["stored_nights"]), tolerance_pct=float(d["tolerance_pct"]),
                   tolerance=dict(tolerance) if isinstance(tolerance, Mapping) else None,
                   n_compared=int(d["n_compared"]),
                   not_comparable=tuple((str(b["nodeid"]), tuple(str(m) for m in b["metrics"]))
                                        for b in d["not_comparable"]))


@dataclass(frozen=True)
class CrossoverEntry:
    """One sweep line's entry in the results' ``crossovers`` (`output.results.crossover_entry`): its points, the
    crossover (or a rate sweep's stop-paying rate) as the gate found it, its verdict against the stored night or the
    base arm, or the error that kept it from one."""

    sweep: str
    line: str
    tests: tuple[str, ...]
    axis: str  # concurrency, or rate_fraction
    saturation_req_s: float | None
    points: tuple[SweepPointEntry, ...]
    #: the statistic's own fields (`gate.baselines.crossover_value_entry`): side, value, ci, text, ...
    crossover: Mapping[str, Any] | None
    verdict: VerdictEntry | None
    family: str
    stored: Mapping[str, Any] | None  # {"started", "text"} of the stored night judged against
    note: str | None
    error: str | None
    failed: bool
    path: str | None = None

    @property
    def crossover_text(self) -> str | None:
        text = (self.crossover or {}).get("text")
        return str(text) if text else None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> CrossoverEntry:
        """An entry as written; its verdict's words checked (an unknown one names its field)."""
        axis = str(d.get("axis") or "concurrency")
        v = d.get("verdict")
        points = tuple(SweepPointEntry(at=number(p.get(axis)),
                                       speedups=tuple(x for x in p.get("speedups") or () if number(x) is not None))
                       for p in d.get("points") or () if isinstance(p, Mapping))
        crossover, stored = d.get("crossover"), d.get("stored")
        return cls(sweep=str(d.get("sweep") or ""), line=str(d.get("line") or ""),
                   tests=tuple(str(n) for n in d.get("tests") or ()), axis=axis,
                   saturation_req_s=number(d.get("saturation_req_s")), points=points,
                   crossover=crossover if isinstance(crossover, Mapping) else None,
                   verdict=(VerdictEntry.from_dict(str(d.get("sweep") or "crossover"), v, f"{where}.verdict")
                            if isinstance(v, Mapping) else None),
                   family=str(d.get("family") or SHOWN), stored=stored if isinstance(stored, Mapping) else None,
                   note=str(d["note"]) if d.get("note") else None,
                   error=str(d["error"]) if d.get("error") else None, failed=bool(d.get("failed")),
                   path=str(d["path"]) if d.get("path") else None)


def _mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _ints(xs: Any) -> tuple[int, ...]:
    return tuple(n for x in xs or () if (n := _int(x)) is not None)


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


# ---- the format: older results files, step by step ------------------------------------------------------

#: Schema-1 outcomes of a test that failed or skipped outside its call: "failed (setup)".
_PHASED = re.compile(r"(\w+) \((setup|call|teardown)\)")
#: The level a schema-1 verdict's note named ("90% CI ..."), for the files that recorded no `ci_level`.
_CI_IN_NOTE = re.compile(r"(\d+(?:\.\d+)?)% CI\b")
#: Schema 2 named the summary's throughputs and per-token ITL apart from the runs and the verdicts.
_SUMMARY_NAMES_2 = {"output_tps": "output_tok_s", "reference_output_tps": "reference_tok_s", "itl_ms": "itl_token_ms"}


def _runs(test: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    return (*(test.get("runs") or ()), *(test.get("reference_runs") or ()))


def _from_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 grew field by field; each missing field gets the value its absence meant:

    - `outcome` "failed (setup)" splits into `outcome` and `when`; a run without `valid` or
      `latency_untrusted` was valid and trusted;
    - a verdict without `family` could fail its test: gated (or as its baseline's `gate` says);
      without `mde`/`se`/`df` no variance model was recorded;
    - a baseline without `ci_level` gets it from `alpha` and `max_looks`, else from its verdicts' notes (a
      level given in percent becomes a fraction); without `inconclusive_gated`, from its verdicts;
    - the machine factor's `line` (prose) goes; a workaround without `applied` was applied, its `detail`
      is its `reason`.
    """
    for test in data.get("tests") or []:
        outcome = str(test.get("outcome") or "pending")
        phased = _PHASED.fullmatch(outcome)
        test["outcome"], test["when"] = ((phased[1], phased[2]) if phased else
                                         (outcome, "call" if outcome in ("passed", "failed", "skipped") else None))
        verdicts = test.get("verdicts") or {}
        baseline = test.get("baseline")
        gate = (baseline or {}).get("gate")
        for metric, v in verdicts.items():
            v.setdefault("family", GATED if not gate or metric in gate else SHOWN)
            for key in ("mde", "se", "df"):
                v.setdefault(key, None)
        for run in _runs(test):
            run.setdefault("valid", True)
            run.setdefault("latency_untrusted", [])
        if isinstance(baseline, dict):
            level = number(baseline["ci_level"]) if "ci_level" in baseline else _ci_level_1(baseline, verdicts)
            baseline["ci_level"] = (None if level is None or not 0 < level < 100
                                    else level / 100 if level >= 1 else level)
            baseline.setdefault("inconclusive_gated", [m for m, v in verdicts.items()
                                                       if v["family"] == GATED and v.get("verdict") == INCONCLUSIVE])
    machine = data.get("machine_factor")
    if isinstance(machine, dict):
        machine.pop("line", None)
    env = data.get("environment") or {}
    env["workarounds"] = [_workaround_1(w) for w in env.get("workarounds") or []]
    return data


def _ci_level_1(baseline: Mapping[str, Any], verdicts: Mapping[str, Mapping[str, Any]]) -> float | None:
    alpha, looks = number(baseline.get("alpha")), baseline.get("max_looks")
    if alpha is not None and 0 < alpha < 0.5:
        return 1 - 2 * alpha / (looks if isinstance(looks, int) and looks >= 1 else 1)
    for v in verdicts.values():
        m = _CI_IN_NOTE.search(str(v.get("note") or ""))
        if m:
            return float(m.group(1)) / 100
    return None


def _workaround_1(w: Any) -> dict[str, Any]:
    if not isinstance(w, dict):
        return {"name": str(w), "applied": True, "reason": None}
    out = dict(w)
    out.setdefault("applied", True)
    out.setdefault("reason", out.pop("detail", None))
    return out


def _from_2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 → 3: a test's summary takes the registry's names (`output_tok_s`, `reference_tok_s`,
    `itl_token_ms`), as its runs and verdicts always had."""
    for test in data.get("tests") or []:
        summary = test.get("summary")
        if isinstance(summary, dict):
            test["summary"] = {_SUMMARY_NAMES_2.get(k, k): v for k, v in summary.items()}
    return data


def accepted_counts(run: Mapping[str, Any]) -> list[int] | None:
    """A results run's accepted tokens per draft position as counts (its rates times its drafts)."""
    drafts, per_pos = run.get("drafts"), run.get("per_position_acceptance")
    return [round(a * drafts) for a in per_pos] if per_pos and drafts else None


def printed_capture_size(config: Mapping[str, Any]) -> int | None:
    """The largest CUDA-graph capture size in an engine config's text values: older results files kept
    compilation_config as vLLM printed it (`{'cudagraph_capture_sizes': [1, 2, 512], ...}`)."""
    text = " ".join(v for v in config.values() if isinstance(v, str))
    m = re.search(r"max_cudagraph_capture_size['\"]?\s*[:=]\s*(\d+)", text)
    if m:
        return int(m.group(1))
    sizes = re.search(r"cudagraph_capture_sizes['\"]?\s*[:=]\s*\[([^\]]*)\]", text)
    found = re.findall(r"\d+", sizes.group(1)) if sizes else []
    return max(int(x) for x in found) if found else None


def _flat_numbers(config: dict[str, Any]) -> None:
    """An engine config's capture size and token budget as numbers, where an older file kept them as text."""
    for key in ("max_cudagraph_capture_size", "max_num_batched_tokens"):
        if isinstance(config.get(key), str) and config[key].isdecimal():
            config[key] = int(config[key])
    if "max_cudagraph_capture_size" not in config and not isinstance(config.get("cudagraph_capture_sizes"), list):
        size = printed_capture_size(config)
        if size is not None:
            config["max_cudagraph_capture_size"] = size


def _from_3(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 → 4: runs carry the run record's fields (`accepted_per_pos`, and any a file lacks: null);
    engine configs their capture size and token budget as numbers."""
    for test in data.get("tests") or []:
        for key in ("runs", "reference_runs"):
            if key in test:
                test[key] = [run_record({**r, "accepted_per_pos": accepted_counts(r)}, {}) for r in test[key]]
    for server in (data.get("servers") or {}).values():
        if isinstance(server, dict) and isinstance(server.get("engine_config"), dict):
            _flat_numbers(server["engine_config"])
    return data


def _from_4(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 4 → 5: the gate's setting `fdr` is `multiplicity`, in its place among the settings."""
    gate = data.get("gate")
    if isinstance(gate, dict) and isinstance(gate.get("settings"), dict) and "fdr" in gate["settings"]:
        gate["settings"] = {("multiplicity" if k == "fdr" else k): v for k, v in gate["settings"].items()}
    return data


def _counts(data: Mapping[str, Any]) -> tuple[int, int]:
    """(tests, runs) of a results file."""
    tests = data.get("tests") or []
    return len(tests), sum(len(list(_runs(t))) for t in tests)


#: A session's results file.
RESULTS_FILE = FileFormat(kind="results", version=RESULTS_SCHEMA, detect=lambda d: "tests" in d,
                          render=render_results, read=load, counts=_counts,
                          steps={1: _from_1, 2: _from_2, 3: _from_3, 4: _from_4}, counted="tests, runs")


# ---- the layers' typed values, as this file stores them ------------------------------------------------------
# The gate, the measurement and the server layers hand these over as frozen values; their JSON shape is written
# here, beside the rest of the document, and read back here (or by the class's own reader where the layer keeps one:
# `StateTolerance.from_setting`, `NightPrior.from_dict`, `gate.thresholds.from_dict`).


def machine_factor_entry(m: MachineFactor) -> dict[str, Any]:
    """The session's ``machine_factor`` (`gate.machine.MachineFactor.from_dict` reads it back: the CI bounds as
    factors, the mean as a log)."""
    return {"factor": m.factor, "log": m.log, "ci": [math.exp(m.ci_low), math.exp(m.ci_high)],
            "ci_level": m.level, "n_tests": m.n_tests, "threshold": m.threshold, "beyond_threshold": m.beyond}


def state_summary_entry(s: StateSummary) -> dict[str, Any]:
    """The session's ``machine_state``: ``tolerance_pct`` is the ratios' (the gated speedup's); ``tolerance``
    gives each kind's and its source."""
    from pytest_specdec.gate.machine import describe_range

    return {"tonight": None if s.tonight is None else dict(s.tonight),
            "stored": describe_range(s.stored), "stored_nights": len(s.stored),
            "tolerance_pct": s.tolerance.ratio, "tolerance": state_tolerance_entry(s.tolerance),
            "n_compared": s.n_compared,
            "not_comparable": [{"nodeid": n, "metrics": list(m)} for n, m in s.not_comparable]}


def state_tolerance_entry(t: StateTolerance) -> dict[str, Any]:
    """A state tolerance per kind and its source: ``gate.settings.machine_state_tolerance``, the calibration's
    ``state_tolerance`` and the ``machine_state``'s ``tolerance`` (`gate.machine.StateTolerance.from_setting` reads
    it back)."""
    return {"ratio": t.ratio, "absolute": t.absolute, "source": t.source}


def night_prior_entry(p: NightPrior) -> dict[str, Any]:
    """``gate.settings.night_prior``: the night prior the session judged with, for `compare` to judge with the same
    (`gate.variance.NightPrior.from_dict` reads it back)."""
    return {"sd": dict(p.sd), "df": p.df, "dfs": dict(p.dfs), "source": p.source}


def thresholds_entry(t: Thresholds) -> dict[str, Any]:
    """Thresholds as the results keep them (``gate.settings.thresholds``, a test's ``baseline.thresholds`` and
    ``ab.thresholds``): the kinds' magnitudes and the per-metric ones (`gate.thresholds.from_dict` reads them
    back)."""
    from pytest_specdec.gate.registry import KINDS
    from pytest_specdec.gate.scale import THRESHOLD_FIELD

    return {**{kind: getattr(t, THRESHOLD_FIELD[kind]) for kind in KINDS}, "per_metric": dict(t.per_metric)}


def calibration_used_entry(c: CalibrationUsed) -> dict[str, Any]:
    """``gate.settings.calibration``: where the calibration is, its sessions, what a lone test catches, the
    thresholds it raised, and a state tolerance of its own where it measured one (what `output.wording.night_lines`
    words, from the session and from a file alike)."""
    return {"path": c.path, "sessions": c.sessions, "catches": c.catches,
            "raised_thresholds": {name: list(pair) for name, pair in c.raised_thresholds.items()},
            **({"state_tolerance": state_tolerance_entry(c.state_tolerance)} if c.state_tolerance is not None
               else {})}


#: The `RunMetrics` fields of goodput, left out of a run's figures where no SLOs were given.
_GOODPUT_FIELDS: frozenset[str] = frozenset({"goodput_req_s", "good_requests", "goodput_slos_ms"})


def run_metrics_entry(m: RunMetrics) -> dict[str, Any]:
    """A run's figures (`measure.metrics.RunMetrics`) flat, as a results run holds them (and the zoo's measurement
    its runs): the counter figures (``spec``, ``engine``) beside the rest, None for each of their fields where there
    are none; the goodput fields only for a run counted against SLOs (a test without them writes what it wrote
    before)."""
    from pytest_specdec.measure.metrics import EngineFigures, SpecFigures

    nested: dict[str, type] = {"spec": SpecFigures, "engine": EngineFigures}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(m):
        value, kind = getattr(m, f.name), nested.get(f.name)
        if f.name in _GOODPUT_FIELDS and m.goodput_slos_ms is None:
            continue
        if kind is None:
            out[f.name] = copy.deepcopy(value)
        elif value is None:
            out.update(dict.fromkeys(g.name for g in dataclasses.fields(kind)))
        else:
            out.update(dataclasses.asdict(value))
    return out


def machine_entry(m: Machine) -> dict[str, Any]:
    """One machine's baselines of the profile: its folder, name, files and, for another machine, how it differs."""
    return {"key": m.key, "name": m.name, "files": m.files, **({"differs": list(m.differs)} if m.differs else {})}


def hardware_entry(h: Hardware) -> dict[str, Any]:
    """``gate.settings.hardware``: this machine's baselines and every other machine's of the profile."""
    return {"profile": h.profile, "root": h.root, "this": machine_entry(h.this),
            "others": [machine_entry(m) for m in h.others]}


def baseline_writes_entry(w: BaselineWrites) -> dict[str, Any]:
    """``baseline_update``: what --update-baselines wrote, kept, left unused and could not write, with why."""
    return {"root": w.root, "mode": w.mode, "created": list(w.created),
            "updated": [{"path": p, "change": c} for p, c in w.updated],
            "unchanged": [{"path": p, "reason": r} for p, r in w.unchanged],
            "unused": list(w.unused),
            "not_written": [{"path": p, "reason": r} for p, r in w.not_written]}


def endpoint_entry(f: EndpointFacts) -> dict[str, Any]:
    """One ``endpoints`` entry: what a server the session did not start told of itself."""
    return {"url": f.url, "models": list(f.models), "speculating": f.speculating, "k": f.k,
            "speculative_config": f.speculative_config, "server_info": f.server_info,
            "engine_config": f.engine_config, "vllm_version": f.vllm_version,
            "version_source": f.version_source, "torch_version": f.torch_version,
            "cuda_version": f.cuda_version, "driver_version": f.driver_version}


def session_time_entry(t: SessionTime) -> dict[str, Any]:
    """The session's ``time``: where its wall time went, rounded as the terminal line gives it."""
    eff = t.efficiency
    return {"wall_s": round(t.wall_s, 2), "runs_s": round(t.runs_s, 2), "server_starts_s": round(t.starts_s, 2),
            "waits_s": round(t.waits_s, 2), "runs": t.runs, "efficiency": None if eff is None else round(eff, 3)}


def chunking_entry(c: Chunking) -> dict[str, Any]:
    """A run's ``chunking``: tokens per SSE event and per client read (JSON keys are strings; sorted by token
    count), and how many arrived in reads beyond one engine step."""
    return {"step_limit": c.step_limit, "tokens": c.tokens,
            "over_limit_tokens": c.over_limit_tokens, "over_limit_share": c.over_limit_share,
            "merged_events": c.merged_events, "max_event_tokens": c.max_event_tokens,
            "max_read_events": c.max_read_events,
            "events": {str(k): v for k, v in sorted(c.events.items())},
            "reads": {str(k): v for k, v in sorted(c.reads.items())}}


def saturation_entry(s: Saturation) -> dict[str, Any]:
    """A rate sweep's saturation run: the reference's throughput with every request in flight."""
    return {"req_s": s.req_s, "output_tok_s": s.output_tok_s, "n_requests": s.n_requests,
            "duration_s": s.duration_s, "concurrency": s.concurrency, "measured_by": s.measured_by}


def rate_point_entry(p: RatePoint) -> dict[str, Any]:
    """A test's ``rate_sweep``: its fraction of the saturation, the rate it offered and the saturation run."""
    return {"fraction": p.fraction, "points": p.points, "request_rate": p.request_rate,
            "saturation_req_s": p.saturation.req_s, "saturation": saturation_entry(p.saturation)}


def night_variance_entry(v: NightVariance) -> dict[str, Any]:
    """One ``gate.night_variance`` entry: every field of the pooled estimate, as it was used."""
    return dataclasses.asdict(v)


def quiet_entry(q: Quiet) -> dict[str, Any]:
    """A run's ``settle``: how long it waited for the servers to go quiet, whether they did, and how it watched."""
    return {"waited_s": round(q.waited_s, 3), "quiet": q.quiet, "cores": round(q.cores, 3), "how": q.how,
            "requests": q.requests, "after_run_s": None if q.after_run_s is None else round(q.after_run_s, 3)}


def install_entry(i: Install) -> dict[str, Any]:
    """An upgrade A/B side's ``install``: its interpreter and what tells it apart (`Install.versions`)."""
    return {"python": i.python, **i.versions()}


def split_entry(s: Split) -> dict[str, Any]:
    """A speedup change split into acceptance and step time: its six figures, and the derived ones a reader
    without the plugin wants (changes in %, the logs, the acceptance's share, the cause)."""
    return {**dataclasses.asdict(s), "speedup_change_pct": s.speedup_change_pct,
            "tau_change_pct": s.tau_change_pct, "step_change_pct": s.step_change_pct,
            "acceptance_log": s.acceptance_log, "step_log": s.step_log,
            "acceptance_share": s.acceptance_share, "cause": s.cause()}


def split_of(d: Mapping[str, Any]) -> Split:
    """A split as `split_entry` wrote it (its derived figures are computed again)."""
    from pytest_specdec.measure.explain import Split

    return Split(**{f.name: float(d[f.name]) for f in dataclasses.fields(Split)})


def run_acceptance_entry(r: RunAcceptance) -> dict[str, Any]:
    """A run's ``per_request_acceptance``: its requests' acceptance table (as the summary's `request_acceptance`
    gives a test's), and the requests that carried no figures or failed."""
    return {**request_acceptance_entry(r.table), "missing": r.missing, "failed": r.failed}


def summary_entry(s: Summary | None) -> dict[str, Any]:
    """A test's ``summary`` (`measure.summary.Summary`), and the test's `specdec.summary` alike: a test with goodput
    SLOs starts with its goodput figures; every latency's percentiles by its name; ``{}`` for a test that never
    measured. `TestEntry.summary` reads it back by name."""
    if s is None:
        return {}
    return {
        **({} if s.goodput is None else goodput_entry(s.goodput)),
        "valid_runs": s.valid_runs,
        "latency_runs": s.latency_runs,
        "valid_reference_runs": s.valid_reference_runs,
        "output_tok_s": s.output_tok_s,
        "reference_tok_s": s.reference_tok_s,
        "speedup": s.speedup,
        "pairs": s.pairs,
        "pairs_dropped": None if s.pairs_dropped is None else [{"index": i, "why": why} for i, why in s.pairs_dropped],
        "acceptance_rate": s.acceptance_rate,
        "acceptance_length": s.acceptance_length,
        "per_position_acceptance": None if s.per_position_acceptance is None else list(s.per_position_acceptance),
        "draft_coverage": s.draft_coverage,
        "acceptance_source": s.acceptance_source,
        "request_acceptance": None if s.request_acceptance is None else request_acceptance_entry(s.request_acceptance),
        **{name: dataclasses.asdict(p) for name, p in s.latencies.items()},
        "explain": None if s.explain is None else explained_entry(s.explain),
    }


def goodput_entry(g: GoodputSummary) -> dict[str, Any]:
    """A test's goodput figures in its summary (`output.progress.goodput_text` words them)."""
    return {"goodput": g.goodput, "goodput_pairs": g.pairs,
            "goodput_undefined": [{"index": i, "why": why} for i, why in g.undefined],
            "goodput_req_s": g.req_s, "reference_goodput_req_s": g.reference_req_s}


def acceptance_entry(a: Acceptance) -> dict[str, Any]:
    """Acceptance over some units: the counts, the rate, τ and the interval over the units (`AcceptanceEntry` reads
    it back)."""
    from pytest_specdec.measure.figures import tau

    return {"units": a.units, "drafts": a.drafts, "draft_tokens": a.draft_tokens,
            "accepted_tokens": a.accepted_tokens, "acceptance_rate": a.rate,
            "acceptance_length": tau(a.drafts, a.accepted_tokens),
            "ci": None if a.ci is None else list(a.ci)}


def request_acceptance_entry(t: AcceptanceTable) -> dict[str, Any]:
    """The summary's ``request_acceptance``: what the intervals are over and their level, the overall figures,
    the histogram of verify steps by accepted draft tokens, and the figures per dataset category
    (`RequestAcceptanceEntry` reads it back; a run's ``per_request_acceptance`` has the same shape,
    `run_acceptance_entry`)."""
    return {"unit": t.unit, "ci_level": t.ci_level, **acceptance_entry(t.overall),
            "acceptance_histogram": list(t.histogram),
            "by_category": {c: acceptance_entry(a) for c, a in t.by_category.items()}}


def explained_entry(e: Explained) -> dict[str, Any]:
    """The summary's ``explain``: every figure of the speedup explained (`measure.explain.Explained`), by its
    field's name (what the terminal, the report and `history` read, from a session or a file)."""
    return dataclasses.asdict(e)


def drift_verdict_entry(v: DriftVerdict) -> dict[str, Any]:
    """One drift verdict: every field, its interval and run lists as lists (`drift_of` reads it back)."""
    d = dataclasses.asdict(v)
    d["ci"] = list(v.ci) if v.ci is not None else None
    for key in ("early_runs", "late_runs", "left_out"):
        d[key] = list(d[key])
    return d


def drift_entry(d: Drift) -> dict[str, Any]:
    """A test's ``drift``: each verdict as it stands, with its ``unadjusted`` word, p and note beside it (None: not
    adjusted yet), as the baseline's verdicts keep theirs."""
    raw = {v.metric: v for v in d.verdicts}
    return {"alpha": d.alpha, "verdicts": {v.metric: {
        **drift_verdict_entry(v), "unadjusted": None if d.adjusted is None else {
            "verdict": raw[v.metric].verdict, "p": raw[v.metric].p, "note": raw[v.metric].note}}
        for v in d.shown}}
