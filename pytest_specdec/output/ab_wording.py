"""An A/B session's sentences (`gate/ab_session.py`): what the two sides are, what differs between them, each
test's verdicts, looks and attribution, what its end decided (a regressed candidate's message, an inconclusive
one's warning) and the session's closing line; the nightly's wording (`wording.py`) supplies the shared pieces.
It words what the A/B gate decided and decides nothing: the session drives the gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pytest_specdec.gate.kinds import (
    CANNOT_SETTLE,
    EQUIVALENCE,
    GATED,
    IMPROVED,
    INCONCLUSIVE,
    MAX_REACHED,
    REGRESSED,
    SHOWN,
    UNCHANGED,
)
from pytest_specdec.gate.registry import label
from pytest_specdec.output.wording import (
    MULTIPLICITY_NAMES,
    format_change,
    format_p,
    format_threshold,
    guard_text,
    split_sentence,
    table,
)

if TYPE_CHECKING:
    from pytest_specdec.gate.ab_session import ABJudgement
    from pytest_specdec.gate.check import TestEnd
    from pytest_specdec.gate.protocol import SessionEnd
    from pytest_specdec.gate.stats import Verdict


#: An A/B test's regression, pointed at (gate.ab_session.Cause): short, and no more than the verdicts say.
AB_CAUSES = {"acceptance": "acceptance (the candidate's drafts are accepted less often)",
             "step time": "step time (the candidate drafts the same tokens more slowly)",
             "non-speculative path": "the non-speculative path (the candidate install's reference slowed too; its "
                                     "speedup did not regress)",
             "acceptance and step time": "acceptance and step time (the candidate's drafts are accepted less and "
                                         "its steps cost more)"}


def ab_attribution(c: ABJudgement) -> str | None:
    """The A/B attribution line's text: the cause, and the split of the candidate's speedup against the base's."""
    cause = c.cause()
    if cause is None:
        return None
    return AB_CAUSES[cause] + (f"; {split_sentence(c.split)}" if c.split is not None else "")


def ab_verdict_line(v: Verdict) -> str:
    """One A/B verdict in a line: metric, verdict, Δ with its CI, p and what it catches."""
    p = format_p(v)
    threshold = "" if v.threshold is None else f", threshold {format_threshold(v)}"
    change = f"Δ {format_change(v)}"
    return f"{label(v.metric)} {v.verdict}: {change}, p {p}, {guard_text(v)}{threshold}"


#: Why an A/B test stopped adding pairs (`gate.ab.Stop`), in words.
AB_STOPS = {REGRESSED: "stopped: regressed at the session family's level",
            IMPROVED: "stopped: improved at the session family's level",
            EQUIVALENCE: "stopped: every gated verdict unchanged (equivalence)",
            CANNOT_SETTLE: "stopped: no more pairs could settle an open verdict",
            MAX_REACHED: "max reached"}


def ab_pairs_text(c: ABJudgement) -> str:
    """The pairs a test used against its maximum, its looks and why it stopped: "12 of 24 pairs, looks at 12,
    stopped: every gated verdict unchanged (equivalence)"."""
    pairs = c.looks[-1] if c.looks else max((v.n_now for v in c.shown()), default=0)
    most = f" of {c.plan.looks[-1]}" if c.plan.looks else ""
    looks = f", looks at {', '.join(map(str, c.looks))}" if len(c.looks) > 1 else ""
    stop = f", {AB_STOPS[c.stop]}" if c.stop else ""
    return f"{pairs}{most} pairs{looks}{stop}"


def ab_test_lines(nodeid: str, c: ABJudgement) -> list[str]:
    """A test's A/B verdicts for the terminal, as its end adjusted them, and what a regression points at."""
    lines = [f"specdec A/B: {nodeid}: {ab_sides(c)} ({ab_pairs_text(c)})"]
    lines += [f"  {ab_verdict_line(v)}" for v in c.shown()]
    lines += ab_changed_lines(c)
    why = ab_attribution(c)
    if why is not None:
        lines.append(f"  attribution: {why}")
    return lines


def ab_sides(c: ABJudgement) -> str:
    """What an A/B compares: the drafts, and on two installs their vLLM and torch; in an engine-mode A/B the modes."""
    if c.plan.engines is not None:
        base, candidate = c.plan.engines
        return f"candidate engine mode {candidate} vs base engine mode {base} ({c.plan.candidate_draft})"
    if not c.plan.installs:
        return f"candidate {c.plan.candidate_draft} vs base {c.plan.base_draft}"

    def side(name: str, draft: str) -> str:
        assert c.plan.installs is not None
        i = c.plan.installs[name]
        return f"{i.distribution} {i.vllm} (torch {i.torch}) with {draft}"

    return f"candidate {side('candidate', c.plan.candidate_draft)} vs base {side('base', c.plan.base_draft)}"


#: The order the session's line counts the verdicts in.
DECISIONS_TOLD = (REGRESSED, IMPROVED, UNCHANGED, INCONCLUSIVE)
#: The differences between an A/B's sides the terminal lists before pointing at the JSON for the rest.
AB_CHANGED_SHOWN = 8


