"""The merge use case: the results files of one night's shards (each a session on its own machine, selecting part
of the suite) as one night, judged as one session would have judged the whole suite.

Each shard adjusted its verdicts over its own family; four shards at a 5 % suite-wise false-alarm rate give about
19 % for the night. Here the session's own family adjustment (`gate.check.adjusted_all`, what `Pipeline.finish`
calls at a session's end) is redone over the union of the shards' verdicts before adjustment, which each results
file keeps beside the adjusted one (a verdict's `unadjusted`: an adjusted p cannot be undone). Each test's machine
factor stays its shard's (each shard measured on its own machine), so the raw verdicts are the shards' own. The
merged verdicts decide each test's outcome by the plugin's one failure rule (`gate.check.FailRule`).

Shards that do not belong to one night are refused, naming the field and each file's value: another profile,
hardware, vLLM, plugin version or gate setting. A test in two shards is refused (never dropped or averaged); a test
expected (`--expect`) but in no shard is `insufficient-data` and fails the merge, so a lost shard is never a
green night.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import SpecDecError
from pytest_specdec.gate.kinds import INCONCLUSIVE, REGRESSED

if TYPE_CHECKING:
    from pytest_specdec.gate.check import FailRule
    from pytest_specdec.gate.drift import Drift
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.output.results import Shard
    from pytest_specdec.output.schema import TestEntry, VerdictEntry

#: What every shard of one night must share, as (what the error names, how it is read from the parsed file).
SAME: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("profile", ("profile",)),
    ("environment.hardware", ("environment", "hardware")),
    ("environment.device", ("environment", "device")),
    ("environment.vllm_version", ("environment", "vllm_version")),
    ("environment.vllm_distribution", ("environment", "vllm_distribution")),
    ("environment.plugin_version", ("environment", "plugin_version")),
    ("gate.settings.alpha", ("gate", "settings", "alpha")),
    ("gate.settings.multiplicity", ("gate", "settings", "multiplicity")),
    ("gate.settings.thresholds", ("gate", "settings", "thresholds")),
    ("gate.fail_inconclusive", ("gate", "fail_inconclusive")),
    ("gate.fail_machine", ("gate", "fail_machine")),
)


class MergeError(SpecDecError):
    """Shards that cannot be merged into one night; the message names the files and the field to fix."""


@dataclass(frozen=True)
class Recorded:
    """A test's verdicts before the family's adjustment, as its shard recorded them: what the family adjustment
    reads of a judgement (`gate.check.Judged`)."""

    raw: tuple[Verdict, ...]
    max_looks: int
    #: its drift within its shard's session, as judged there: its gated verdicts are members of the merged family
    drift: Drift | None = None


@dataclass(frozen=True)
class Merged:
    """The merged night: the results document, and what decides the merge's exit status."""

    data: dict[str, Any]
    failed: tuple[str, ...]  # tests that fail by the plugin's rule on the merged verdicts (or failed in their shard)
    changed: tuple[tuple[str, str, str], ...]  # (test, shard's outcome, merged outcome) where the adjustment moved it
    missing: tuple[str, ...]  # expected, in no shard
    failed_sweeps: tuple[str, ...]
    errors: tuple[str, ...]  # the shards' session-end errors, each naming its shard
    machine_failed: tuple[str, ...]  # shards whose machine factor failed them (--specdec-fail-machine)
    family: int  # gated p-values adjusted together
    multiplicity: str
    alpha: float

    @property
    def fails(self) -> bool:
        """Whether the merged night fails as a session would (missing tests are the caller's to forgive)."""
        return bool(self.failed or self.failed_sweeps or self.errors or self.machine_failed)


def expected_ids(text: str) -> list[str]:
    """The test ids of a collection list: `pytest --co -q` (one id a line, then a summary line) or the plugin's
    dry run (each test's id indented on its own line, among other lines). A line is an id when, stripped, it
    holds ``::`` and no whitespace; blank and summary lines are not."""
    out = []
    for line in text.splitlines():
        word = line.strip()
        if "::" in word and not any(c.isspace() for c in word):
            out.append(word)
    return list(dict.fromkeys(out))


