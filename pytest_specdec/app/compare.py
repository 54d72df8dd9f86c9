"""The nightly compare use case: a results file judged as the plugin judges a session, through the gate's one
pipeline (`gate/pipeline.py`): against a profile's stored baselines (exactly the session's own verdicts), or against
another results file (OLD's runs of each test become a baseline of one night); and its concurrency sweeps judged
from the results file as the session judges them (`gate.crossover_gate.decide`). Nothing here re-implements a
statistic; `output/compare.py` renders the `gate.comparison.Comparison` it returns.

A results file's test carries its runs as the one run record (`gate.nights.Night`, read by `schema.load`), so a
night of a results file and a night of a baseline file are the same thing. A test in one file only, or without
valid runs on one side, is listed as such, never dropped.

What fails the comparison is what fails the test in the plugin: a gated regression of a test that did not opt
out (`check=False` is shown, never failed), NEW without a valid run on an arm (the plugin fails such a
test whatever its `check`, since an arm is never judged on the other arm's figures), and a gated drift of NEW that
regressed within its session (`gate.drift`: its raw p a member of the comparison's gated family, as it was of the
session's; whatever its baseline and `check`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.comparison import Comparison, Row
from pytest_specdec.gate.kinds import NOT_COMPARABLE
from pytest_specdec.output.fields import number
from pytest_specdec.output.schema import Results, ResultsError, TestEntry

if TYPE_CHECKING:
    from pytest_specdec.gate.check import FailRule
    from pytest_specdec.gate.crossover_gate import Reader, SweepNight, SweepOutcome, SweepPoint
    from pytest_specdec.gate.drift import Drift
    from pytest_specdec.gate.machine import StateTolerance
    from pytest_specdec.gate.stats import Thresholds
    from pytest_specdec.gate.variance import NightPrior


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
            datasets: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
            rule: FailRule | None = None) -> Comparison:
    """NEW's tests judged through the gate's one pipeline (`gate.pipeline.judge_all`), as the plugin judges a
    session: against a baseline directory (``StoredDir``: each test against its own file, the night variances,
    priors and night factors from every file of the profile, the profile's night sd floor), or against
    another results file (each of OLD's tests a baseline of one night; the priors from OLD's tests, never
    NEW's). Each test is judged at the look it ended on, with the thresholds it recorded (``override``, the
    command line's, on top; ``thresholds`` where it recorded none); the machine factor comes from every
    compared test's reference arm. The tests fail by ``rule`` (default: NEW's session's, `session_rule`)."""
    from pytest_specdec.gate.baselines import BaselineError, diff, night_entry
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
    # NEW's drift within its session, as judged: its gated verdicts join the family as they joined the session's
    drifts = {nodeid: d for nodeid, (j, t) in new_tests.items()
              if (d := t.drift_judged(f"{new_name}: tests[{j}]")) is not None}
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
            if data is None:  # as the session: other machines' nights of the same software judge acceptance
                others = [m.key for m in store.machines().others]
                found = store.portable(nodeid, dict(now.baseline.comparability), others) if others else None
                if found is None:
                    rows.append(Row(nodeid, f"only in {new_name}", reason=f"no baseline at {path}", checked=checked,
                                    dead=bool(dead)))
                    continue
                plan = replace(plan, path=path, baseline=found[0], machines=found[1])
            else:
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
            baseline = {"sessions": [night_entry(then.night)]}
            stored.append(baseline)
            sets = datasets or ({}, {})
            plan = replace(plan, baseline=baseline, differs=diff(*same_footing(conditions(old, then, sets[0]),
                                                                               conditions(new, now, sets[1]))))
        plan = replace(plan, status=NOT_COMPARABLE if plan.differs else "compared")
        rows.append(Row(nodeid, "no runs" if dead else plan.status, fields=dict(plan.differs), checked=checked,
                        dead=bool(dead), reason=reason))
        checks.append((nodeid, Judgement(plan, night=now.night, looks_taken=looks, drift=as_judged(drifts, nodeid))))
    judged_ids = {n for n, _ in checks}
    checks += [(n, Judgement(Plan(Path(old_name), "missing", True, {}, {}, alpha=alpha), drift=as_judged(drifts, n)))
               for n in drifts if n not in judged_ids]  # no verdicts of its own: its drift is still a member
    if isinstance(old, Results):
        rows += [Row(n, f"only in {old_name}") for n in old_tests if n not in new_tests]
    else:  # the priors from the files of the machines judged against, as the plugin's session reads them
        stored = [data for s in stores.values() for data in s.readable()]
    pipeline = Pipeline(Stored(tuple(stored), min_night_sd, night_prior), alpha, multiplicity, state_tolerance)
    machine, judged_all = judge_all(pipeline, checks, thresholds)
    by_id = dict(judged_all)

    rows = [row if (judged := by_id.get(row.nodeid)) is None else
            replace(row, verdicts=tuple(judged.final or ()), split=judged.split(), drift=judged.drift) for row in rows]
    from pytest_specdec.gate.baselines import hardware_label

    machines = tuple((str(s.base), hardware_label(s.fingerprint) + _none_there(s)) for s in stores.values())
    sweeps = crossovers(old, new, rows, stores, alpha=alpha,
                        tolerance=None if state_tolerance is None else state_tolerance.ratio, old_name=old_name)
    return Comparison(rows, machine, alpha, multiplicity, sweeps, machines, rule=rule or session_rule(new))


def crossovers(old: Results | StoredDir, new: Results, rows: Sequence[Row], stores: Mapping[str, Any], *,
               alpha: float, tolerance: float | None, old_name: str = "OLD") -> list[SweepOutcome]:
    """Each of NEW's concurrency sweeps judged as the plugin's session judges it (`judge_results`):
    against OLD's same sweep (its tests in a results file) or the last night of its stored record in the folder
    of the machine its tests were judged against (``stores``); a member's status is its row's."""
    from pytest_specdec.gate.baselines import load_sweep, sweep_path
    from pytest_specdec.gate.crossover_gate import Sweep, stored_night

    def read(sweep: Sweep) -> tuple[SweepNight | None, str]:
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


def as_judged(drifts: Mapping[str, Drift], nodeid: str) -> Drift | None:
    """A test's drift before the family's adjustment (its verdicts as judged), for the comparison's family."""
    d = drifts.get(nodeid)
    return None if d is None else replace(d, adjusted=None)


def _none_there(store: Any) -> str:
    """What a machine's folder without files leaves NEW with, and which machines have baselines instead."""
    if store.all_files():
        return ""
    others = "; ".join(f"{m.name} ({m.key})" for m in store.machines().others) or "none"
    return (f" (that folder holds no baselines, so NEW's speed could not be judged, its acceptance only against "
            f"other machines' nights of the same software; the profile's baselines were measured on: {others})")


# ---- the crossover concurrency: the gate's points from a results file, its sweeps judged ----------


def sweep_point(test: TestEntry, status: str | None = None, checked: bool | None = None) -> SweepPoint:
    """A results file's test as the crossover gate's point (`gate.crossover_gate.SweepPoint`): ``status`` and
    ``checked`` are its comparison's (compare's row), else what its recorded baseline says."""
    from pytest_specdec.gate.crossover_gate import SweepPoint

    b = test.baseline
    return SweepPoint.of(test.nodeid, test.params, test.callspec, test.night,
                         status=status if status is not None else b.status if b else None,
                         checked=checked if checked is not None else b.checked if b else True,
                         gate=tuple(b.gate) if b else (), passed=test.outcome == "passed",
                         saturation_req_s=number((test.rate_sweep or {}).get("saturation_req_s")))


def judge_results(tests: Iterable[TestEntry], status: Mapping[str, tuple[str, bool]], read: Reader, *, alpha: float,
                  tolerance: float | None) -> list[SweepOutcome]:
    """A results file's concurrency sweeps, each on the session's course (`gate.crossover_gate.decide`): against
    the night ``read`` gives, each test's (status, checked) as ``status`` says (`compare`'s rows)."""
    from pytest_specdec.gate.crossover_gate import decide, group

    found, out = group(sweep_point(t, *status.get(t.nodeid, (None, None))) for t in tests)
    return out + [decide(sweep, read, alpha=alpha, tolerance=tolerance) for sweep in found]


def stored_nights(results: Results, alpha: float) -> tuple[dict[str, SweepNight], dict[str, str]]:
    """A results file's sweeps as the nights another file's are judged against, by sweep; and the sweeps it
    holds that cannot be read, with why."""
    from pytest_specdec.errors import SpecDecError
    from pytest_specdec.gate.crossover import estimate
    from pytest_specdec.gate.crossover_gate import SweepNight, group, sweep_state

    nights, unread = {}, {}
    for sw in group(sweep_point(t) for t in results.tests)[0]:
        try:
            est = estimate(sw.grid(), alpha=alpha, resamples=0, where=sw.sweep, axis=sw.axis)
        except SpecDecError as exc:
            unread[sw.sweep] = str(exc)
            continue
        nights[sw.sweep] = SweepNight(results.started, sw.grid(), est.text() if est else None, sweep_state(sw.points))
    return nights, unread


def session_rule(results: Results, *, strict: bool = False, fail_inconclusive: bool = False) -> FailRule:
    """The failure rule a results file's session ran under (its `gate.fail_inconclusive`), with compare's
    ``strict`` and ``fail_inconclusive`` on top: judged again, a file fails the tests its session failed."""
    from pytest_specdec.gate.check import FailRule

    return FailRule(strict=strict, fail_inconclusive=fail_inconclusive or results.gate.fail_inconclusive)
