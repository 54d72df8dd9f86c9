"""Every sentence the gate's outcomes are told in: verdict tables, a failing test's message, the machine factor,
the session's closing lines. The gate decides (typed outcomes); this module only words them, for the terminal,
the JUnit properties, the report and `pytest-specdec compare` alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specdec.gate.kinds import (
    GATED,
    IMPROVED,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    PERCENT,
    REGRESSED,
    UNCHANGED,
    Decision,
    Unit,
    unit_mark,
)
from pytest_specdec.gate.registry import GOODPUT, label, metric

if TYPE_CHECKING:
    from pytest_specdec.gate.attribution import Cause
    from pytest_specdec.gate.check import Judgement, TestEnd
    from pytest_specdec.gate.machine import MachineFactor
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.gate.variance import NightVariance
    from pytest_specdec.measure.explain import Split
    from pytest_specdec.measure.runner import CaseResult

MULTIPLICITY_NAMES = {"bh": "Benjamini-Hochberg", "holm": "Holm"}
#: The order a count of verdicts is told in: the quiet majority first, then what needs a look.
COUNT_ORDER: tuple[Decision, ...] = (UNCHANGED, REGRESSED, IMPROVED, INCONCLUSIVE, NOT_COMPARABLE)


def format_value(name: str, x: float | None, times: str = "x") -> str:
    """A metric's value as the failure table and the HTML report show it."""
    m = metric(name)
    if m is not None:
        return m.format(x, times)
    return "—" if x is None else f"{x:.4g}"


class VerdictFields(Protocol):
    """The fields of a verdict the formatters below read: a `gate.stats.Verdict` and a results file's
    `output.schema.VerdictEntry` alike, so the terminal, JUnit, the report and `compare` word one the same."""

    @property
    def verdict(self) -> Decision: ...
    @property
    def delta(self) -> float | None: ...
    @property
    def ci_low(self) -> float | None: ...
    @property
    def ci_high(self) -> float | None: ...
    @property
    def p(self) -> float | None: ...
    @property
    def unit(self) -> Unit: ...
    @property
    def threshold(self) -> float | None: ...
    @property
    def exact(self) -> bool: ...


def format_delta(x: float | None, unit: str) -> str:
    """A change as the terminal, JSON readers and the report show it: "+3.1 %" or "-0.40 pt"."""
    if x is None:
        return "—"
    digits = 1 if unit == PERCENT else 2
    shown = round(x, digits) + 0.0  # a zero is "+0.0", never "-0.0"
    return f"{shown:+.{digits}f}{unit_mark(unit)}"


def verdict_phrase(label: str, v: VerdictFields) -> str:
    """"speedup regressed -41.2 %": a metric's verdict and change, in one phrase of a summary line."""
    return f"{label} {v.verdict}" + ("" if v.delta is None else f" {format_delta(v.delta, v.unit)}")


def _interval(v: VerdictFields) -> str:
    return f"{format_delta(v.ci_low, v.unit)} .. {format_delta(v.ci_high, v.unit)}"


def format_ci(v: VerdictFields) -> str:
    """A verdict's CI of the change, as a table's CI column shows it: "-25.6 % .. -19.0 %", "—" where it has
    none, and for the exact rule "-0.2 % .. +0.3 % (range)": the range of the differences, not a CI at the
    column's level. The one CI formatter."""
    if v.ci_low is None or v.ci_high is None:
        return "—"
    return _interval(v) + (" (range)" if v.exact else "")


def format_change(v: VerdictFields) -> str:
    """A verdict's change with its interval, in running text: "-22.4 % (CI -25.6 % .. -19.0 %)", the exact rule's
    "+0.1 % (range -0.2 % .. +0.3 %)", "—" without a change."""
    if v.delta is None:
        return "—"
    if v.ci_low is None or v.ci_high is None:
        return format_delta(v.delta, v.unit)
    return f"{format_delta(v.delta, v.unit)} ({'range' if v.exact else 'CI'} {_interval(v)})"


def format_p(v: VerdictFields) -> str:
    """A verdict's p-value as shown: "exact" for the exact rule (no test), "—" for none, else 2 digits."""
    return "exact" if v.exact else ("—" if v.p is None else f"{v.p:.2g}")


def format_threshold(v: VerdictFields) -> str:
    """A verdict's threshold, signed on its bad side: "-5 %", "+40 %", "-2 pt"; "—" for none."""
    return "—" if v.threshold is None else f"{v.threshold:+g}{unit_mark(v.unit)}"


