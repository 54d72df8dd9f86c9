"""`pytest-specdec compare`'s nightly comparison rendered: the terminal's verdict table and closing lines, and the
comparison as data (`--json`). The use case judges (`app/compare.py`, through the gate's one pipeline); what it
returns is the gate's typed `gate.comparison.Comparison`, which this module only words.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.kinds import (
    IMPROVED,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    REGRESSED,
    UNCHANGED,
    Decision,
)

if TYPE_CHECKING:
    from pytest_specdec.gate.comparison import Comparison, Row

#: A test's gated verdicts, the worst first: the one word `word` tells it by.
WORST_FIRST: tuple[Decision, ...] = (REGRESSED, INCONCLUSIVE, IMPROVED, UNCHANGED)


def word(r: Row) -> str:
    """The test's worst gated verdict, as the report's status reads it (regressed before inconclusive)."""
    seen = {v.verdict for v in r.gated}
    worst = next((w for w in WORST_FIRST if w in seen), "no verdicts")
    return worst + (" (check=False: shown, not failed)" if worst == REGRESSED and not r.checked else "")


def table_lines(cmp: Comparison, *, shown: bool = False) -> list[str]:
    """Per test, the terminal's verdict table (gated metrics; with ``shown`` every metric), worst first."""
    from pytest_specdec.output.wording import split_sentence, table

    level = f"{100 * (1 - 2 * cmp.alpha):.4g}% CI"
    order = {"compared": 1, NOT_COMPARABLE: 2, "no runs": 3}
    rows = sorted(cmp.rows, key=lambda r: (0 if r.failed(cmp.rule) else 1 if r.regressed or r.drifted(cmp.rule)
                                           else order.get(r.status, 4)))
    out: list[str] = []
    for r in rows:
        if r.status == "compared" or (r.status == "no runs" and r.verdicts):  # a dead arm in NEW is judged too
            out.append(f"{r.nodeid}: {word(r)}" if r.status == "compared" else f"{r.nodeid}: no runs: {r.reason}")
            out += ["  " + line for line in table(r.verdicts if shown else r.gated, level).splitlines()]
            if r.split is not None:
                out.append(f"  speedup explained: {split_sentence(r.split)}")
        elif r.status == NOT_COMPARABLE:
            opted = "" if r.checked else " (check=False: shown, not failed)"
            out.append(f"{r.nodeid}: {NOT_COMPARABLE}{opted} (measured under other conditions):")
            out += [f"  {k}: {a!r} → {b!r}" for k, (a, b) in r.fields.items()]
        else:
            out.append(f"{r.nodeid}: {r.status}" + (f": {r.reason}" if r.reason else ""))
        if r.drift is not None:
            from pytest_specdec.output.drift import verdict_lines

            out.append("  drift within NEW's session (early vs late half of one server's runs):")
            out += verdict_lines(r.drift, "    ")
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
    lines += failing_lines(cmp.still_open, cmp.drifted, new_name, "test(s)")
    lines += [crossover_line(x) for x in cmp.crossovers]
    dead = [r.nodeid for r in cmp.rows if r.dead]
    if dead:
        lines.append(f"specdec compare: {len(dead)} test(s) without a valid run in {new_name}, failed as the "
                     f"plugin fails them: {', '.join(dead)}")
    return lines


def failing_lines(still: Sequence[str], drifted: Sequence[str], new_name: str, tests: str) -> list[str]:
    """The lines naming the tests that fail without a regressed gated metric: a gated verdict still inconclusive
    under --specdec-fail-inconclusive (NEW's session's, or compare's --fail-inconclusive), and a gated drift within
    NEW's session, for `compare` of nightly and A/B results alike."""
    lines = []
    if still:
        lines.append(f"specdec compare: {len(still)} {tests} with a gated verdict still inconclusive, failed as "
                     f"--specdec-fail-inconclusive fails them: {', '.join(still)}")
    if drifted:
        lines.append(f"specdec compare: {len(drifted)} {tests} whose gated drift within {new_name}'s session (late "
                     "runs against early runs on one server) regressed, or stayed inconclusive under "
                     f"--specdec-fail-inconclusive, failed as the session fails them: {', '.join(drifted)}")
    return lines


def to_json(cmp: Comparison) -> dict[str, Any]:
    """The comparison as data (`--json`): per test its status and verdicts in the results' verdict format, and its
    drift within NEW's session in the results' drift format; `regressed` lists every test with a regressed gated
    metric, `drifted` every test whose gated drift regressed, `failed` those that make the exit status 1."""
    from pytest_specdec.output.results import verdict_entry as verdict_json
    from pytest_specdec.output.schema import drift_entry, machine_factor_entry, split_entry

    return {
        "alpha": cmp.alpha, "multiplicity": cmp.multiplicity,
        "baselines": [{"folder": folder, "hardware": name} for folder, name in cmp.machines],
        "machine_factor": machine_factor_entry(cmp.machine) if cmp.machine else None,
        REGRESSED: [r.nodeid for r in cmp.regressed],
        "drifted": cmp.drifted,
        "crossovers": {x.sweep: {**(verdict_json(x.verdict) if x.verdict else {"verdict": None}), "line": x.line,
                                 "family": x.family, "error": x.error, "failed": x.failed, "why_none": x.note or None}
                       for x in cmp.crossovers},
        "failed": [r.nodeid for r in cmp.failed()],
        "failed_sweeps": [x.sweep for x in cmp.failed_sweeps],
        "tests": [{"nodeid": r.nodeid, "status": r.status, REGRESSED: r.regressed, "checked": r.checked,
                   "failed": r.failed(cmp.rule), "reason": r.reason,
                   "not_comparable_fields": {k: [a, b] for k, (a, b) in r.fields.items()},
                   "verdicts": {v.metric: verdict_json(v) for v in r.verdicts},
                   "split": None if r.split is None else split_entry(r.split),
                   "drift": None if r.drift is None else drift_entry(r.drift)} for r in cmp.rows],
    }


def names(paths: Sequence[Path]) -> tuple[str, str]:
    """How the two files are named in the lines: their paths, or OLD/NEW when they print the same."""
    a, b = (str(p) for p in paths)
    return (a, b) if a != b else ("OLD", "NEW")
