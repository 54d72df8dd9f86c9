"""A results file judged as the plugin judges a session, through the gate's one pipeline (`gate/pipeline.py`):
against a profile's stored baselines (exactly the session's own verdicts), or against another results file
(OLD's runs of each test become a baseline of one night). Nothing here re-implements a statistic.

A results file's test carries its runs as the one run record (`gate.nights.Night`, read by `schema.load`), so a
night of a results file and a night of a baseline file are the same thing. A test in one file only, or without
valid runs on one side, is listed as such, never dropped.

What fails the comparison is what fails the test in the plugin: a gated regression of a test that did not opt
out (`check=False` is shown, never failed), and NEW without a valid run on an arm (the plugin fails such a
test whatever its `check`, since an arm is never judged on the other arm's figures).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.kinds import (
    GATED,
    IMPROVED,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    REGRESSED,
    UNCHANGED,
    Decision,
    Status,
)
from pytest_specdec.output.schema import Results, ResultsError, TestEntry

if TYPE_CHECKING:
    from pytest_specdec.gate.crossover_gate import SweepOutcome
    from pytest_specdec.gate.machine import MachineFactor, StateTolerance
    from pytest_specdec.gate.stats import Thresholds, Verdict
    from pytest_specdec.gate.variance import NightPrior
    from pytest_specdec.measure.explain import Split

def conditions(results: Results, test: TestEntry, datasets: Mapping[str, Any]) -> dict[str, Any]:
    """What must be equal for a comparison to mean anything, as far as a results file records it: the
    profile, hardware and target model, the test's case (params) and sampling, and the sha256 of the prompts
    of its dataset (``datasets``: the file's `datasets`, which the typed Results leave out)."""
    env = results.environment
    dataset = test.params.get("dataset")
    info = datasets.get(dataset) if isinstance(dataset, str) else None
    return {
        "profile": results.profile, "hardware": env.get("hardware"), "target_model": target(env),
        "params": dict(test.params), "sampling": dict(test.sampling or {}),
        "dataset_sha256": info.get("prompts_sha256") if isinstance(info, Mapping) else None,
    }


def target(env: Mapping[str, Any]) -> dict[str, Any]:
    """The target model as baselines compare it: its recorded identity (id and content hash of a local
    model); a file without one recorded the profile's target as given, where a local path names the
    checkout, not the model, so only its last part is kept."""
    identity = env.get("target_identity")
    if isinstance(identity, Mapping):
        return dict(identity)
    name = str(env.get("target_model") or "")
    return {"id": Path(name).name if Path(name).is_absolute() else name}


def same_footing(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Conditions compared on what both files record: a content hash only one of them has is left out."""
    a, b = dict(old["target_model"]), dict(new["target_model"])
    if ("sha256" in a) != ("sha256" in b):
        a.pop("sha256", None)
        b.pop("sha256", None)
    return {**old, "target_model": a}, {**new, "target_model": b}


#: A test's gated verdicts, the worst first: the one word `Row.word` tells it by.
WORST_FIRST: tuple[Decision, ...] = (REGRESSED, INCONCLUSIVE, IMPROVED, UNCHANGED)


@dataclass
class Row:
    """One test of the comparison: its verdicts (gated and shown), or why it has none."""

    nodeid: str
    status: str  # compared | not-comparable | only in OLD | only in NEW | no runs | not judged
    verdicts: list[Verdict] = field(default_factory=list)
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # not-comparable: what differs
    reason: str = ""
    checked: bool = True  # False: NEW's test opted out (check=False): its verdicts are shown, never failed
    dead: bool = False  # NEW has an arm without a valid run: the plugin fails the test for it
    split: Split | None = None  # the speedup's change OLD → NEW in acceptance and step time (`measure.explain`)

    def failed(self, strict: bool = False) -> bool:
        """Whether this test fails the comparison: the session's rule (`gate.check.FailRule`) over NEW's verdicts;
        a test with no baseline to compare with (only in NEW, no runs) fails only for a dead arm."""
        from pytest_specdec.gate.check import FailRule

        status: Status = ("compared" if self.status == "compared" else NOT_COMPARABLE
                          if self.status == NOT_COMPARABLE else "missing")
        return FailRule(strict=strict).decide(checked=self.checked, status=status, verdicts=self.verdicts,
                                              dead=self.dead).fails

    @property
    def gated(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.family == GATED]

    @property
    def regressed(self) -> bool:
        return any(v.verdict == REGRESSED for v in self.gated)

    @property
    def word(self) -> str:
        """The test's worst gated verdict, as the report's status reads it (regressed before inconclusive)."""
        seen = {v.verdict for v in self.gated}
        word = next((w for w in WORST_FIRST if w in seen), "no verdicts")
        return word + (" (check=False: shown, not failed)" if word == REGRESSED and not self.checked else "")


@dataclass
class Comparison:
    """Every test of both files, in NEW's order then OLD's leftovers, and the session-level figures."""

    rows: list[Row]
    machine: MachineFactor | None
    alpha: float
    multiplicity: str
    #: NEW's concurrency sweeps, judged as the session judges them: a gated regression or an error fails
    crossovers: list[SweepOutcome] = field(default_factory=list)
    #: against stored baselines: the machines' folders NEW's tests were judged against (their path, their name)
    machines: tuple[tuple[str, str], ...] = ()

    @property
    def regressed(self) -> list[Row]:
        """Every test with a regressed gated metric, those that opted out included."""
        return [r for r in self.rows if r.regressed]

    def failed(self, strict: bool = False) -> list[Row]:
        """The tests that make the comparison fail (exit 1), as `Row.failed` says."""
        return [r for r in self.rows if r.failed(strict)]

    @property
    def failed_sweeps(self) -> list[SweepOutcome]:
        """The sweeps that make the comparison fail (exit 1) as they fail the session: a gated regression, an error."""
        return [x for x in self.crossovers if x.failed]


def arms_without_valid_run(test: TestEntry) -> list[str]:
    """The arms of a results file's test with no valid run (`Night.arms_without_valid_run`). A test serves a
    spec arm when it recorded one (`servers`), or, in a file without servers, when its method is not the
    reference."""
    spec = "spec" in test.servers if test.servers else test.params.get("method") != "none"
    return test.night.arms_without_valid_run(spec=spec)


@dataclass(frozen=True)
class StoredDir:
    """OLD as a profile's stored baselines (`baselines/<profile>/`): what the plugin reads in a session. Each
    test of NEW is judged against the folder of the machine it was measured on (its recorded comparability),
    or against the one machine's folder named on the command line (``hardware``)."""

    root: Path  # the baselines' root, as --specdec-baselines names it
    profile: str
    hardware: str | None = None  # `baselines/<profile>/<hardware>/` given as OLD: every test against it

    def store(self, comparability: Mapping[str, Any]) -> Any:
        """The store of the machine a test's comparability names (or of ``hardware``)."""
        from pytest_specdec.gate.store import BaselineStore

        fingerprint = {k: comparability.get(k) for k in ("hardware", "device", "device_count", "identity")
                       if k in comparability}
        store = BaselineStore(self.root, self.profile, fingerprint, mode=None, keep=1)
        if self.hardware is not None:
            store.hardware = self.hardware
        return store


def test_thresholds(test: TestEntry, session: Thresholds, override: Mapping[str, float], where: str) -> Thresholds:
    """The thresholds a test was judged with, as its results recorded them (its marker's included), with
    the command line's --threshold on top; the session's where the file recorded none."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.gate.thresholds import from_dict, on_top

    recorded = test.baseline.thresholds if test.baseline else None
    try:
        return on_top(from_dict(recorded, f"{where}.baseline.thresholds") if recorded is not None else session,
                      override)
    except ConfigError as exc:
        raise ResultsError(str(exc)) from None


def compare(old: Results | StoredDir, new: Results, *, thresholds: Thresholds, override: Mapping[str, float]
            | None = None, alpha: float = 0.05, multiplicity: str = "bh", min_night_sd: float = 0.0,
            night_prior: NightPrior | None = None,
            state_tolerance: StateTolerance | None = None, old_name: str = "OLD", new_name: str = "NEW",
            datasets: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None) -> Comparison:
    """NEW's tests judged through the gate's one pipeline (`gate.pipeline.judge_all`), as the plugin judges a
    session: against a baseline directory (``StoredDir``: each test against its own file, the night variances,
    priors and night factors from every file of the profile, the profile's night sd floor), or against
    another results file (each of OLD's tests a baseline of one night; the priors from OLD's tests, never
    NEW's). Each test is judged at the look it ended on, with the thresholds it recorded (``override``, the
    command line's, on top; ``thresholds`` where it recorded none); the machine factor comes from every
    compared test's reference arm."""
    from dataclasses import replace

    from pytest_specdec.gate.baselines import BaselineError, diff
    from pytest_specdec.gate.check import Judgement, Look, Plan
    from pytest_specdec.gate.pipeline import Pipeline, Stored, judge_all
    from pytest_specdec.gate.registry import GATED

    override = override or {}
    new_tests = {t.nodeid: (i, t) for i, t in enumerate(new.tests)}
    old_tests = {t.nodeid: (i, t) for i, t in enumerate(old.tests)} if isinstance(old, Results) else {}
    stores: dict[str, Any] = {}  # a machine's folder -> its store, for StoredDir
    rows: list[Row] = []
    checks: list[tuple[str, Judgement]] = []
    stored: list[dict[str, Any]] = []
    for nodeid, (j, now) in new_tests.items():
        where = f"{new_name}: tests[{j}]"
        checked = now.baseline.checked if now.baseline else True
        dead = arms_without_valid_run(now)
        then_ = old_tests[nodeid][1] if nodeid in old_tests else None
        outcomes = "; ".join(f"{n}: {t.outcome}" for n, t in ((old_name, then_), (new_name, now)) if t is not None)
        reason = (f"no valid run on the {' and '.join(dead)} arm{'s' if len(dead) > 1 else ''} in {new_name} "
                  f"({outcomes}); it fails, as the plugin fails a test without a valid {' or '.join(dead)} run"
                  ) if dead else ""
        gate = tuple(dict.fromkeys((*GATED, *(now.baseline.gate if now.baseline else ()))))
        # judged as the session judged it: at the look it ended on, each look the runs it recorded
        plan = Plan(path=Path(old_name), status="compared", checked=True, comparability={}, under_test={},
                    alpha=alpha, gate=gate, thresholds=test_thresholds(now, thresholds, override, where),
                    max_looks=now.baseline.max_looks if now.baseline else 1)
        looks = tuple(Look(n) for n in (now.baseline.looks if now.baseline else ()))
        if isinstance(old, StoredDir):
            if now.baseline is None or now.baseline.comparability is None:
                rows.append(Row(nodeid, "not judged", reason=f"{where} records no conditions to check against "
                                "a stored baseline (the plugin judged no baseline for it)", checked=checked))
                continue
            store = old.store(now.baseline.comparability)
            store = stores.setdefault(store.hardware, store)
            try:
                path, data = store.read(nodeid, "pytest --update-baselines")
            except BaselineError as exc:
                rows.append(Row(nodeid, "not judged", reason=str(exc), checked=checked, dead=bool(dead)))
                continue
            if data is None:
                rows.append(Row(nodeid, f"only in {new_name}", reason=f"no baseline at {path}", checked=checked,
                                dead=bool(dead)))
                continue
            plan = replace(plan, path=path, baseline=data,
                           differs=diff(data["comparability"], dict(now.baseline.comparability)))
        else:
            assert isinstance(old, Results)
            if nodeid not in old_tests:
                rows.append(Row(nodeid, f"only in {new_name}", checked=checked, dead=bool(dead), reason=reason))
                continue
            i, then = old_tests[nodeid]
            gone = arms_without_valid_run(then)
            if gone:  # no baseline the plugin would have written
                rows.append(Row(nodeid, "no runs", reason=f"no valid run on the {' and '.join(gone)} arm"
                                f"{'s' if len(gone) > 1 else ''} in {old_name} ({outcomes})"
                                + (f"; and {reason}" if reason else ""), checked=checked, dead=bool(dead)))
                continue
            baseline = {"sessions": [then.night.to_entry()]}
            stored.append(baseline)
            sets = datasets or ({}, {})
            plan = replace(plan, baseline=baseline, differs=diff(*same_footing(conditions(old, then, sets[0]),
                                                                               conditions(new, now, sets[1]))))
        plan = replace(plan, status=NOT_COMPARABLE if plan.differs else "compared")
        rows.append(Row(nodeid, "no runs" if dead else plan.status, fields=dict(plan.differs), checked=checked,
                        dead=bool(dead), reason=reason))
        checks.append((nodeid, Judgement(plan, night=now.night, looks_taken=looks)))
    if isinstance(old, Results):
        rows += [Row(n, f"only in {old_name}") for n in old_tests if n not in new_tests]
    else:  # the priors from the files of the machines judged against, as the plugin's session reads them
        stored = [data for s in stores.values() for data in s.readable()]
    pipeline = Pipeline(Stored(tuple(stored), min_night_sd, night_prior), alpha, multiplicity, state_tolerance)
    machine, judged_all = judge_all(pipeline, checks, thresholds)
    by_id = dict(judged_all)
    from pytest_specdec.gate.verdicts import baseline_split

    for row in rows:
        judged = by_id.get(row.nodeid)
        if judged is not None:
            row.verdicts = list(judged.final or [])
            row.split = baseline_split(judged.plan.baseline, judged.night)
    from pytest_specdec.gate.baselines import hardware_label

    machines = tuple((str(s.base), hardware_label(s.fingerprint) + _none_there(s)) for s in stores.values())
    sweeps = crossovers(old, new, rows, stores, alpha=alpha,
                        tolerance=None if state_tolerance is None else state_tolerance.ratio, old_name=old_name)
    return Comparison(rows, machine, alpha, multiplicity, sweeps, machines)


def crossovers(old: Results | StoredDir, new: Results, rows: Sequence[Row], stores: Mapping[str, Any], *,
               alpha: float, tolerance: float | None, old_name: str = "OLD") -> list[SweepOutcome]:
    """Each of NEW's concurrency sweeps judged as the plugin's session judges it (`output.sweeps.judge_results`):
    against OLD's same sweep (its tests in a results file) or the last night of its stored record in the folder
    of the machine its tests were judged against (``stores``); a member's status is its row's."""
    from pytest_specdec.gate.baselines import load_sweep, sweep_path
    from pytest_specdec.gate.crossover_gate import StoredNight, Sweep, stored_night
    from pytest_specdec.output.sweeps import judge_results, stored_nights

    def read(sweep: Sweep) -> tuple[StoredNight | None, str]:
        if isinstance(old, Results):
            return nights.get(sweep.sweep), unread.get(sweep.sweep, f"not in {old_name}")
        key = old.hardware or next(iter(stores), None)
        path = None if key is None else sweep_path(old.root, old.profile, key, sweep.sweep)
        record = None if path is None else load_sweep(path)
        if record and record["nights"]:
            return stored_night(record["nights"][-1], str(path), sweep.axis), ""
        return None, f"no stored night ({path})"

    nights, unread = stored_nights(old, alpha) if isinstance(old, Results) else ({}, {})
    status = {r.nodeid: (r.status if r.status in ("compared", NOT_COMPARABLE) else "missing", r.checked)
              for r in rows}
    return judge_results(new.tests, status, read, alpha=alpha, tolerance=tolerance)


def _none_there(store: Any) -> str:
    """What a machine's folder without files leaves NEW with, and which machines have baselines instead."""
    if store.all_files():
        return ""
    others = "; ".join(f"{m.name} ({m.key})" for m in store.machines().others) or "none"
    return (f" (that folder holds no baselines, so nothing of NEW could be judged; the profile's baselines were "
            f"measured on: {others})")


def table_lines(cmp: Comparison, *, shown: bool = False) -> list[str]:
    """Per test, the terminal's verdict table (gated metrics; with ``shown`` every metric), worst first."""
    from pytest_specdec.output.wording import split_sentence, table

    level = f"{100 * (1 - 2 * cmp.alpha):.4g}% CI"
    order = {"compared": 1, NOT_COMPARABLE: 2, "no runs": 3}
    rows = sorted(cmp.rows, key=lambda r: (0 if r.failed() else 1 if r.regressed else order.get(r.status, 4)))
    out: list[str] = []
    for r in rows:
        if r.status == "compared" or (r.status == "no runs" and r.verdicts):  # a dead arm in NEW is judged too
            out.append(f"{r.nodeid}: {r.word}" if r.status == "compared" else f"{r.nodeid}: no runs: {r.reason}")
            out += ["  " + line for line in table(r.verdicts if shown else r.gated, level).splitlines()]
            if r.split is not None:
                out.append(f"  speedup explained: {split_sentence(r.split)}")
        elif r.status == NOT_COMPARABLE:
            opted = "" if r.checked else " (check=False: shown, not failed)"
            out.append(f"{r.nodeid}: {NOT_COMPARABLE}{opted} (measured under other conditions):")
            out += [f"  {k}: {a!r} → {b!r}" for k, (a, b) in r.fields.items()]
        else:
            out.append(f"{r.nodeid}: {r.status}" + (f": {r.reason}" if r.reason else ""))
        out.append("")
    return out


def summary_lines(cmp: Comparison, old_name: str, new_name: str) -> list[str]:
    """The closing lines: the machine factor, the counts of gated verdicts, the tests in one file only."""
    from pytest_specdec.output.sweeps import crossover_line
    from pytest_specdec.output.wording import MULTIPLICITY_NAMES, machine_sentence

    counts: dict[str, int] = {}
    for r in cmp.rows:
        for v in r.gated:
            counts[v.verdict] = counts.get(v.verdict, 0) + 1
    status: dict[str, int] = {}
    for r in cmp.rows:
        status[r.status] = status.get(r.status, 0) + 1
    lines = [f"specdec compare: {new_name}'s tests judged against {folder}, the baselines of {name}"
             for folder, name in cmp.machines]
    if cmp.machine is not None:
        lines.append("specdec compare: " + machine_sentence(cmp.machine, now=new_name, against=old_name))
    verdicts = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"
    tests = ", ".join(f"{n} {k}" for k, n in status.items())
    lines.append(f"specdec compare: {len(cmp.rows)} test(s): {tests}; gated verdicts {verdicts} "
                 f"({MULTIPLICITY_NAMES[cmp.multiplicity]} over the gated family, alpha {cmp.alpha:g})")
    bad = [r for r in cmp.regressed if r.checked]
    lines.append(f"specdec compare: {len(bad)} test(s) regressed from {old_name} to {new_name}"
                 + (": " + ", ".join(r.nodeid for r in bad) if bad else ""))
    opted = [r.nodeid for r in cmp.regressed if not r.checked]
    if opted:
        lines.append(f"specdec compare: {len(opted)} test(s) regressed but opted out (check=False), shown and not "
                     f"failed: {', '.join(opted)}")
    lines += [crossover_line(x) for x in cmp.crossovers]
    dead = [r.nodeid for r in cmp.rows if r.dead]
    if dead:
        lines.append(f"specdec compare: {len(dead)} test(s) without a valid run in {new_name}, failed as the "
                     f"plugin fails them: {', '.join(dead)}")
    return lines


def to_json(cmp: Comparison, *, strict: bool = False) -> dict[str, Any]:
    """The comparison as data (`--json`): per test its status and verdicts in the results' verdict format;
    `regressed` lists every test with a regressed gated metric, `failed` those that make the exit status 1."""
    from pytest_specdec.output.results import verdict_entry as verdict_json

    return {
        "alpha": cmp.alpha, "multiplicity": cmp.multiplicity,
        "baselines": [{"folder": folder, "hardware": name} for folder, name in cmp.machines],
        "machine_factor": cmp.machine.to_dict() if cmp.machine else None,
        REGRESSED: [r.nodeid for r in cmp.regressed],
        "crossovers": {x.sweep: {**(verdict_json(x.verdict) if x.verdict else {"verdict": None}), "line": x.line,
                                 "family": x.family, "error": x.error, "failed": x.failed, "why_none": x.note or None}
                       for x in cmp.crossovers},
        "failed": [r.nodeid for r in cmp.failed(strict)],
        "failed_sweeps": [x.sweep for x in cmp.failed_sweeps],
        "tests": [{"nodeid": r.nodeid, "status": r.status, REGRESSED: r.regressed, "checked": r.checked,
                   "failed": r.failed(strict), "reason": r.reason,
                   "not_comparable_fields": {k: [a, b] for k, (a, b) in r.fields.items()},
                   "verdicts": {v.metric: verdict_json(v) for v in r.verdicts},
                   "split": None if r.split is None else r.split.to_dict()} for r in cmp.rows],
    }


def names(paths: Sequence[Path]) -> tuple[str, str]:
    """How the two files are named in the lines: their paths, or OLD/NEW when they print the same."""
    a, b = (str(p) for p in paths)
    return (a, b) if a != b else ("OLD", "NEW")