def format_verdict(v: VerdictFields) -> str:
    """A verdict with its change and interval: "regressed -22.4 % (CI -25.6 % .. -19.0 %)". The one wording the
    terminal, JUnit, the report and `compare` read."""
    return v.verdict + ("" if v.delta is None else f" {format_change(v)}")


def guard_text(v: Verdict) -> str:
    """What a gated verdict can catch: "catches a drop >= 21 %", "exact", or why nothing is known."""
    return not_judged_text(v.verdict, v.method) or catch_text(v.exact, v.mde, v.threshold, v.unit,
                                                              modelled=v.mde is not None)


def not_judged_text(verdict: str, method: str) -> str | None:
    """Why a verdict caught nothing, in the words its block and JSON use (None: it was judged). A `not-comparable`
    one's method names the condition that set it aside ("machine state"), else the baseline's conditions differ;
    method "none" had too little data for any rule."""
    if verdict == NOT_COMPARABLE:
        return (f"not judged: {method}" if method and method != "none"
                else "not judged: the baseline's conditions differ")
    if method == "none":
        return "not judged: too little data (fewer than 2 values on a side)"
    return None


def catch_text(exact: bool, mde: float | None, threshold: float | None, unit: str, *, modelled: bool,
               ge: str = ">=") -> str:
    """The one wording of what a comparison catches, for the terminal (a Verdict) and the report (its JSON,
    where an unbounded ``mde`` is stored as null beside a variance)."""
    if exact:
        return "exact: repeats run to run"
    if not modelled:
        return "no variance model"
    way = "rise" if (threshold or 0) > 0 else "drop"
    if mde is None or not math.isfinite(mde):
        return f"catches no {way}: too few runs for any bound"
    return f"catches a {way} {ge} {mde:.3g}{unit_mark(unit)}"


