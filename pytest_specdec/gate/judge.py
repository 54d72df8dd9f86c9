"""The gate for one session: which baselines it reads, how each test is compared and when it stops adding
runs, the machine factor at the end, and which baselines it writes.

The pytest session decides when each step happens and turns the outcomes into failures and warnings;
this object holds what the steps share (the profile's stored baselines, read once; the thresholds) and
does the steps' work, the session's end included (`machine_at_end`, then `finish`).
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.check import BaselineCheck

if TYPE_CHECKING:
    from pytest_specdec.gate.stats import Thresholds, Verdict
    from pytest_specdec.gate.store import BaselineStore
    from pytest_specdec.gate.variance import NightVariance, Prior
    from pytest_specdec.gate.verdicts import MachineFactor
    from pytest_specdec.measure.runner import CaseResult
    from pytest_specdec.measure.types import Sampling
    from pytest_specdec.profiles import Profile
    from pytest_specdec.vllm.command import ServerSpec


@dataclass(frozen=True)
class GateConfig:
    """What the options and the profile say about judging."""

    profile: Profile
    baselines_dir: Path
    rootpath: Path
    update: str | None  # --update-baselines: None, "all" or "missing"
    keep_sessions: int
    alpha: float
    fdr: str  # "bh" | "holm"
    runs: int  # runs per arm at the first look
    max_runs: int | None  # --specdec-max-runs (else the profile's [verdicts] max_runs)
    gate: tuple[str, ...] = ()  # ini specdec_gate: metrics added to the gated family
    ini_thresholds: tuple[str, ...] = ()
    cli_thresholds: tuple[str, ...] = ()


@dataclass
class SessionEnd:
    """What the gate says once every test is in; the wiring turns it into a warning and the exit status."""

    machine: MachineFactor | None
    machine_failed: bool = False  # beyond its threshold under --specdec-fail-machine
    warning: str | None = None  # beyond its threshold otherwise: for the wiring to warn
    lines: list[str] = field(default_factory=list)  # the terminal's, in order
    late_regressions: list[str] = field(default_factory=list)  # passed at their end, regressed in the whole family
    gate_summary: list[str] = field(default_factory=list)  # the terminal's last lines
    baselines: BaselineWrites | None = None  # what --update-baselines wrote; None without the flag
    baselines_failed: bool = False  # some of them could not be written (a read-only directory): the session fails


@dataclass(frozen=True)
class BaselineWrites:
    """What ``--update-baselines`` did, for the results and the report as well as the terminal: a CI job
    that opens a pull request with the files, or a reviewer of the night, reads it there. Paths are as
    the checkout names them, so they can go to `git add` as they are."""

    root: str  # the baselines' root
    mode: str  # "all" or "missing"
    created: tuple[str, ...] = ()
    updated: tuple[tuple[str, str], ...] = ()  # (path, old → new headline figures, what was kept or dropped)
    unchanged: tuple[tuple[str, str], ...] = ()  # (path, why it was not written)
    unused: tuple[str, ...] = ()  # files of the session's modules that no test of the session read
    not_written: tuple[tuple[str, str], ...] = ()  # (path, why): failed tests, tests without valid runs

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "mode": self.mode, "created": list(self.created),
                "updated": [{"path": p, "change": c} for p, c in self.updated],
                "unchanged": [{"path": p, "reason": r} for p, r in self.unchanged],
                "unused": list(self.unused),
                "not_written": [{"path": p, "reason": r} for p, r in self.not_written]}


class Judge:
    """Compares each test with its stored baseline and writes baselines at the session's end."""

    def __init__(self, cfg: GateConfig) -> None:
        self.cfg = cfg
        self._store: BaselineStore | None = None
        self._stored: list[dict[str, Any]] | None = None
        self._priors: dict[tuple[str, str], Prior] | None = None
        self._nights: dict[str, NightVariance] | None = None
        self._night_factors: dict[str, float] | None = None
        self._base_thresholds: list[dict[str, float]] | None = None

    @property
    def store(self) -> BaselineStore:
        if self._store is None:
            from pytest_specdec.gate.store import BaselineStore

            self._store = BaselineStore(self.cfg.baselines_dir, self.cfg.profile.name, mode=self.cfg.update,
                                        keep=self.cfg.keep_sessions)
        return self._store

    @property
    def opened(self) -> bool:
        """Whether any test asked for the store (only then are baselines written)."""
        return self._store is not None

    @property
    def updating_all(self) -> bool:
        return self.cfg.update == "all"

    @property
    def night_variances(self) -> dict[str, NightVariance]:
        """What was pooled so far (empty before the first comparison), for the results."""
        return self._nights or {}

    def looks(self) -> list[int]:
        """Runs per arm at each planned look: first the profile's runs, then two more at a time."""
        from pytest_specdec.gate.sequential import planned_looks

        profile, runs = self.cfg.profile, self.cfg.runs
        raw = self.cfg.max_runs or profile.raw.get("verdicts", {}).get("max_runs") or runs
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise ConfigError(f"profile {profile.path}: [verdicts] max_runs must be a whole number >= 1, "
                              f"got {raw!r}")
        if raw < runs:
            raise ConfigError(f"--specdec-max-runs / [verdicts] max_runs ({raw}) is below the runs per test "
                              f"({runs}); raise it or lower --specdec-runs")
        return planned_looks(runs, 2, raw)

    def gate(self, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The gated family's metrics: speedup, acceptance, P95 E2E ratio, plus ini and marker additions."""
        from pytest_specdec.gate.registry import GATED

        return tuple(dict.fromkeys((*GATED, *self.cfg.gate, *extra)))

    def thresholds(self, marker: dict[str, float] | None = None) -> Thresholds:
        """Defaults < profile [verdicts.thresholds] < ini specdec_thresholds < --specdec-threshold < marker."""
        from pytest_specdec.gate.verdicts import build_thresholds, check_mapping, parse_threshold_items

        if self._base_thresholds is None:
            profile = self.cfg.profile
            raw = profile.raw.get("verdicts", {}).get("thresholds", {})
            self._base_thresholds = [
                check_mapping(raw, f"profile {profile.path} [verdicts] thresholds"),
                parse_threshold_items(self.cfg.ini_thresholds, "ini specdec_thresholds"),
                parse_threshold_items(self.cfg.cli_thresholds, "--specdec-threshold"),
            ]
        return build_thresholds(*self._base_thresholds, *([marker] if marker else []))

    def stored(self) -> list[dict[str, Any]]:
        """Every readable stored baseline of this profile (read once, before any verdict)."""
        if self._stored is None:
            from pytest_specdec.gate.baselines import BaselineError, load

            datas = []
            for f in self.store.all_files():
                try:
                    data = load(f, "pytest --update-baselines")
                except BaselineError:
                    continue  # its own test reports it
                if data is not None:
                    datas.append(data)
            self._stored = datas
        return self._stored

    def priors(self) -> dict[tuple[str, str], Prior]:
        """Variance priors from every readable stored baseline of this profile (computed once)."""
        if self._priors is None:
            from pytest_specdec.gate.verdicts import priors_from

            self._priors = priors_from(self.stored())
        return self._priors

    def night_factors(self) -> dict[str, float]:
        """Each stored night's machine factor (log), from every file of the profile."""
        if self._night_factors is None:
            from pytest_specdec.gate.verdicts import night_factors

            self._night_factors = night_factors(self.stored())
        return self._night_factors

    def nights(self) -> dict[str, NightVariance]:
        """Per metric, the night-to-night variance pooled over the profile's stored baselines."""
        if self._nights is None:
            from pytest_specdec.gate.verdicts import night_variances, with_floor

            self._nights = with_floor(night_variances(self.stored(), self.night_factors()), self.min_night_sd())
        return self._nights

    def min_night_sd(self) -> float:
        """The profile's floor on the night-to-night sd of log-scale metrics, in % (0: none)."""
        profile = self.cfg.profile
        raw = profile.raw.get("verdicts", {}).get("min_night_sd", 0.0)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw < 100:
            raise ConfigError(f"profile {profile.path}: [verdicts] min_night_sd must be a number of % in "
                              f"[0, 100), got {raw!r}")
        return float(raw)

    def create_command(self, nodeid: str, mode: str) -> str:
        """The command that writes this test's baseline (`mode` "missing" or "all")."""
        flag = "--update-baselines" + ("=missing" if mode == "missing" else "")
        extra = ([f"--specdec-baselines={self.cfg.baselines_dir}"]
                 if self.cfg.baselines_dir != self.cfg.rootpath / "baselines" else [])
        return shlex.join(["pytest", nodeid, flag, *extra])

    def rel(self, path: Path) -> str:
        """A baseline path as the user's checkout names it."""
        from pytest_specdec.gate.baselines import relative

        return relative(path, self.cfg.rootpath)

    def regression(self, nodeid: str, c: BaselineCheck, verdicts: list[Verdict]) -> str:
        """A failing test's message, naming its baseline file and the command that accepts the change."""
        from pytest_specdec.gate.check import regression_message

        return regression_message(c, verdicts, alpha=self.cfg.alpha, fdr=self.cfg.fdr, where=self.rel(c.path),
                                  accept=self.create_command(nodeid, "all"))

    def test_end(self, nodeid: str, c: BaselineCheck, family: Sequence[tuple[str, BaselineCheck]], *, gated_size: int,
                 family_size: int, strict: bool, fail_inconclusive: bool) -> tuple[str | None, str | None]:
        """At the end of a test, its verdicts adjusted over the ``family`` so far (padded to the sizes the
        collected tests can reach) as (failure message, warning message), either None.

        Regressions fail the test; a missing baseline fails with the command that creates it; a
        non-comparable baseline warns (fails under --specdec-strict); inconclusive gated verdicts warn
        (fail under --specdec-fail-inconclusive).
        """
        from pytest_specdec.gate.check import adjusted
        from pytest_specdec.gate.verdicts import gated_with, guard_text, table

        c.verdicts = adjusted(family, nodeid, final=False, fdr=self.cfg.fdr, alpha=self.cfg.alpha,
                              gated_size=gated_size, family_size=family_size)
        if not c.check:
            return None, None
        if c.status == "error":  # --update-baselines replaces an unreadable file (the summary says so)
            return (None if self.updating_all else f"specdec: {c.error}"), None
        rel = self.rel(c.path)
        if c.status == "missing":
            if self.cfg.update:
                return None, None
            return (f"specdec: no baseline for this test at {rel}\n"
                    f"create it with: {self.create_command(nodeid, 'missing')}"), None
        if self.updating_all:
            return None, None
        if c.status == "not-comparable":
            fields = "\n".join(f"  {k}: {a!r} → {b!r}" for k, (a, b) in c.fields.items())
            msg = (f"baseline {rel} was measured under different conditions (not-comparable):\n{fields}\n"
                   f"to replace it with tonight's measurement: --update-baselines")
            return ("specdec: " + msg, None) if strict else (None, f"{nodeid}: {msg}")
        if gated_with(c.verdicts, "regressed"):
            c.failed = True
            return self.regression(nodeid, c, c.verdicts), None
        open_ = gated_with(c.verdicts, "inconclusive")
        if not open_:
            return None, None
        what = "; ".join(f"{v.metric} {guard_text(v)}" for v in open_)
        runs = c.looks[-1] if c.looks else "?"
        msg = f"{len(open_)} gated metric(s) inconclusive after {runs} run(s) per arm: {what}"
        if fail_inconclusive:
            c.failed = True
            level = 100 * (1 - 2 * self.cfg.alpha / max(1, c.max_looks))
            return f"specdec: {msg} (--specdec-fail-inconclusive)\n\n{table(c.verdicts, f'{level:.4g}% CI')}", None
        return None, f"{nodeid}: {msg}; the test passes (--specdec-fail-inconclusive fails it)"

    def start(self, nodeid: str, method: str, workload: dict[str, Any], dataset: dict[str, Any], reference: ServerSpec,
              spec: ServerSpec | None, sampling: Sampling, engines: dict[str, dict[str, Any]], *, endpoint: bool,
              check: bool, gate: tuple[str, ...], endpoint_versions: dict[str, dict[str, str | None]] | None = None
              ) -> BaselineCheck:
        """Read the test's baseline and say whether tonight can be compared with it (`gate/conditions.py`:
        what must be equal, and what is under test; ``engines`` are the arms' resolved engine configs,
        ``endpoint_versions`` in endpoint mode the versions each arm's endpoint told)."""
        from pytest_specdec.gate.baselines import BaselineError, diff
        from pytest_specdec.gate.conditions import comparability, under_test

        profile = self.cfg.profile
        comp = comparability(profile, method, workload, dataset, reference, spec, sampling)
        tested = under_test(profile, engines, spec, endpoint=endpoint, endpoint_versions=endpoint_versions)
        c = BaselineCheck(path=self.store.path(nodeid), status="missing", check=check, comparability=comp,
                          under_test=tested, entry={}, alpha=self.cfg.alpha, gate=gate)
        try:
            _, data = self.store.read(nodeid, self.create_command(nodeid, "missing"))
        except BaselineError as exc:
            c.status, c.error = "error", str(exc)
            return c
        if data is not None:
            c.baseline = data
            c.fields = diff(data["comparability"], comp)
            c.status = "not-comparable" if c.fields else "compared"
        return c

    def evaluate(self, c: BaselineCheck, result: CaseResult, thresholds: Thresholds, *, look: int, max_looks: int,
                 started: float, tonight_log: Callable[[], float | None]) -> None:
        """Tonight's runs so far as a baseline entry, and their raw verdicts (before the family adjustment).
        ``tonight_log`` is the machine factor (log) from every test compared so far."""
        from pytest_specdec.gate.baselines import session_entry
        from pytest_specdec.gate.nights import Night
        from pytest_specdec.gate.verdicts import evaluate, not_comparable_verdicts, tonight_deviation

        stamp = dt.datetime.fromtimestamp(started, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        c.entry, c.night = session_entry(result, stamp, c.under_test), Night.from_result(result)
        c.thresholds = thresholds
        if c.status == "compared" and c.baseline is not None:
            c.deviation = tonight_deviation(c.baseline, c.night, self.night_factors())
            c.raw = evaluate(c.baseline, c.night, thresholds=thresholds, alpha=self.cfg.alpha, look=look,
                             max_looks=max_looks, priors=self.priors(), nights=self.nights(),
                             factors=self.night_factors(), tonight_log=tonight_log(), gate=c.gate)
        elif c.status == "not-comparable":
            c.raw = not_comparable_verdicts(c.night, c.fields, c.gate)

    def run_looks(self, nodeid: str, c: BaselineCheck, result: CaseResult, extend: Callable[[int], None],
                  thresholds: Thresholds, *, started: float, tonight_log: Callable[[], float | None],
                  progress: Callable[[str], None]) -> None:
        """Compare after the first runs; while a gated verdict is inconclusive and another look could settle
        it, add runs (``extend(n)``: n per arm in all) and look again, alpha split over the looks."""
        from pytest_specdec.gate.sequential import next_look_useful
        from pytest_specdec.gate.stats import alpha_for_look
        from pytest_specdec.gate.verdicts import gated_with

        compared = c.check and c.status == "compared" and not self.updating_all
        looks = self.looks() if compared else [self.cfg.runs]
        c.max_looks = len(looks)
        for i, n in enumerate(looks, start=1):
            if len(result.reference_runs) < n:
                progress(f"specdec: {nodeid}: inconclusive at look {i - 1} of {len(looks)}: {n} interleaved runs")
                extend(n)
            c.looks.append(len(result.reference_runs))
            self.evaluate(c, result, thresholds, look=i, max_looks=len(looks), started=started,
                          tonight_log=tonight_log)
            n_now = len(result.reference_runs)
            if i == len(looks) or n_now >= looks[-1]:
                break
            if not next_look_useful(c.raw, n_now, looks[-1], alpha_for_look(self.cfg.alpha, i, len(looks))):
                open_ = [v.metric for v in gated_with(c.raw, "inconclusive")]
                c.unspent = looks[-1] - n_now
                c.stop_reason = (f"{', '.join(open_)} inconclusive, but {looks[-1]} runs could not settle it" if open_
                                 else "every gated verdict is conclusive")
                progress(f"specdec: {nodeid}: {c.unspent} run(s) per arm not spent: {c.stop_reason}")
                break

    def machine_factor(self, checks: list[BaselineCheck]) -> MachineFactor | None:
        """The session's machine factor from every compared test; the absolute figures are then re-judged
        with it (the gated ratios do not use it)."""
        from pytest_specdec.gate.verdicts import evaluate, machine_factor

        compared = [c for c in checks if c.status == "compared" and c.raw]
        threshold = abs(self.thresholds().bad_side("reference_tok_s", "rate"))
        machine = machine_factor([c.deviation for c in compared if c.deviation is not None], threshold,
                                 self.cfg.alpha)
        if machine is not None:
            for c in compared:
                assert c.baseline is not None and c.night is not None
                c.raw = evaluate(c.baseline, c.night, thresholds=c.thresholds, alpha=self.cfg.alpha,
                                 look=len(c.looks) or 1, max_looks=c.max_looks, priors=self.priors(),
                                 nights=self.nights(), factors=self.night_factors(), tonight_log=machine.log,
                                 gate=c.gate)
        return machine

    def write(self, tests: list[tuple[str, BaselineCheck, CaseResult | None, str]]
              ) -> tuple[list[str], BaselineWrites, bool]:
        """--update-baselines: queue each passed test with valid runs (nodeid, check, result, outcome), then
        write them all at once; returns the terminal's lines, the same as data (what was written and what
        was not, and why), and whether a file could not be written (the session then fails)."""
        from pytest_specdec.gate.store import Pending

        lines: list[str] = []
        not_written: list[tuple[str, str]] = []
        for nodeid, c, result, outcome in tests:
            why = f"the test {outcome}" if outcome != "passed" else unwritable(result)
            if why:
                lines.append(f"specdec: not writing {self.rel(c.path)}: {why}")
                not_written.append((self.rel(c.path), why))
                continue
            # Only a gated change is a change being accepted (it drops the older nights); a shown-family
            # figure that moved with the machine must not wipe the file's history.
            changed = ", ".join(f"{v.metric} {v.verdict}" for v in c.shown()
                                if v.verdict in ("regressed", "improved") and v.family == "gated")
            self.store.queue(Pending(nodeid, c.path, c.comparability, c.under_test, c.entry, changed))
        summary = self.store.flush()
        rel = self.rel
        writes = BaselineWrites(
            root=rel(self.store.root), mode=self.cfg.update or "all", created=tuple(map(rel, summary.created)),
            updated=tuple((rel(p), what) for p, what in summary.updated),
            unchanged=tuple((rel(p), why) for p, why in summary.unchanged), unused=tuple(map(rel, summary.unused)),
            not_written=(*not_written, *((rel(p), f"could not write it: {why}") for p, why in summary.failed)))
        return lines + summary.lines(self.store.root), writes, bool(summary.failed)

    def machine_at_end(self, checks: list[BaselineCheck], *, fail_machine: bool) -> SessionEnd:
        """Session end, first: the machine factor over every compared test. Beyond its threshold it fails the
        session (--specdec-fail-machine) or is a warning, which the wiring gives before `finish` writes."""
        end = SessionEnd(self.machine_factor(checks))
        machine = end.machine
        if machine is not None:
            end.lines.append(machine.line())
            if machine.beyond and not self.updating_all:
                if fail_machine:
                    end.machine_failed = True
                    end.lines.append("specdec: the session fails on the machine factor (--specdec-fail-machine)")
                else:
                    end.warning = machine.sentence()
        return end

    def finish(self, end: SessionEnd, tests: Sequence[tuple[str, BaselineCheck | None, CaseResult | None, str]], *,
               fail_inconclusive: bool) -> None:
        """Session end, then: BH/Holm over the whole family, the tests that regress only in it, the gate summary
        and the queued baseline writes. ``tests``: every test's (nodeid, check, result, outcome)."""
        from pytest_specdec.gate.check import adjusted, coalesced_summary, gate_lines
        from pytest_specdec.gate.verdicts import gated_with

        checked = [(n, c, r, o) for n, c, r, o in tests if c is not None]
        family = [(n, c) for n, c, _, _ in checked]
        lines = end.lines
        for nodeid, c, _, _ in checked:
            # final: the family is whole, nothing is padded to the collected size
            c.final = adjusted(family, nodeid, final=True, fdr=self.cfg.fdr, alpha=self.cfg.alpha, gated_size=0,
                               family_size=0) if c.raw else []
            late = gated_with(c.final, "regressed")  # a shown metric never fails the session
            if late and c.check and not c.failed and not self.updating_all and c.status == "compared":
                end.late_regressions.append(nodeid)
                lines.append(self.regression(nodeid, c, c.final).replace(
                    "specdec:", f"specdec: {nodeid}: after the whole session's family was known,", 1))
        lines += coalesced_summary([(n, r) for n, _, r, _ in tests])
        if end.late_regressions:
            lines.insert(0, f"specdec: {len(end.late_regressions)} test(s) passed at their end but regressed once "
                            "every p-value of the session was known (Benjamini-Hochberg/Holm need all of them):")
        end.gate_summary = gate_lines([(n, c, r) for n, c, r, _ in checked], end.machine, fdr=self.cfg.fdr,
                                      alpha=self.cfg.alpha, fail_inconclusive=fail_inconclusive)
        if self.cfg.update and self.opened:
            written, end.baselines, end.baselines_failed = self.write(checked)
            lines += written


def unwritable(result: CaseResult | None) -> str:
    """Why tonight's runs must not become a baseline night ("" when they may): each arm needs a valid run,
    and a test with a spec arm a valid pair, or the file would trade real nights for one that says nothing
    (a dead spec server's night has only the reference's runs)."""
    if result is None:
        return "nothing was measured"
    arms = [("reference", result.reference_runs), *([("spec", result.runs)] if result.runs else [])]
    for arm, runs in arms:
        if not any(r.valid for r in runs):
            return f"the {arm} arm has no valid run (of {len(runs)})"
    if result.runs and not any(s is not None for s in result.speedup_per_pair):
        return "no pair of runs is valid on both arms"
    return ""