def field_of(data: Mapping[str, Any], path: Sequence[str]) -> Any:
    """A parsed file's value at ``path`` (None where any part is missing)."""
    value: Any = data
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def check_one_night(shards: Sequence[Shard]) -> None:
    """Refuse shards that are not one night's: each field of `SAME` that differs is named with each file's value;
    an A/B session's results (candidate vs base, no stored night) are no shard of a nightly."""
    for shard in shards:
        if any(t.ab is not None for t in shard.results.tests):
            raise MergeError(f"{shard.path}: an A/B session's results (tests with an `ab` section); merge takes the "
                             "shards of a nightly session (compare an A/B session's results with "
                             "`pytest-specdec compare`)")
    problems = []
    for name, path in SAME:
        values = [field_of(s.data, path) for s in shards]
        if any(v != values[0] for v in values[1:]):
            each = "; ".join(f"{s.path}: {v!r}" for s, v in zip(shards, values, strict=True))
            problems.append(f"`{name}` differs: {each}")
    if problems:
        raise MergeError("the shards are not one night's (run every shard with the same profile, hardware, vLLM, "
                         "plugin and gate settings): " + "; ".join(problems))


def check_disjoint(shards: Sequence[Shard]) -> None:
    """Refuse a test that two shards ran (or one shard twice): which run counts cannot be told."""
    seen: dict[str, Path] = {}
    for shard in shards:
        for t in shard.results.tests:
            if t.nodeid in seen:
                raise MergeError(f"{t.nodeid} is in {seen[t.nodeid]} and in {shard.path}: shards must select "
                                 "disjoint tests (check the -k, --splits/--group or paths of each shard); neither "
                                 "run is dropped or averaged")
            seen[t.nodeid] = shard.path


def as_verdict(entry: VerdictEntry, where: str, *, unadjusted: bool) -> Verdict:
    """A recorded verdict as the gate's `Verdict`: as adjusted in its shard, or (``unadjusted``) before the
    adjustment, from its `unadjusted` (word, p, note). The se goes back as the fixed part of the variance, which is
    all the adjustment reads of it (what the verdict can catch)."""
    from pytest_specdec.gate.kinds import check_decision
    from pytest_specdec.gate.stats import Verdict

    verdict, p, note = entry.verdict, entry.p, entry.note
    if unadjusted:
        raw = entry.unadjusted
        if not isinstance(raw, Mapping) or "p" not in raw:
            raise MergeError(f"{where} has no `unadjusted` (its p before the session's adjustment): the shard was "
                             "written by a pytest-specdec without it; run the shard again with this version")
        try:
            verdict = check_decision(raw.get("verdict"), f"{where}.unadjusted.verdict")
        except ValueError as exc:
            raise MergeError(str(exc)) from None
        p, note = raw["p"], str(raw.get("note") or "")
        if p is not None and not (isinstance(p, (int, float)) and 0 <= p <= 1):
            raise MergeError(f"{where}.unadjusted.p is {p!r}, not a p-value or null")
    return Verdict(metric=entry.metric, verdict=verdict, baseline=entry.baseline, now=entry.now, delta=entry.delta,
                   ci_low=entry.ci_low, ci_high=entry.ci_high, p=None if p is None else float(p),
                   n_baseline=entry.n_baseline or 0, n_now=entry.n_now or 0, unit=entry.unit, method=entry.method,
                   threshold=entry.threshold, note=note, var_fixed=None if entry.se is None else entry.se ** 2,
                   var_run=None if entry.se is None else 0.0, df=entry.df, family=entry.family, mde=entry.mde,
                   per=entry.per)


def fails_on_verdicts(rule: FailRule, test: TestEntry, verdicts: Sequence[Verdict], drift: Sequence[Verdict] = ()
                      ) -> bool:
    """Whether the plugin's rule fails the test on these verdicts (a regression, or inconclusive under
    --specdec-fail-inconclusive) or on its gated ``drift`` (`TestEnd.drifted`: regressed, or inconclusive under the
    same option), as its test's end would (judged against other machines' nights where its baseline names them:
    acceptance alone)."""
    from typing import get_args

    from pytest_specdec.gate.kinds import Status

    b = test.baseline
    status = next((s for s in get_args(Status) if b is not None and s == b.status), None)
    if b is None or status is None:  # no baseline judged it: only a drift can fail it here
        end = rule.decide(checked=True, status="missing", verdicts=(), drift=drift)
        return bool(end.drifted)
    end = rule.decide(checked=b.checked, status=status, verdicts=verdicts, portable_only=bool(b.machines),
                      drift=drift)
    return (end.fails and end.outcome in (REGRESSED, INCONCLUSIVE)) or bool(end.drifted)