def table(verdicts: Iterable[Verdict], ci_label: str = "90% CI", arms: tuple[str, str] = ("baseline", "now")) -> str:
    """metric | family | baseline | now | Δ | 90% CI | p | verdict, aligned (``arms`` names the two value columns)."""
    rows = [("metric", "family", *arms, "Δ", ci_label, "p", "verdict")]
    for v in verdicts:
        rows.append((label(v.metric), v.family, format_value(v.metric, v.baseline),
                     format_value(v.metric, v.now), format_delta(v.delta, v.unit), format_ci(v), format_p(v),
                     v.verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def explained_text(e: Mapping[str, Any] | None) -> str:
    """The speedup explained (`measure.explain.Explained`, as a dict) in one phrase: τ both ways, the predicted
    and measured speedup, the verification efficiency and the implied draft overhead; "" without it."""
    if not e:
        return ""

    def f(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)

    iid = f"; i.i.d. {f(e['tau_iid'], '.2f')} from α {f(e['alpha'], '.3f')}" if e.get("tau_iid") is not None else ""
    return (f"τ {e['tau']:.2f} (k {e['k']}{iid}), predicted speedup {f(e['predicted_speedup'], '.2f')}x vs measured "
            f"{f(e['speedup'], '.2f')}x, efficiency {f(e['efficiency'], '.2f')}, draft overhead "
            f"{f(e['draft_overhead'], '.3f')} target step per draft token")


def split_sentence(s: Split) -> str:
    """"speedup -18.0 %: acceptance unchanged (τ 2.41 → 2.40, -0.4 %), spec step time +22.0 %; mostly step time":
    a speedup change split into acceptance and step time (`measure.explain.Split`), and where most of it is."""
    from pytest_specdec.measure.explain import MINOR_SHARE

    share = s.acceptance_share
    acc = "unchanged" if share < MINOR_SHARE else "lower" if s.acceptance_log < 0 else "higher"
    step = format_delta(s.step_change_pct, PERCENT)
    step = f"unchanged ({step})" if 1 - share < MINOR_SHARE else step
    cause = s.cause()
    return (f"speedup {format_delta(s.speedup_change_pct, '%')}: acceptance {acc} (τ {s.tau_before:.2f} → "
            f"{s.tau_after:.2f}, {format_delta(s.tau_change_pct, '%')}), spec step time {step} (in reference "
            f"steps); {'mostly ' + cause if cause else 'both alike'}")


def split_text(d: Mapping[str, Any] | None) -> str | None:
    """`split_sentence` of a split as the results hold it (`output.schema.split_entry`); None without one."""
    from pytest_specdec.output.schema import split_of

    return None if not d else split_sentence(split_of(d))


#: What a regressed speedup's split points at (`gate.attribution.SPLIT_CAUSES`), after the split's sentence.
SPLIT_READINGS: Mapping[Cause, str] = {
    "acceptance": "fewer drafted tokens are accepted: look at the draft/head",
    "step time": "a step costs more: drafting or verification got slower (draft cost, kernels, scheduling)",
    "acceptance and step time": "fewer tokens accepted and a dearer step together"}
#: What the other causes (`gate.attribution.Cause`) read.
READINGS: Mapping[Cause, str] = {
    "draft": "speculation gains less because fewer drafted tokens are accepted: look at the draft/head",
    "speculation cost": ("speculation gains less at the same acceptance: drafting or verification got slower "
                         "(draft cost, kernels, scheduling)"),
    "non-speculative path": ("the no-speculation reference got slower while the speedup held: look at the target, "
                             "the engine or the machine, not at speculation"),
    "acceptance alone": "acceptance dropped; the speedup has not (yet) moved beyond its threshold",
    "spec throughput": "spec throughput dropped with both the reference and the speedup within their thresholds",
    "latency": "latency regressed while the throughput figures held"}


def attribution(verdicts: Iterable[Verdict], split: Split | None = None) -> str:
    """Which arm moved: the reference decoding, the speedup, the acceptance, and what that points at
    (`gate.attribution.attribute` decides it); a regressed speedup with its ``split`` (`measure.explain.split`,
    baseline → now) is pointed at what the split measures, and any other reading ends with the split."""
    from pytest_specdec.gate.attribution import SPLIT_CAUSES, attribute

    by = {v.metric: v for v in verdicts}
    parts = []
    for what, name in (("reference decoding", "reference_tok_s"), ("speedup", "speedup"),
                       ("acceptance", "acceptance_rate"), ("spec tok/s", "output_tok_s")):
        v = by.get(name)
        if v is not None:
            parts.append(verdict_phrase(what, v))
    cause = attribute(by.values(), split)
    if cause in SPLIT_CAUSES:
        assert cause is not None and split is not None
        reading = split_sentence(split) + ": " + SPLIT_READINGS[cause]
    else:
        reading = READINGS[cause] if cause is not None else ""
        if cause == "acceptance alone" and "speedup" in by and by["speedup"].verdict == NOT_COMPARABLE:
            reading = "acceptance dropped; the speedup is not judged here (not-comparable)"
        if split is not None:  # what the speedup is made of, even where it held
            reading += ("; " if reading else "") + split_sentence(split)
    return "; ".join(parts) + (f": {reading}" if reading else "")


def under_test_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Lines ``field: old → new`` for what is under test (engine config included); one line when equal."""
    from pytest_specdec.gate.baselines import diff

    changed = diff(dict(old), dict(new))
    if not changed:
        return ["  (no change in versions, draft/head hash, plugin version or engine config)"]
    return [f"  {k}: {a!r} → {b!r}" for k, (a, b) in changed.items()]


def machine_sentence(m: MachineFactor, now: str = "this machine", against: str = "the baseline nights") -> str:
    """What the terminal's line and the report say of the machine factor, built from its fields (the JSON
    stores no prose); ``now`` and ``against`` name the two sides where they are not tonight and the baselines."""
    pct = 100.0 * (m.factor - 1.0)
    way = "slower" if pct < 0 else "faster"
    ci = (f"{m.level:.3g}% CI {100 * (math.exp(m.ci_low) - 1):+.1f} % to "
          f"{100 * (math.exp(m.ci_high) - 1):+.1f} %, {m.n_tests} test(s)" if m.n_tests > 1
          else "from one test, no CI")
    tail = (f"; beyond ±{m.threshold:.3g} %: absolute figures are compared after dividing it out"
            if m.beyond else f"; within ±{m.threshold:.3g} %")
    return f"{now} ran {abs(pct):.1f} % {way} than {against} (reference tok/s, factor {m.factor:.3f}, {ci}){tail}"


#: A verdict's unit of comparison (`stats.Verdict.per`) as the failure message names it.
UNIT_WORDS = {"night": "night means", "session": "session means", "run": "runs"}


def regression_message(c: Judgement, verdicts: Sequence[Verdict], *, alpha: float, multiplicity: str, where: str,
                       accept: str) -> str:
    """A failing test's message: what regressed, the table, the attribution, what changed under test and
    the command that accepts the change. ``where`` names the baseline file, ``accept`` the command."""
    from pytest_specdec.gate.verdicts import gated_with

    bad = gated_with(verdicts, REGRESSED)
    assert c.plan.baseline is not None
    sessions = c.plan.baseline["sessions"]
    # as the verdicts compared (`stats.Verdict.per`): night means wherever a night variance is known or assumed
    per = {v.per for v in verdicts if v.verdict != NOT_COMPARABLE}
    unit = " and ".join(UNIT_WORDS[p] for p in ("night", "session", "run") if p in per) or "none"
    level = 100 * (1 - 2 * alpha / max(1, c.max_looks))
    last = sessions[-1] if sessions else {}
    lines = [
        f"specdec: {len(bad)} metric(s) regressed: {', '.join(v.metric for v in bad)}",
        f"baseline: {where} ({len(sessions)} session(s); unit of comparison: {unit}; "
        f"{c.looks[-1] if c.looks else '?'} run(s) per arm now, look {len(c.looks)} of {c.max_looks})",
        f"p: one-sided, x{c.max_looks} for the looks, adjusted by {MULTIPLICITY_NAMES[multiplicity]} over the "
        "session's metric tests (the family depends on which tests were selected)",
        "",
        table(verdicts, f"{level:.4g}% CI"),
        "",
        f"attribution: {attribution(verdicts, c.split())}",
        f"under test, baseline ({last.get('started', '?')}) → now:",
        *under_test_diff(c.plan.baseline.get("under_test", {}), dict(c.plan.under_test)),
        "why:",
        *[f"  {v.metric}: {v.note}" for v in bad],
        "",
        f"to accept this change: --update-baselines   ({accept})",
    ]
    return "\n".join(lines)


def night_lines(nights: Mapping[str, NightVariance], calibration: Mapping[str, Any] | None,
                open_verdicts: int) -> list[str]:
    """What the gated verdicts took a night to move by, and from where (the stored nights, the night prior, this
    machine's calibration); where it is the prior alone and verdicts stay open, the ways to a verdict tonight."""
    import math

    from pytest_specdec.gate.registry import GATED as GATED_METRICS
    from pytest_specdec.gate.registry import label
    from pytest_specdec.gate.scale import kind_of
    from pytest_specdec.gate.verdicts import metric_order

    shown = [(n, nights[n]) for n in GATED_METRICS if n in nights]
    if not shown:
        return []
    by_source: dict[str, list[str]] = {}
    for name, nv in shown:
        sd = math.sqrt(nv.between)
        figure = f"{100 * sd:.3g} points" if kind_of(name) == "acceptance" else f"{100 * math.expm1(sd):.3g} %"
        by_source.setdefault(nv.origin(), []).append(f"{label(name)} {figure} ({nv.df_between:.0f} df)")
    out = [f"specdec gate: night-to-night sd {', '.join(parts)}: {source}" for source, parts in by_source.items()]
    if calibration is not None:  # `results.gate_settings`' "calibration": where, how many sessions, what it catches
        out.append(f"specdec gate: judged with this machine's calibration {calibration['path']} "
                   f"({calibration['sessions']} sessions): a lone test catches {calibration['catches']}")
        tol = calibration.get("state_tolerance")
        if tol:  # measured where the calibration saw the machine's state move, else the profile's
            from pytest_specdec.gate.machine import StateTolerance

            t = StateTolerance.from_setting(tol, f"{calibration['path']}: state_tolerance")
            out.append(f"specdec gate: a stored night counts as tonight's machine state within {t.phrase()} "
                       f"({t.source})")
        raised = calibration.get("raised_thresholds") or {}
        if raised:
            out.append("specdec gate: thresholds raised to what this host resolves: " + ", ".join(
                f"{label(name)} {old:.3g} → {new:.3g}{' pt' if kind_of(name) == 'acceptance' else ' %'}"
                for name, (old, new) in sorted(raised.items(), key=lambda item: metric_order(item[0]))))
    assumed = [name for name, nv in shown if nv.prior_df and nv.df_between - nv.prior_df < 1]
    if assumed and open_verdicts and calibration is None:
        out.append("specdec gate: no stored baseline of this machine has 2 nights yet, so how far its nights move is "
                   "assumed, and a verdict needs a large change; to judge a change tonight, run the base and the "
                   "candidate in one session (--specdec-base-draft METHOD=MODEL or --specdec-base-python PATH, "
                   "docs/gate.md#ab-in-one-session), or measure this host's noise: the same command with "
                   "--specdec-calibrate, a few times (docs/gate.md#calibration)")
    return out


def gate_lines(rows: Sequence[tuple[str, Judgement, CaseResult | None]], machine: MachineFactor | None, *,
               multiplicity: str, alpha: float, fail_inconclusive: bool,
               nights: Mapping[str, NightVariance] | None = None,
               calibration: Mapping[str, Any] | None = None) -> list[str]:
    """The terminal's last lines: per test, each gated verdict and what the baseline can catch, and the
    absolute figures once the machine factor is divided out (shown family); then the inconclusive count."""
    from pytest_specdec.gate.registry import ABSOLUTE, LATENCY_VERDICTS, label

    rows = [(n, c, r) for n, c, r in rows if c.final]
    if not rows:
        return []
    m = sum(1 for _, c, _ in rows for v in c.final or [] if v.family == GATED and v.p is not None)
    out = [f"specdec gate: per test, the gated verdicts and the smallest change each would catch "
           f"(power 0.9, {multiplicity.upper()} over {m} gated tests at alpha {alpha:g}):"]
    counts: dict[Decision, int] = {}
    open_tests: list[str] = []
    unspent = 0
    for nodeid, c, result in rows:
        name = nodeid.split("::")[-1]
        gated = [v for v in c.final or [] if v.family == GATED]
        for v in gated:
            counts[v.verdict] = counts.get(v.verdict, 0) + 1
        if c.plan.status == NOT_COMPARABLE:  # one line: no verdict was possible, and why
            fields = ", ".join(f"{k} {a!r} → {b!r}" for k, (a, b) in c.plan.differs.items())
            out.append(f"  {name}: not comparable with its baseline ({fields})")
            continue
        parts = [f"{label(v.metric)} {v.verdict} ({guard_text(v)})" for v in gated]
        if result is not None and result.untrusted_runs:  # a latency left with no trusted run
            judged = {v.metric for v in gated}
            parts += [f"{label(g)} not judged (coalesced streams: no run's latency trusted)"
                      for g in c.plan.gate if g not in judged and g in LATENCY_VERDICTS]  # a coalesced stream: unjudged
        out.append(f"  {name}: " + "; ".join(parts))
        # a test with goodput SLOs shows its goodput here where it is not gated (`gate=["goodput"]` gates it)
        out += [f"    shown: {verdict_phrase(label(v.metric), v)}" for v in c.final or []
                if v.metric == GOODPUT and v.family != GATED]
        absolute = [v for v in c.final or [] if v.metric in ABSOLUTE and v.family != GATED]
        if absolute and machine is not None:
            out.append(f"    after the machine factor ({machine.factor:.3f}): "
                       + "; ".join(verdict_phrase(label(v.metric), v) for v in absolute))
        n_open = sum(1 for v in gated if v.verdict == INCONCLUSIVE)
        if n_open:
            open_tests.append(f"{name} ({n_open})")
        unspent += c.unspent
    total = ", ".join(f"{counts[k]} {k}" for k in COUNT_ORDER if counts.get(k))
    out.append(f"specdec gate: {len(rows)} test(s), gated verdicts {total or 'none'}; "
               f"{unspent} run(s) per arm not spent (no look could change a verdict)")
    out.append(f"specdec gate: inconclusive gated metrics per test: {', '.join(open_tests) or 'none'}"
               + (" (they fail with --specdec-fail-inconclusive)" if open_tests and not fail_inconclusive else ""))
    return out + night_lines(nights or {}, calibration, len(open_tests))


def coalesced_lines(nodeid: str, result: CaseResult, indent: str = "specdec: ") -> list[str]:
    """One line per run whose stream was coalesced: its latency figures are left out, and why."""
    return [f"{indent}{nodeid}: {r.arm} run {r.index + 1}: latency left out: {'; '.join(r.untrusted)}"
            for r in result.untrusted_runs]


def coalesced_summary(results: Sequence[tuple[str, CaseResult | None]]) -> list[str]:
    """Session end: every run whose stream was coalesced, under one heading (their throughput was kept)."""
    untrusted = [(n, r) for n, r in results if r is not None and r.untrusted_runs]
    if not untrusted:
        return []
    runs = sum(len(r.untrusted_runs) for _, r in untrusted)
    return [f"specdec: {runs} run(s) of {len(untrusted)} test(s) had a coalesced stream; their latency figures "
            "are left out of the verdicts (throughput kept):",
            *(line for n, r in untrusted for line in coalesced_lines(n, r, indent="  "))]


def test_end_message(nodeid: str, c: Judgement, end: TestEnd, *, alpha: float, multiplicity: str
                     ) -> tuple[str | None, str | None]:
    """A test's end in words: (failure message, warning message), either None."""
    if end.outcome == "pass":
        return None, None
    if end.outcome == "error":
        return f"specdec: {c.plan.error}", None
    if end.outcome == "missing":
        return f"specdec: no baseline for this test at {end.where}\ncreate it with: {end.command}", None
    if end.outcome == NOT_COMPARABLE:
        fields = "\n".join(f"  {k}: {a!r} → {b!r}" for k, (a, b) in c.plan.differs.items())
        msg = (f"baseline {end.where} was measured under different conditions (not-comparable):\n{fields}\n"
               f"to replace it with tonight's measurement: --update-baselines")
        return ("specdec: " + msg, None) if end.fails else (None, f"{nodeid}: {msg}")
    if end.outcome == REGRESSED:
        return regression_message(c, c.verdicts, alpha=alpha, multiplicity=multiplicity, where=end.where,
                                  accept=end.command), None
    what = "; ".join(f"{v.metric} {guard_text(v)}" for v in end.open)
    runs = c.looks[-1] if c.looks else "?"
    msg = f"{len(end.open)} gated metric(s) inconclusive after {runs} run(s) per arm: {what}"
    if end.fails:
        level = 100 * (1 - 2 * alpha / max(1, c.max_looks))
        return f"specdec: {msg} (--specdec-fail-inconclusive)\n\n{table(c.verdicts, f'{level:.4g}% CI')}", None
    return None, f"{nodeid}: {msg}; the test passes (--specdec-fail-inconclusive fails it)"


def session_error_line(what: str, why: str) -> str:
    """A session-end step that raised (`SpecDecSession.errors`): what it was judging and why; the session fails."""
    return f"specdec: ERROR in {what}: {why} — the session fails; every other result was judged and written"


def session_end_lines(end: Any, checks: Mapping[str, Judgement], results: Sequence[tuple[str, CaseResult | None]],
                      *, alpha: float, multiplicity: str, strict: bool = False) -> list[str]:
    """The gate's lines at the session's end (`gate.protocol.SessionEnd`), in order: a machine without baselines of
    its own (once), the late regressions' heading, the machine factor, the late regressions, the coalesced runs,
    then what the baseline store wrote."""
    from pytest_specdec.output.hardware_wording import machine_state_lines, no_own_baselines_lines
    from pytest_specdec.output.schema import MachineStateEntry, hardware_entry, state_summary_entry

    lines: list[str] = []
    if end.no_own_baselines is not None:
        hardware, unjudged = end.no_own_baselines
        lines += no_own_baselines_lines(hardware_entry(hardware), len(unjudged), failed=strict,
                                        recorded=None if end.baselines is None else len(end.baselines.created),
                                        acceptance=[checks[n].plan.machines for n in unjudged if n in checks])
    if end.state is not None:
        lines += machine_state_lines(MachineStateEntry.from_dict(state_summary_entry(end.state), "the machine state"))
    if end.late_regressions:
        lines.append(f"specdec: {len(end.late_regressions)} test(s) passed at their end but regressed once every "
                     "p-value of the session was known (Benjamini-Hochberg/Holm need all of them):")
    if end.machine is not None:
        lines.append("specdec: " + machine_sentence(end.machine))
        if end.machine_failed:
            lines.append("specdec: the session fails on the machine factor (--specdec-fail-machine)")
    for nodeid, late in end.late_regressions:
        c = checks[nodeid]
        if late.outcome == REGRESSED and not c.failed:
            lines.append(regression_message(c, c.final or [], alpha=alpha, multiplicity=multiplicity,
                                            where=late.where, accept=late.command).replace(
                "specdec:", f"specdec: {nodeid}: after the whole session's family was known,", 1))
        if late.drifted and c.drift is not None:
            from pytest_specdec.output.drift import drift_failure

            lines.append(str(drift_failure(nodeid, c.drift, late.drifted)).replace(
                f"specdec: {nodeid}:", f"specdec: {nodeid}: after the whole session's family was known,", 1))
    return [*lines, *coalesced_summary(results), *end.written]
