"""An A/B session's results rendered for `pytest-specdec compare`: per A/B test NEW's verdicts (the terminal's A/B
table) with OLD's beside them, the closing lines and the comparison as data (`--json`). The use case judges each
test again (`app/ab_compare.py`, through the A/B gate's functions); what it returns is the gate's typed
`gate.comparison.ABComparison`, which this module only words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.kinds import REGRESSED

if TYPE_CHECKING:
    from pytest_specdec.gate.ab_session import ABJudgement
    from pytest_specdec.gate.comparison import ABComparison


def ab_table_lines(cmp: ABComparison, old_name: str, new_name: str) -> list[str]:
    """Per A/B test: NEW's verdicts (the terminal's A/B table), and where OLD has the test, OLD's Δ beside each."""
    from pytest_specdec.output.ab_wording import ab_level, ab_sides
    from pytest_specdec.output.wording import format_delta, table

    out: list[str] = []
    for r in cmp.rows:
        if r.check is None:
            out += [f"{r.nodeid}: {r.status}" + (f": {r.reason}" if r.reason else ""), ""]
            continue
        word = REGRESSED if r.check.regressed() else "no gated regression"
        opted = " (check=False: shown, not failed)" if r.check.regressed() and not r.check.checked else ""
        out.append(f"{r.nodeid}: {word}{opted}; {ab_sides(r.check)} ({r.status})")
        out += ["  " + line for line in table(r.check.shown(), ab_level(r.check), ("base", "candidate")).splitlines()]
        if r.old is not None:
            before = {v.metric: v for v in r.old.shown()}
            out += [f"  {v.metric}: Δ {format_delta(before[v.metric].delta, v.unit)} {before[v.metric].verdict} in "
                    f"{old_name} ({ab_sides(r.old)}) → Δ {format_delta(v.delta, v.unit)} {v.verdict} in {new_name}"
                    for v in r.check.shown() if v.metric in before]
        if r.check.drift is not None:
            from pytest_specdec.output.drift import verdict_lines

            out.append(f"  drift within {new_name}'s session (the candidate's runs, early vs late half on one server):")
            out += verdict_lines(r.check.drift, "    ")
        out.append("")
    return out


def ab_summary_lines(cmp: ABComparison, new_name: str) -> list[str]:
    """The closing lines: the A/B tests judged, and those that fail as the plugin fails them."""
    from pytest_specdec.output.compare import failing_lines
    from pytest_specdec.output.wording import MULTIPLICITY_NAMES

    judged = [r for r in cmp.rows if r.check is not None]
    bad = [r for r in cmp.failed() if r.check is not None and r.check.regressed()]
    return [f"specdec compare: {len(judged)} A/B test(s) of {new_name} judged again, candidate vs base pair by pair "
            f"({MULTIPLICITY_NAMES[cmp.multiplicity]} over the A/B family, alpha {cmp.alpha:g})",
            f"specdec compare: {len(bad)} A/B test(s) regressed against their base"
            + (": " + ", ".join(r.nodeid for r in bad) if bad else ""),
            *failing_lines(cmp.still_open, cmp.drifted, new_name, "A/B test(s)")]


def ab_to_json(cmp: ABComparison) -> dict[str, Any]:
    """The A/B comparison as data (`--json`): per test its status, both sides' verdicts and NEW's drift in the
    results' format; `drifted` names the tests whose gated drift regressed."""
    from pytest_specdec.output.results import verdict_entry
    from pytest_specdec.output.schema import drift_entry

    def verdicts(c: ABJudgement | None) -> dict[str, Any] | None:
        return None if c is None else {v.metric: verdict_entry(v) for v in c.shown()}

    return {"alpha": cmp.alpha, "multiplicity": cmp.multiplicity, "ab": True,
            "failed": [r.nodeid for r in cmp.failed()],
            REGRESSED: [r.nodeid for r in cmp.rows if r.check is not None and r.check.regressed()],
            "drifted": cmp.drifted,
            "tests": [{"nodeid": r.nodeid, "status": r.status, "reason": r.reason, "failed": r.failed(cmp.rule),
                       "checked": None if r.check is None else r.check.checked, "verdicts": verdicts(r.check),
                       "old_verdicts": verdicts(r.old),
                       "drift": None if r.check is None or r.check.drift is None else drift_entry(r.check.drift)}
                      for r in cmp.rows]}
