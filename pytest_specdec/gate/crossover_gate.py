"""The crossover as a gated metric: each concurrency sweep's points recorded at its tests' ends (`test_end`), every
sweep judged at the session's end (`finish`), one outcome per sweep (its verdict, or the error that kept it from
one) and the record writes to make. The plugin's session and `pytest-specdec compare` both take a sweep through
`decide` (then `judge_sweep`), with the same not-comparable rule, so they cannot disagree on the same data.

A sweep is the tests of one test function that differ only in its axis: concurrency, or on a rate sweep (the
marker's ``rate_sweep``) the request rate as a fraction of the reference's saturation, whose speedup is
latency-based (`crossover.load_speedups`) and whose crossover is the rate where speculation stops paying; one gate
for both. It is grouped by the function, every field of the specdec marker but the axis, and the test's other
parametrize values as its results record them (``callspec``). Two tests of one group at one point cannot be told apart,
so that sweep is an error with the
reason; it never stops another sweep from being judged or written.

It is not a `protocol.Gate`: it judges no single test (no start, no looks, no verdict at a test's end: its points
are the tests' own runs, and one verdict is a sweep's), so the session drives it after its `Gate.finish`, through
the same two words, `test_end` and `finish`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.crossover import CONCURRENCY, NAME, RATE, axis_words
from pytest_specdec.gate.kinds import GATED, NOT_COMPARABLE, REGRESSED, SHOWN, Family

if TYPE_CHECKING:
    from pytest_specdec.gate.crossover import Crossover
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.stats import Verdict

#: Per point: (the axis's value, its valid pairs' speedups).
Grid = list[tuple[float, list[float]]]


def recorded(value: Any) -> Any:
    """A parametrize value as results record it: a JSON scalar as it is, anything else by its repr."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)


def axis_of(params: Mapping[str, Any]) -> str:
    """A test's swept axis: a rate sweep's point (its case has a ``rate_fraction``) or a concurrency's; every other
    parameter is part of its sweep's identity."""
    return RATE if params.get(RATE) is not None else CONCURRENCY


def id_part(params: Mapping[str, Any]) -> str:
    """The part of a test's id that names its point on its axis: ``c4``, or ``sat33`` (33 % of saturation:
    `markers.Case.id`)."""
    if axis_of(params) == RATE:
        return f"sat{round(100 * params[RATE])}"
    return f"c{params.get(CONCURRENCY)}"


def sweep_id(nodeid: str, part: str) -> str:
    """``suites/test_concurrency.py::test_concurrency[eagle3-k3-t0.0-c4]`` → ``...[eagle3-k3-t0.0]``: the name of
    the sweep a test belongs to (its axis part, `id_part`, left out), under which its crossover record is stored."""
    path, _, rest = nodeid.partition("[")
    parts = [p for p in rest.rstrip("]").split("-") if p != part] if rest else []
    return f"{path}[{'-'.join(parts)}]" if parts else path


def line_label(params: Mapping[str, Any]) -> str:
    """``eagle3 k=3``: the method of a sweep (its k unless the reference's or unset)."""
    method, k = params.get("method"), params.get("k")
    return str(method) + ("" if method == "none" or k is None else f" k={k}")


