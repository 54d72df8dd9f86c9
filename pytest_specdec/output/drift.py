"""A test's drift within the session (`gate.drift`) in words: the terminal's line, the failure message of a gated
drift that fails its test, and the report's short text. Words only: the gate decided."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.drift import LABELS, Drift, DriftVerdict
from pytest_specdec.gate.kinds import INCONCLUSIVE, POINTS, unit_mark
from pytest_specdec.output.schema import drift_verdict_entry

if TYPE_CHECKING:
    from pytest_specdec.gate.stats import Verdict


def _figure(v: DriftVerdict | Mapping[str, Any], which: str) -> str:
    x = v[which] if isinstance(v, Mapping) else getattr(v, which)
    if x is None:
        return "—"
    unit = v["unit"] if isinstance(v, Mapping) else v.unit
    return f"{x:.3f}" if unit == POINTS else f"{x:.3f} ref steps"


def verdict_text(v: DriftVerdict | Mapping[str, Any], alpha: float) -> str:
    """One drift verdict: its metric, word, early → late figures, change, interval and p, and its note (how it was
    decided; a gated one's adjustment over the session's family) (a results file's entry or the verdict itself)."""
    d = dict(v) if isinstance(v, Mapping) else drift_verdict_entry(v)
    mark = unit_mark(d["unit"])
    head = f"{LABELS.get(d['metric'], d['metric'])} {d['verdict']}"
    if d.get("family") == "gated":
        head += " (gated)"
    n = f"{len(d['early_runs'])}+{len(d['late_runs'])} runs"
    if d["delta"] is None:
        return f"{head}: {d['note'] or 'not judged'} ({n})"
    lo, hi = d["ci"]
    p = "exact" if d["p"] is None else f"p {d['p']:.2g}"
    note = str(d.get("note") or "").lstrip("; ")
    return (f"{head}: early {_figure(d, 'early')} → late {_figure(d, 'late')}, Δ {d['delta']:+.2f}{mark} "
            f"({100 * (1 - 2 * alpha):.0f}% CI {lo:+.2f}{mark} .. {hi:+.2f}{mark}, {p}, threshold "
            f"{d['threshold']:+g}{mark}, {n})" + (f"; {note}" if note else ""))


def cell_text(v: DriftVerdict) -> str:
    """One drift verdict in a few words, for a table's cell (`pytest-specdec history`): its word and change, and
    whether it was gated."""
    mark = unit_mark(v.unit)
    change = "" if v.delta is None else f" {v.delta:+.2f}{mark}"
    return f"{v.verdict}{change}" + (" (gated)" if v.family == "gated" else "")


def drift_lines(nodeid: str, drift: Drift) -> list[str]:
    """The terminal's lines for the test: one per metric, and the runs left out once. Printed once the test's end
    has adjusted each over the session's family of its kind so far, as the failure, the results and the report say
    it; where no such end came (no gate, a failed body or set-up), as measured, and said so."""
    raw = drift.adjusted is None and bool(drift.verdicts)
    return [f"specdec: drift {nodeid} (early vs late half of one server's runs"
            + ("; before the family's adjustment" if raw else "") + "):", *verdict_lines(drift)]


def final_drift_lines(nodeid: str, said: Drift | None, final: Drift | None, failing: Collection[str] = ()
                      ) -> list[str]:
    """The test's drift verdicts whose word the session's final adjustment changed from what the terminal said at the
    test's end (``said``: adjusted then over the family so far, padded with the tests still to come), each as it
    stands now, so the terminal ends saying what the results and the report say; those its late failure already
    names (``failing``) are left to it. Empty when nothing changed."""
    if final is None:
        return []
    before = {} if said is None else {v.metric: v.verdict for v in said.shown}
    changed = [v for v in final.shown if v.metric not in failing and before.get(v.metric) != v.verdict]
    if not changed:
        return []
    return [f"specdec: drift {nodeid}, after the whole session's family was known"
            + "".join(f" ({v.metric}: {before[v.metric]} at the test's end)" for v in changed if v.metric in before)
            + ":", *(f"  {verdict_text(v, final.alpha)}" for v in changed)]


def verdict_lines(drift: Drift, indent: str = "  ") -> list[str]:
    """Each drift verdict as it stands, a line each, and the runs left out once (the terminal's, `compare`'s)."""
    lines = [f"{indent}{verdict_text(v, drift.alpha)}" for v in drift.shown]
    left = sorted({x for v in drift.shown for x in v.left_out}, key=lambda x: int(x.split()[1].rstrip(":")))
    if left:
        lines.append(f"{indent}left out: {'; '.join(left)}")
    return lines


def drift_failure(nodeid: str, drift: Drift, drifted: Sequence[Verdict]) -> str | None:
    """The failure message of a test that its gated drift fails (``drifted``: as the failure rule named them,
    `check.TestEnd.drifted`: regressed, or inconclusive under --specdec-fail-inconclusive), each named with its
    verdict; None when none does."""
    names = [v.metric for v in drifted]
    if not names:
        return None
    by_word: dict[str, list[str]] = {}
    for v in drifted:
        by_word.setdefault(v.verdict, []).append(v.metric)
    said = "; ".join(f"{word}{' (--specdec-fail-inconclusive)' if word == INCONCLUSIVE else ''}: {', '.join(ms)}"
                     for word, ms in by_word.items())
    failing = [v for v in drift.shown if v.metric in names]
    return "\n".join([f"specdec: {nodeid}: drift within the session {said} (late runs against early runs on one "
                      "server, judged within tonight)",
                      *(f"  {v.metric}: {verdict_text(v, drift.alpha)}" for v in failing)])


def drift_warning(nodeid: str, drift: Drift, still_open: Sequence[Verdict]) -> str | None:
    """The warning of a test that passes with a gated drift still inconclusive (``still_open``: as the failure rule
    named them, `check.TestEnd.drift_open`), as a gated metric still inconclusive warns; None when none is."""
    names = [v.metric for v in still_open]
    if not names:
        return None
    why = "; ".join(verdict_text(v, drift.alpha) for v in drift.shown if v.metric in names)
    return (f"{nodeid}: gated drift within the session inconclusive: {', '.join(names)} ({why}); the test passes "
            "(--specdec-fail-inconclusive fails it)")


def drift_summary(entry: Mapping[str, Any] | None) -> list[str]:
    """The report's short text: one line per drift metric of a results file's `drift` entry."""
    if not entry:
        return []
    alpha = float(entry.get("alpha", 0.05))
    return [verdict_text(v, alpha) for v in (entry.get("verdicts") or {}).values()]