def ab_changed_lines(c: ABJudgement) -> list[str]:
    """What differs between the base's side and the candidate's (versions, engine configs), base → candidate."""
    items = list(c.plan.changed.items())
    lines = [f"  differs: {k}: {a!r} → {b!r}" for k, (a, b) in items[:AB_CHANGED_SHOWN]]
    if len(items) > AB_CHANGED_SHOWN:
        lines.append(f"  differs: {len(items) - AB_CHANGED_SHOWN} more, in the JSON's ab.changed")
    return lines


def ab_level(c: ABJudgement) -> str:
    """The CI level of a test's A/B verdicts: 1 - 2 alpha, alpha split over its planned looks."""
    return f"{100 * (1 - 2 * c.alpha / max(1, c.max_looks)):.4g}% CI"


def ab_failure(c: ABJudgement, *, multiplicity: str) -> str:
    """A test whose candidate regressed against its base: the metrics, the table, the attribution and why."""
    bad = c.regressed()
    why = ab_attribution(c)
    return "\n".join([
        f"specdec A/B: the candidate regressed against the base: {', '.join(v.metric for v in bad)}",
        f"{ab_sides(c)}; p: one-sided, adjusted by {MULTIPLICITY_NAMES[multiplicity]} over the session's A/B verdicts",
        "", table(c.shown(), ab_level(c), ("base", "candidate")), "",
        *([f"attribution: {why}"] if why else []),
        "why:", *[f"  {v.metric}: {v.note}" for v in bad]])


def ab_test_end_message(nodeid: str, c: ABJudgement, end: TestEnd, *, multiplicity: str
                        ) -> tuple[list[str], str | None, str | None]:
    """An A/B test's end (`ABGate.test_end`) in words: its lines for the terminal, its failure message and its
    warning (either None)."""
    lines = ab_test_lines(nodeid, c)
    if end.outcome == REGRESSED:
        return lines, ab_failure(c, multiplicity=multiplicity), None
    if end.outcome != INCONCLUSIVE:
        return lines, None, None
    what = "; ".join(f"{v.metric} {guard_text(v)}" for v in end.open)
    msg = (f"{len(end.open)} gated A/B metric(s) inconclusive after {c.looks[-1] if c.looks else '?'} pair(s): "
           f"{what}")
    if end.fails:
        return lines, (f"specdec A/B: {msg} (--specdec-fail-inconclusive)\n{ab_sides(c)}\n\n"
                       f"{table(c.shown(), ab_level(c), ('base', 'candidate'))}"), None
    return lines, None, f"{nodeid}: {msg}; the test passes (--specdec-fail-inconclusive fails it)"


def ab_session_lines(checks: Sequence[tuple[str, ABJudgement]], end: SessionEnd, *, multiplicity: str
                     ) -> tuple[list[str], list[str]]:
    """The A/B session's end (`gate.ab_session.ABGate.finish`): its closing line (tests judged, how many regressed
    and at what, the verdicts' counts), and the tests that regressed only once the whole family was known."""
    from pytest_specdec.output.drift import drift_failure

    by = dict(checks)
    late = [f"specdec: {n}: after the whole session's A/B family was known, "
            + ab_failure(by[n], multiplicity=multiplicity).removeprefix("specdec A/B: ")
            for n, e in end.late_regressions if e.outcome == REGRESSED and not by[n].failed]
    late += [str(drift_failure(n, drift, e.drifted)).replace(
                 f"specdec: {n}:", f"specdec: {n}: after the whole session's A/B family was known,", 1)
             for n, e in end.late_regressions if e.drifted and (drift := by[n].drift) is not None]
    if not checks:
        return [], late

    def counted(family: str) -> str:
        """The family's verdicts by kind, e.g. "2 regressed, 5 unchanged"."""
        counts: dict[str, int] = {}
        for _, c in checks:
            for v in c.shown():
                if v.family == family:
                    counts[v.verdict] = counts.get(v.verdict, 0) + 1
        return ", ".join(f"{counts[k]} {k}" for k in DECISIONS_TOLD if k in counts) or "none"

    failed = [(n, c) for n, c in checks if c.regressed()]
    causes = ", ".join(f"{n.split('::')[-1]}: {c.cause() or 'tok/s or latency'}" for n, c in failed)
    shown = any(v.family == SHOWN for _, c in checks for v in c.shown())
    stops: dict[str, int] = {}
    for _, c in checks:
        if c.stop:
            stops[c.stop] = stops.get(c.stop, 0) + 1
    used = sum(c.looks[-1] for _, c in checks if c.looks)
    most = sum(c.plan.looks[-1] for _, c in checks if c.plan.looks)
    return [f"specdec A/B: {len(checks)} test(s) judged candidate vs base, {len(failed)} regressed"
            + (f" ({causes})" if causes else "") + f"; verdicts: {counted(GATED)}"
            + (f"; shown, never failing (the references' tok/s, the speedups): {counted(SHOWN)}" if shown else ""),
            f"specdec A/B: pairs used {used} of at most {most}; stopped: "
            + (", ".join(f"{n} {k}" for k, n in sorted(stops.items())) or "none")], late