@dataclass(frozen=True)
class SweepPoint:
    """One test's point of a concurrency sweep, as the gate records it at the test's end."""

    nodeid: str
    params: Mapping[str, Any]  # the case's fields (the results' `params`)
    callspec: Mapping[str, Any]  # the test's other parametrize values, as recorded
    speedups: tuple[float, ...]  # its valid pairs'
    machine_state: Mapping[str, float] | None = None  # the probe's figures while it ran
    #: its baseline comparison: compared, not-comparable, missing, error; None where it was not compared
    status: str | None = None
    checked: bool = True  # False: the test opted out (check=False)
    gate: tuple[str, ...] = ()  # its gated metrics (ini and marker)
    passed: bool = True  # pytest's outcome was `passed`
    saturation_req_s: float | None = None  # a rate sweep's: the reference's saturation its rate was a fraction of

    @classmethod
    def of(cls, nodeid: str, params: Mapping[str, Any], callspec: Mapping[str, Any], night: Night, *,
           status: str | None, checked: bool, gate: Sequence[str], passed: bool,
           saturation_req_s: float | None = None) -> SweepPoint:
        """A test's point from its night (tonight's runs, or a results file's test): a rate sweep's speedups are
        latency-based (`crossover.load_speedups`), a concurrency sweep's the tok/s speedups of its pairs."""
        from pytest_specdec.gate.crossover import load_speedups

        speedups = (load_speedups(night.reference, night.spec) if axis_of(params) == RATE
                    else [s for s in night.speedup_per_pair if s is not None])
        return cls(nodeid, dict(params), dict(callspec), tuple(speedups), night.machine_state, status, checked,
                   tuple(gate), passed, saturation_req_s)

    @property
    def axis(self) -> str:
        return axis_of(self.params)

    @property
    def concurrency(self) -> Any:
        """The point's value on its axis (a concurrency, or a rate sweep's fraction of saturation)."""
        return self.params.get(self.axis)

    def key(self) -> tuple[str, str, str]:
        """What a sweep's tests share: the function, every marker field but the axis (so a rate sweep's points,
        which leave out their fraction, never group with a concurrency sweep's, which leave out concurrency),
        the other parameters."""
        fixed = sorted((k, repr(v)) for k, v in self.params.items() if k != self.axis)
        others = sorted((k, repr(v)) for k, v in self.callspec.items())
        return (self.nodeid.partition("[")[0], repr(fixed), repr(others))

    def grouped_by(self) -> str:
        """The parameters the key holds, as a message names them."""
        items = [*((k, v) for k, v in self.params.items() if k != self.axis and v is not None),
                 *self.callspec.items()]
        return ", ".join(f"{k}={v!r}" for k, v in items)


@dataclass(frozen=True)
class SweepNight:
    """The night a sweep is judged against: a stored record's last night, or OLD's sweep in `compare`."""

    started: str | None
    points: Grid
    text: str | None = None  # its crossover as the terminal words it
    machine_state: Mapping[str, float] | None = None


@dataclass(frozen=True)
class SweepOutcome:
    """One sweep's crossover at the session's end: its verdict against the stored night, or the error that kept it
    from one (then ``failed``: the session fails). ``note`` says why there is no verdict where that is no error."""

    sweep: str
    line: str
    tests: tuple[str, ...]
    points: Grid
    family: Family = SHOWN
    crossover: Crossover | None = None
    verdict: Verdict | None = None
    stored: SweepNight | None = None
    path: str | None = None  # its record, as the checkout names it
    note: str = ""
    error: str | None = None
    failed: bool = False
    axis: str = CONCURRENCY
    saturation: float | None = None  # a rate sweep's, req/s


@dataclass(frozen=True)
class SweepWrite:
    """Tonight's night to append to a sweep's record (under --update-baselines)."""

    sweep: str
    path: Path
    record: dict[str, Any]
    night: dict[str, Any]


@dataclass(frozen=True)
class CrossoverEnd:
    """Every sweep's outcome, and the record writes to make."""

    sweeps: tuple[SweepOutcome, ...] = ()
    writes: tuple[SweepWrite, ...] = ()

    @property
    def failed(self) -> bool:
        return any(s.failed for s in self.sweeps)


