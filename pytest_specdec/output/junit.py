"""A test's figures as JUnit properties (`--junitxml`), so the test views of Jenkins, Buildkite and GitLab show
speedup, acceptance, latency and the gated verdicts beside pass/fail, not only the HTML report does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_specdec.gate.kinds import GATED

if TYPE_CHECKING:
    from pytest_specdec.gate.machine import MachineFactor
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.output.results import TestRecord

PREFIX = "specdec_"


def test_properties(record: TestRecord) -> list[tuple[str, str]]:
    """Figures of one test: the summary's, the runs per arm, the baseline used (and the other machines whose nights
    judged its acceptance), each gated verdict with its change and CI (worded as the terminal's table), and its
    drift verdicts."""
    from pytest_specdec.output.ab_wording import ab_sides
    from pytest_specdec.output.wording import format_value

    out: list[tuple[str, str]] = []
    result = record.result
    if result is not None:
        s = result.summary
        for name in ("speedup", "acceptance_rate", "output_tok_s", "reference_tok_s"):
            if s.get(name) is not None:
                out.append((PREFIX + name, format_value(name, s[name])))
        for name in ("tpot_p95_ms", "ttft_p95_ms", "e2e_p95_ms"):  # the summary keeps them as tpot_ms["p95"], ...
            p95 = (s.get(name.replace("_p95", "")) or {}).get("p95")
            if p95 is not None:
                out.append((PREFIX + name, f"{p95:.4g}"))
        for arm in ("reference", "spec", "base", "base_reference"):
            if runs := result.arm_runs(arm):
                out.append((f"{PREFIX}runs_{arm}", f"{sum(r.valid for r in runs)} valid of {len(runs)}"))
    check = record.baseline
    if check is not None:
        out.append((PREFIX + "baseline", f"{check.plan.status}: {check.plan.path}"))
        out += [(f"{PREFIX}verdict_{v.metric}", verdict_text(v)) for v in check.shown() if v.family == GATED]
        if check.plan.machines:  # its acceptance judged against other machines' nights, its speed against none
            out.append((PREFIX + "baseline_machines", ", ".join(check.plan.machines)))
        if check.deviation is not None:
            import math

            out.append((PREFIX + "reference_vs_baseline", f"{100 * (math.exp(check.deviation) - 1):+.1f} %"))
    if record.drift is not None:  # early against late runs on one server (`gate.drift`), worded as the terminal's
        from pytest_specdec.output.drift import verdict_text as drift_text

        out += [(f"{PREFIX}drift_{v.metric}", drift_text(v, record.drift.alpha)) for v in record.drift.verdicts]
    ab = record.ab
    if ab is not None:  # an A/B session: the candidate against the base, and what a regression points at
        out.append((PREFIX + "ab", ab_sides(ab)))
        out += [(f"{PREFIX}ab_verdict_{v.metric}", verdict_text(v)) for v in ab.shown()]
        if ab.cause() is not None:
            out.append((PREFIX + "ab_attribution", str(ab.cause())))
    return out


def verdict_text(v: Verdict) -> str:
    """A verdict with its change and CI, worded once (`wording.format_verdict`)."""
    from pytest_specdec.output.wording import format_verdict

    return format_verdict(v)


def session_properties(machine: MachineFactor | None, tests: int) -> list[tuple[str, str]]:
    """The session's figures, for the test suite's properties."""
    from pytest_specdec.output.wording import machine_sentence

    out = [(PREFIX + "tests", str(tests))]
    if machine is not None:
        out.append((PREFIX + "machine_factor", f"{machine.factor:.3f} ({machine_sentence(machine)})"))
    return out
