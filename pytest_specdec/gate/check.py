"""One test's comparison with its stored baseline, and what the session says about it.

The session (pytest wiring) decides when to compare; this module holds the record of a comparison, the
family-wide p-value adjustment over every test's verdicts, and the messages the terminal prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.gate.machine import MachineFactor
    from pytest_specdec.measure.runner import CaseResult

FDR_NAMES = {"bh": "Benjamini-Hochberg", "holm": "Holm"}


@dataclass
class BaselineCheck:
    """One test's comparison with its stored baseline."""

    path: Path
    status: str  # compared | missing | not-comparable | error
    check: bool
    comparability: dict[str, Any]
    under_test: dict[str, Any]
    entry: dict[str, Any]  # tonight as the baseline file would store it
    night: Night | None = None  # tonight's runs, typed: what the verdicts judge
    baseline: dict[str, Any] | None = None
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # not-comparable: what differs
    raw: list[Verdict] = field(default_factory=list)  # before the session's multiplicity adjustment
    verdicts: list[Verdict] = field(default_factory=list)  # adjusted at the test's end (p-values unseen = 1)
    final: list[Verdict] | None = None  # adjusted over the whole session's family
    looks: list[int] = field(default_factory=list)  # runs per arm at each look taken
    max_looks: int = 1
    failed: bool = False
    error: str | None = None
    alpha: float = 0.05  # one-sided, split over the looks: the CIs of Δ are two-sided 1 - 2·alpha/max_looks
    gate: tuple[str, ...] = ()  # the gated family's metrics for this test
    unspent: int = 0  # runs per arm planned but not spent: no further look could change a gated verdict
    stop_reason: str = ""
    deviation: float | None = None  # log(tonight's reference speed ÷ the baseline's): one term of the machine factor
    thresholds: Any = None  # the Thresholds its verdicts used (re-used when the machine factor is final)

    def shown(self) -> list[Verdict]:
        return self.final if self.final is not None else (self.verdicts or self.raw)

    def under_test_diff(self) -> dict[str, list[Any]]:
        """What changed under test since the baseline's last session (the report shows it per test)."""
        if not self.baseline:
            return {}
        from pytest_specdec.gate.baselines import under_test_changes

        return {k: [a, b] for k, (a, b) in
                under_test_changes(self.baseline.get("under_test", {}), self.under_test).items()}

    def to_dict(self) -> dict[str, Any]:
        from pytest_specdec.gate.thresholds import to_dict as thresholds_dict
        from pytest_specdec.gate.verdicts import attribution, gated_with

        shown = self.shown()
        path = str(self.path)
        sessions = len(self.baseline["sessions"]) if self.baseline else 0
        return {
            "path": path, "status": self.status, "checked": self.check, "sessions": sessions,
            "not_comparable_fields": {k: [a, b] for k, (a, b) in self.fields.items()},
            "looks": self.looks, "max_looks": self.max_looks, "unspent_runs": self.unspent,
            "stop_reason": self.stop_reason, "gate": list(self.gate),
            "inconclusive_gated": [v.metric for v in gated_with(shown, "inconclusive")],
            "machine_deviation": self.deviation,
            "alpha": self.alpha, "ci_level": 1 - 2 * self.alpha / max(1, self.max_looks),
            "adjusted": "session" if self.final is not None else "test-end",
            "attribution": attribution(shown) if shown else None,
            "under_test": self.under_test,
            "under_test_diff": self.under_test_diff(),
            "comparability": self.comparability,
            "thresholds": None if self.thresholds is None else thresholds_dict(self.thresholds),
            **({"error": self.error} if self.error else {}),
        }


def adjusted(checks: Sequence[tuple[str, BaselineCheck]], nodeid: str, *, final: bool, fdr: str, alpha: float,
             gated_size: int, family_size: int) -> list[Verdict]:
    """This test's verdicts after BH/Holm over every raw verdict so far (`adjusted_all`)."""
    return adjusted_all(checks, final=final, fdr=fdr, alpha=alpha, gated_size=gated_size,
                        family_size=family_size).get(nodeid, [])


def adjusted_all(checks: Sequence[tuple[str, BaselineCheck]], *, final: bool, fdr: str, alpha: float,
                 gated_size: int, family_size: int) -> dict[str, list[Verdict]]:
    """Every test's verdicts after BH/Holm over every raw verdict so far, each family (gated, shown) on its
    own; padded with p=1 to the family size collected, unless ``final``."""
    from pytest_specdec.gate.scale import kind_of
    from pytest_specdec.gate.sequential import adjust, detectable

    order = [(n, c) for n, c in checks if c.raw]
    flat = [v for _, c in order for v in c.raw]
    looks_of = [c.max_looks for _, c in order for _ in c.raw]
    out = list(flat)
    sizes = {"gated": gated_size, "shown": family_size - gated_size}
    for family in ("gated", "shown"):
        idx = [i for i, v in enumerate(flat) if v.family == family]
        part = [flat[i] for i in idx]
        with_p = sum(1 for v in part if v.p is not None and v.verdict != "not-comparable")
        size = None if final else max(sizes[family], with_p)
        for i, v in zip(idx, adjust(part, fdr, alpha, family_size=size)):
            out[i] = v
        # What a lone regression must clear: BH/Holm over m tests is alpha/m for the smallest p.
        m = max(1, size or with_p)
        for i in idx:
            v, c_looks = out[i], looks_of[i]
            if v.var_fixed is not None and v.var_run is not None and v.threshold is not None and v.n_now:
                mde = detectable(kind_of(v.metric), v.threshold, v.var_fixed + v.var_run / v.n_now,
                                 v.df or 1.0, alpha / (c_looks * m))
                out[i] = dataclasses.replace(v, mde=mde)
    by_test: dict[str, list[Verdict]] = {}
    start = 0
    for n, c in order:
        by_test.setdefault(n, out[start:start + len(c.raw)])
        start += len(c.raw)
    return by_test