@dataclass(frozen=True)
class Sweep:
    """Tests of one sweep, by concurrency (`group`)."""

    sweep: str
    line: str
    points: tuple[SweepPoint, ...]

    @property
    def axis(self) -> str:
        return self.points[0].axis

    @property
    def saturation(self) -> float | None:
        """A rate sweep's saturation (req/s): its lowest point's (one per sweep and session; under xdist each worker
        measures its own, and each point's results record the one its rate came from)."""
        return next((p.saturation_req_s for p in self.points if p.saturation_req_s is not None), None)

    def grid(self) -> Grid:
        return [(float(p.concurrency), list(p.speedups)) for p in self.points]

    def outcome(self, **fields: Any) -> SweepOutcome:
        return SweepOutcome(self.sweep, self.line, tuple(p.nodeid for p in self.points), self.grid(),
                            axis=self.axis, saturation=self.saturation, **fields)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def group(points: Iterable[SweepPoint]) -> tuple[list[Sweep], list[SweepOutcome]]:
    """The sweeps among the points (a group with at least two points on its axis and a spec arm), and an error per
    group that holds two tests at one point (a sweep defined wrongly: the message names the parameters)."""
    groups: dict[tuple[str, str, str], list[SweepPoint]] = {}
    for p in points:
        if _number(p.concurrency):
            groups.setdefault(p.key(), []).append(p)
    sweeps, errors = [], []
    for members in groups.values():
        members.sort(key=lambda p: (p.concurrency, p.nodeid))
        levels = [p.concurrency for p in members]
        if len(set(levels)) < 2 or not any(p.speedups for p in members):
            continue
        names = list(dict.fromkeys(sweep_id(p.nodeid, id_part(p.params)) for p in members))
        sweep = Sweep(names[0] if len(names) == 1 else members[0].nodeid.partition("[")[0],
                      line_label(members[0].params), tuple(members))
        twice = next((c for c in levels if levels.count(c) > 1), None)
        if twice is not None:
            same = [p.nodeid for p in members if p.concurrency == twice]
            word = axis_words(sweep.axis)[1]
            errors.append(sweep.outcome(error=(
                f"{len(same)} tests at {word} {twice} ({', '.join(same)}): a sweep is the tests of one function "
                f"that differ only in {word}, grouped by the specdec marker's other fields and the test's other "
                f"parametrize values as the results record them ({members[0].grouped_by()}), and these record the "
                "same values; give each parametrize value a repr of its own (or ids= and plain values)"),
                failed=True))
        else:
            sweeps.append(sweep)
    return sweeps, errors


def sweep_state(points: Sequence[SweepPoint]) -> dict[str, float] | None:
    """The sweep's machine state: the geometric mean of its tests' states (None when one was not probed)."""
    from pytest_specdec.measure.probe import MachineState, mean_state, state_entry

    states = [p.machine_state for p in points]
    if not states or any(s is None for s in states):
        return None
    mean = mean_state([MachineState.from_dict(s) for s in states if s is not None])
    return None if mean is None else state_entry(mean)


def judge_sweep(sweep: Sweep, stored: SweepNight | None, *, alpha: float, tolerance: float | None, gated: bool,
                updating_all: bool = False, path: str | None = None, note: str = "") -> SweepOutcome:
    """One sweep's crossover tonight and its verdict against ``stored`` (None: no verdict, ``note`` says why).
    The verdict is `not-comparable` when a member test is not comparable with its baseline, or when the machine
    state differs from the stored night's beyond ``tolerance`` (%; None: not conditioned), as the speedups it is
    made of are; a gated `regressed` fails (not while every baseline is being replaced). A value that cannot be
    judged raises ConfigError (the caller makes it the sweep's error)."""
    from pytest_specdec.gate.crossover import compare, estimate
    from pytest_specdec.gate.machine import MACHINE_STATE, state_comparable, state_condition

    family: Family = GATED if gated else SHOWN
    points = sweep.grid()
    est = estimate(points, alpha=alpha, where=sweep.sweep, axis=sweep.axis)
    if est is not None and sweep.saturation is not None:
        est = dataclasses.replace(est, saturation=sweep.saturation)
    if stored is None or est is None:
        return sweep.outcome(family=family, crossover=est, stored=stored, path=path, note=note)
    v = compare(stored.points, points, alpha=alpha, family=family, axis=sweep.axis)
    odd = [p.nodeid for p in sweep.points if p.status == NOT_COMPARABLE]
    state = sweep_state(sweep.points)
    if odd:
        v = dataclasses.replace(v, verdict=NOT_COMPARABLE, note=f"{len(odd)} test(s) of the sweep are not "
                                f"comparable with their baselines ({', '.join(odd)}); " + v.note)
    elif tolerance is not None and not state_comparable(state, stored.machine_state, tolerance):
        why = state_condition([{"machine_state": stored.machine_state}], state, tolerance).reason
        v = dataclasses.replace(v, verdict=NOT_COMPARABLE, method=MACHINE_STATE, note=f"{why}; " + v.note)
    return sweep.outcome(family=family, crossover=est, verdict=v, stored=stored, path=path, note=note,
                         failed=gated and v.verdict == REGRESSED and not updating_all)