def merge(shards: Sequence[Shard], expected: Sequence[str] | None = None) -> Merged:
    """The shards as one night: checked to be one night's and disjoint, the gated and shown families adjusted over
    every shard's verdicts together at the shards' level and rule, each test's outcome by the plugin's rule on its
    merged verdicts, and ``expected`` tests in no shard as `insufficient-data`."""
    from pytest_specdec.gate.check import FailRule, adjusted_all, members
    from pytest_specdec.gate.drift import gated_drift
    from pytest_specdec.gate.kinds import GATED, NOT_COMPARABLE
    from pytest_specdec.output.results import MergedTest, merged_results

    if not shards:
        raise MergeError("no shard results files given")
    check_one_night(shards)
    check_disjoint(shards)
    first = shards[0]
    settings = first.results.gate.settings
    alpha = float(settings.get("alpha", 0.05))
    multiplicity = str(settings.get("multiplicity", "bh"))
    rule = FailRule(fail_inconclusive=first.results.gate.fail_inconclusive)

    family: list[tuple[str, Recorded]] = []
    where_of: dict[str, tuple[Shard, int, TestEntry]] = {}
    for shard in shards:
        for i, t in enumerate(shard.results.tests):
            where_of[t.nodeid] = (shard, i, t)
            drift = t.drift_judged(f"{shard.path}: tests[{i}]")
            if t.verdicts or (drift is not None and drift.members):
                raw = tuple(as_verdict(v, f"{shard.path}: tests[{i}].verdicts.{m}", unadjusted=True)
                            for m, v in t.verdicts.items())
                family.append((t.nodeid, Recorded(raw, t.baseline.max_looks if t.baseline else 1, drift)))
    final = adjusted_all(family, final=True, multiplicity=multiplicity, alpha=alpha, gated_size=0, family_size=0)
    recorded = dict(family)
    size = sum(1 for _, c in family for v in members(c)
               if v.family == GATED and v.p is not None and v.verdict != NOT_COMPARABLE)

    tests, failed, changed = [], [], []
    for nodeid, (shard, i, t) in where_of.items():
        merged = MergedTest(str(shard.path), shard.data["tests"][i], t, outcome=t.outcome)
        if nodeid in final:
            verdicts = tuple(final[nodeid].verdicts)
            drift = final[nodeid].drift_of(recorded[nodeid])
            merged = replace(merged, verdicts=verdicts, drift=drift)
            before = [as_verdict(v, f"{shard.path}: tests[{i}]", unadjusted=False) for v in t.verdicts.values()]
            was, now = gated_drift(recorded[nodeid].drift), gated_drift(drift)  # as its shard left it, merged
            outcome = t.outcome
            if outcome in ("passed", "failed") and (outcome == "passed" or fails_on_verdicts(rule, t, before, was)):
                outcome = "failed" if fails_on_verdicts(rule, t, verdicts, now) else "passed"
            if outcome != t.outcome:
                changed.append((nodeid, t.outcome, outcome))
                merged = replace(merged, outcome=outcome, why=(
                    f"{'fails' if outcome == 'failed' else 'passes'} once the night's family is adjusted together "
                    f"({multiplicity} over {size} gated p-values of {len(shards)} shards); its shard {shard.path} "
                    f"said {t.outcome}"))
        if merged.outcome == "failed":
            failed.append(nodeid)
        tests.append(merged)

    missing = [n for n in expected or () if n not in where_of]
    data = merged_results(shards, tests, missing)
    sweeps = [f"{x.sweep} ({s.path})" for s in shards for x in s.results.crossovers if x.failed]
    errors = [f"{s.path}: {e['what']}: {e['error']}" for s in shards for e in s.results.errors]
    machine = tuple(str(s.path) for s in shards if s.results.gate.machine_failed)
    return Merged(data, tuple(failed), tuple(changed), tuple(missing), tuple(sweeps), tuple(errors), machine, size,
                  multiplicity, alpha)


def outcome_counts(tests: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many tests ended each way, for the closing line."""
    out: dict[str, int] = {}
    for t in tests:
        out[str(t.get("outcome"))] = out.get(str(t.get("outcome")), 0) + 1
    return out