def machine_log(checks: Iterable[BaselineCheck | None]) -> float | None:
    """The machine factor (log) from every test compared so far (the session's, once all are in)."""
    devs = [c.deviation for c in checks if c is not None and c.deviation is not None]
    return sum(devs) / len(devs) if devs else None


def regression_message(c: BaselineCheck, verdicts: list[Verdict], *, alpha: float, fdr: str, where: str,
                       accept: str) -> str:
    """A failing test's message: what regressed, the table, the attribution, what changed under test and
    the command that accepts the change. ``where`` names the baseline file, ``accept`` the command."""
    from pytest_specdec.gate.verdicts import attribution, gated_with, table, under_test_diff

    bad = gated_with(verdicts, "regressed")
    assert c.baseline is not None
    sessions = c.baseline["sessions"]
    unit = "session means" if len(sessions) > 1 else "runs"
    level = 100 * (1 - 2 * alpha / max(1, c.max_looks))
    last = sessions[-1] if sessions else {}
    lines = [
        f"specdec: {len(bad)} metric(s) regressed: {', '.join(v.metric for v in bad)}",
        f"baseline: {where} ({len(sessions)} session(s); unit of comparison: {unit}; "
        f"{c.looks[-1] if c.looks else '?'} run(s) per arm now, look {len(c.looks)} of {c.max_looks})",
        f"p: one-sided, x{c.max_looks} for the looks, adjusted by {FDR_NAMES[fdr]} over the session's metric tests "
        f"(the family depends on which tests were selected)",
        "",
        table(verdicts, f"{level:.4g}% CI"),
        "",
        f"attribution: {attribution(verdicts)}",
        f"under test, baseline ({last.get('started', '?')}) → now:",
        *under_test_diff(c.baseline.get("under_test", {}), c.under_test),
        "why:",
        *[f"  {v.metric}: {v.note}" for v in bad],
        "",
        f"to accept this change: --update-baselines   ({accept})",
    ]
    return "\n".join(lines)


def gate_lines(rows: Sequence[tuple[str, BaselineCheck, CaseResult | None]], machine: MachineFactor | None, *,
               fdr: str, alpha: float, fail_inconclusive: bool) -> list[str]:
    """The terminal's last lines: per test, each gated verdict and what the baseline can catch, and the
    absolute figures once the machine factor is divided out (shown family); then the inconclusive count."""
    from pytest_specdec.gate.registry import ABSOLUTE, LATENCY_VERDICTS, label
    from pytest_specdec.gate.verdicts import guard_text, verdict_phrase

    rows = [(n, c, r) for n, c, r in rows if c.final]
    if not rows:
        return []
    m = sum(1 for _, c, _ in rows for v in c.final or [] if v.family == "gated" and v.p is not None)
    out = [f"specdec gate: per test, the gated verdicts and the smallest change each would catch "
           f"(power 0.9, {fdr.upper()} over {m} gated tests at alpha {alpha:g}):"]
    counts: dict[str, int] = {}
    open_tests: list[str] = []
    unspent = 0
    for nodeid, c, result in rows:
        name = nodeid.split("::")[-1]
        gated = [v for v in c.final or [] if v.family == "gated"]
        for v in gated:
            counts[v.verdict] = counts.get(v.verdict, 0) + 1
        if c.status == "not-comparable":  # one line: no verdict was possible, and why
            fields = ", ".join(f"{k} {a!r} → {b!r}" for k, (a, b) in c.fields.items())
            out.append(f"  {name}: not comparable with its baseline ({fields})")
            continue
        parts = [f"{label(v.metric)} {v.verdict} ({guard_text(v)})" for v in gated]
        if result is not None and result.untrusted_runs:  # a latency left with no trusted run
            judged = {v.metric for v in gated}
            parts += [f"{label(g)} not judged (coalesced streams: no run's latency trusted)"
                      for g in c.gate if g not in judged and g in LATENCY_VERDICTS]  # a coalesced stream leaves latencies unjudged
        out.append(f"  {name}: " + "; ".join(parts))
        absolute = [v for v in c.final or [] if v.metric in ABSOLUTE and v.family != "gated"]
        if absolute and machine is not None:
            out.append(f"    after the machine factor ({machine.factor:.3f}): "
                       + "; ".join(verdict_phrase(label(v.metric), v) for v in absolute))
        n_open = sum(1 for v in gated if v.verdict == "inconclusive")
        if n_open:
            open_tests.append(f"{name} ({n_open})")
        unspent += c.unspent
    total = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("unchanged", "regressed", "improved", "inconclusive",
                                                         "not-comparable") if counts.get(k))
    out.append(f"specdec gate: {len(rows)} test(s), gated verdicts {total or 'none'}; "
               f"{unspent} run(s) per arm not spent (no look could change a verdict)")
    out.append(f"specdec gate: inconclusive gated metrics per test: {', '.join(open_tests) or 'none'}"
               + (" (they fail with --specdec-fail-inconclusive)" if open_tests and not fail_inconclusive else ""))
    return out


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