def judged(sweep: Sweep, judge: Callable[[], SweepOutcome]) -> SweepOutcome:
    """``judge()``, or the error that kept it from a verdict as that sweep's outcome (it fails the session): one
    sweep's error never stops the others."""
    from pytest_specdec.errors import SpecDecError

    try:
        return judge()
    except SpecDecError as exc:  # a value or record that cannot be judged (ConfigError, BaselineError)
        reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - a fault judging one sweep is that sweep's error, named with its type
        reason = f"could not be judged ({type(exc).__name__}: {exc})"
    return sweep.outcome(error=reason, failed=True)


#: Reads the night a sweep is judged against: it, or None and why there is none (an unreadable one raises).
Reader = Callable[[Sweep], tuple["SweepNight | None", str]]


def decide(sweep: Sweep, read: Reader, *, alpha: float, tolerance: float | None, gate: Sequence[str] = (),
           updating_all: bool = False, path: str | None = None) -> SweepOutcome:
    """A sweep's course, the session's and `compare`'s alike: gated when ``crossover`` is in the session's gate or
    a member test's; judged against the night ``read`` gives when every member test was compared with its
    baseline and did not opt out (`judge_sweep`); never raising: a fault is the sweep's error (`judged`)."""

    def course() -> SweepOutcome:
        gated = NAME in gate or any(NAME in p.gate for p in sweep.points)
        kw: dict[str, Any] = {"alpha": alpha, "tolerance": tolerance, "gated": gated, "updating_all": updating_all,
                              "path": path}
        if not all(p.status is not None and p.checked for p in sweep.points):
            return judge_sweep(sweep, None, note="a test of the sweep was not compared with a baseline, or opted "
                                                 "out (check=False)", **kw)
        stored, why = read(sweep)
        return judge_sweep(sweep, stored, note="" if stored else why, **kw)

    return judged(sweep, course)


#: What an A/B session's sweeps are judged against, as the terminal, the JSON and the report name it.
BASE_ARM = "the base arm, this session"


def against_base(points: Sequence[SweepPoint], bases: Mapping[str, SweepPoint], *, alpha: float,
                 gate: Sequence[str] = ()) -> CrossoverEnd:
    """An A/B session's sweeps: the candidate's crossover (``points``) judged against the base arm's (``bases``, by
    test), whose pairs ran interleaved with the candidate's on this machine in this session: no record is read or
    written and the machine state is not conditioned on. The same `decide` as a stored night's, so the verdict,
    the gate (``crossover`` in the ini's or a test's gate) and the errors read alike."""
    from pytest_specdec.gate.crossover import estimate

    def read(sweep: Sweep) -> tuple[SweepNight | None, str]:
        missing = [p.nodeid for p in sweep.points if p.nodeid not in bases]
        if missing:
            return None, f"no base arm for {', '.join(missing)}"
        grid = [(float(p.concurrency), list(bases[p.nodeid].speedups)) for p in sweep.points]
        est = estimate(grid, alpha=alpha, where=f"{sweep.sweep} (base)", axis=sweep.axis)
        return SweepNight(BASE_ARM, grid, est.text() if est else "too few valid pairs"), ""

    sweeps, outcomes = group(points)
    outcomes += [decide(sweep, read, alpha=alpha, tolerance=None, gate=gate) for sweep in sweeps]
    return CrossoverEnd(tuple(outcomes))


def stored_night(night: Mapping[str, Any], where: str, axis: str = CONCURRENCY) -> SweepNight:
    """A stored record's night, its points on ``axis`` checked (a bad value raises ConfigError naming ``where``)."""
    from pytest_specdec.gate.crossover import points_of

    return SweepNight(night.get("started"), points_of(night, where, axis),
                       (night.get("crossover") or {}).get("text"),
                       night.get("machine_state"))


@dataclass(frozen=True)
class CrossoverGate:
    """The session's crossover: every sweep judged from the session's points and its record writes, at the
    session's end. ``record_path`` names a sweep's record; ``rel`` words a path as the checkout names it."""

    alpha: float
    tolerance: float  # the profile's machine_state_tolerance, %
    record_path: Callable[[str], Path]
    rel: Callable[[Path], str]
    started: float
    profile: str
    gate: tuple[str, ...] = ()  # the session's gated metrics (ini)
    update: str | None = None  # --update-baselines: None, "all" or "missing"

    def finish(self, points: Sequence[SweepPoint]) -> CrossoverEnd:
        """Every sweep of the session's ``points`` (every measured test's: which ones form a sweep is known at
        the end) judged against its stored record's last night (read when each member test read its baseline and
        did not opt out), each on its own: an error is that sweep's outcome. Under --update-baselines, tonight's
        night of each sweep whose tests all passed is a write to make."""
        sweeps, outcomes = group(list(points))
        writes = []
        for sweep in sweeps:
            path = self.record_path(sweep.sweep)
            def read(sw: Sweep, p: Path = path) -> tuple[SweepNight | None, str]:
                return self._read(p, sw.axis)

            out = decide(sweep, read, alpha=self.alpha, tolerance=self.tolerance, gate=self.gate,
                         updating_all=self.update == "all", path=self.rel(path))
            outcomes.append(out)
            if self.update and out.crossover is not None and all(p.passed for p in sweep.points):
                writes.append(self._write(sweep, path, out.crossover))
        return CrossoverEnd(tuple(outcomes), tuple(writes))

    def _read(self, path: Path, axis: str) -> tuple[SweepNight | None, str]:
        """The last night of the sweep's record, or why there is none; an unreadable record raises, except under
        --update-baselines, which replaces it (`write_sweep` says so)."""
        from pytest_specdec.gate.baselines import BaselineError, load_sweep

        unreadable = ""
        try:
            record = load_sweep(path)
        except BaselineError as exc:
            if not self.update:
                raise
            record, unreadable = None, f"{exc}; "
        if record and record["nights"]:
            return stored_night(record["nights"][-1], str(path), axis), ""
        return None, (unreadable + "no stored night: this session stores it" if self.update
                      else f"no stored night ({self.rel(path)}: `pytest --update-baselines` writes it)")

    def _write(self, sweep: Sweep, path: Path, crossover: Crossover) -> SweepWrite:
        from pytest_specdec.gate.baselines import sweep_entry, sweep_night_entry

        stamp = dt.datetime.fromtimestamp(self.started, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        night = sweep_night_entry(stamp, sweep.axis, sweep.grid(), crossover, sweep_state(sweep.points),
                                  sweep.saturation)
        record = sweep_entry(sweep.sweep, self.profile, [p.nodeid for p in sweep.points], sweep.axis)
        return SweepWrite(sweep.sweep, path, record, night)

    def write(self, end: CrossoverEnd, baselines_dir: Path, keep: int) -> list[tuple[str, str]]:
        """The writes ``end`` holds, each on its own: (its path, what happened, or NOT WRITTEN and why)."""
        from pytest_specdec.gate.store import write_sweep

        done = []
        for w in end.writes:
            try:
                what = write_sweep(baselines_dir, w.path, w.record, w.night, keep=keep,
                                   missing_only=self.update == "missing")
            except OSError as exc:
                what = f"NOT WRITTEN: {exc}"
            done.append((self.rel(w.path), what))
        return done
