"""A test's figures as JUnit properties (`--junitxml`), so the test views of Jenkins, Buildkite and GitLab show
speedup, acceptance, latency and the gated verdicts beside pass/fail, not only the HTML report does; and a whole
JUnit file from a results file (`junit_xml`), for `pytest-specdec merge`, whose night no one pytest session ran.
The properties come from one place for both (`figure_properties`, `baseline_properties`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specdec.gate.kinds import GATED
from pytest_specdec.output.schema import drift_entry, summary_entry
from pytest_specdec.output.wording import VerdictFields

if TYPE_CHECKING:
    from pytest_specdec.gate.machine import MachineFactor
    from pytest_specdec.output.results import TestRecord
    from pytest_specdec.output.schema import Results, TestEntry

PREFIX = "specdec_"


class Named(VerdictFields, Protocol):
    """A verdict as its property names it: a `gate.stats.Verdict` or a results file's `schema.VerdictEntry`."""

    @property
    def metric(self) -> str: ...
    @property
    def family(self) -> str: ...

#: The arms whose runs a test's properties count, in this order.
ARMS = ("reference", "spec", "base", "base_reference")


def figure_properties(summary: Mapping[str, Any], runs: Mapping[str, tuple[int, int]]) -> list[tuple[str, str]]:
    """The summary's headline figures and, per arm, its valid runs of its runs (``runs``: arm -> (valid, all))."""
    from pytest_specdec.output.wording import format_value

    out: list[tuple[str, str]] = []
    for name in ("speedup", "acceptance_rate", "output_tok_s", "reference_tok_s"):
        if summary.get(name) is not None:
            out.append((PREFIX + name, format_value(name, summary[name])))
    for name in ("tpot_p95_ms", "ttft_p95_ms", "e2e_p95_ms"):  # the summary keeps them as tpot_ms["p95"], ...
        p95 = (summary.get(name.replace("_p95", "")) or {}).get("p95")
        if p95 is not None:
            out.append((PREFIX + name, f"{p95:.4g}"))
    for arm in ARMS:
        if arm in runs and runs[arm][1]:
            out.append((f"{PREFIX}runs_{arm}", f"{runs[arm][0]} valid of {runs[arm][1]}"))
    return out


def baseline_properties(status: str, path: str, verdicts: Iterable[Named], deviation: float | None,
                        machines: Sequence[str] = ()) -> list[tuple[str, str]]:
    """How the test met its baseline (and the other ``machines`` whose nights judged its acceptance), each gated
    verdict, and its reference against the baseline's."""
    out = [(PREFIX + "baseline", f"{status}: {path}")]
    if machines:  # its acceptance judged against other machines' nights, its speed against none
        out.append((PREFIX + "baseline_machines", ", ".join(machines)))
    out += [(f"{PREFIX}verdict_{v.metric}", verdict_text(v)) for v in verdicts if v.family == GATED]
    if deviation is not None:
        import math

        out.append((PREFIX + "reference_vs_baseline", f"{100 * (math.exp(deviation) - 1):+.1f} %"))
    return out


def test_properties(record: TestRecord) -> list[tuple[str, str]]:
    """Figures of one test: the summary's, the runs per arm, the baseline used (and the other machines whose nights
    judged its acceptance), each gated verdict with its change and CI (worded as the terminal's table), and its
    drift verdicts."""
    from pytest_specdec.output.ab_wording import ab_sides

    out: list[tuple[str, str]] = []
    result = record.result
    if result is not None:
        runs = {arm: (sum(r.valid for r in rs), len(rs)) for arm in ARMS if (rs := result.arm_runs(arm))}
        out += figure_properties(summary_entry(result.summary), runs)
    check = record.baseline
    if check is not None:
        out += baseline_properties(check.plan.status, str(check.plan.path), check.shown(), check.deviation,
                                   check.plan.machines)
    if record.drift is not None:
        out += drift_properties(drift_entry(record.drift))
    ab = record.ab
    if ab is not None:  # an A/B session: the candidate against the base, and what a regression points at
        out.append((PREFIX + "ab", ab_sides(ab)))
        out += [(f"{PREFIX}ab_verdict_{v.metric}", verdict_text(v)) for v in ab.shown()]
        if ab.cause() is not None:
            out.append((PREFIX + "ab_attribution", str(ab.cause())))
    return out


def drift_properties(drift: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each drift verdict (`output.schema.drift_entry`: early against late runs on one server), worded as the
    terminal's drift lines."""
    from pytest_specdec.output.drift import verdict_text as drift_text

    return [(f"{PREFIX}drift_{metric}", drift_text(v, drift["alpha"]))
            for metric, v in (drift.get("verdicts") or {}).items()]


def verdict_text(v: VerdictFields) -> str:
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


def entry_properties(test: TestEntry) -> list[tuple[str, str]]:
    """`test_properties` of a test as a results file holds it."""
    runs: dict[str, list[bool]] = {}
    for run in (*test.reference_runs, *test.runs):
        runs.setdefault(str(run.get("arm") or "spec"), []).append(run.get("valid") is not False)
    out = figure_properties(test.summary, {arm: (sum(v), len(v)) for arm, v in runs.items()})
    if test.baseline is not None:
        out += baseline_properties(test.baseline.status, test.baseline.path, test.verdicts.values(),
                                   test.baseline.machine_deviation, test.baseline.machines)
    if test.drift is not None:
        out += drift_properties(test.drift)
    return out


def junit_xml(results: Results, suite: str = "pytest-specdec", skipped_outcomes: Iterable[str] = ()) -> str:
    """A JUnit XML file of a results file's tests, as pytest's --junitxml names them (a test module's path with
    dots as the class name, the test's name as the case's), each with its properties; a failed test's `error`
    (or its outcome, where it recorded none) is its failure, a skipped test (or one of ``skipped_outcomes``: merge's
    forgiven `insufficient-data`) is skipped. What a CI's test view reads where no one pytest session ran the tests
    (`pytest-specdec merge`)."""
    import xml.etree.ElementTree as ET

    skipping = {"skipped", *skipped_outcomes}
    cases, failures, skipped = [], 0, 0
    for test in results.tests:
        path, _, name = test.nodeid.rpartition("::")
        module, *classes = path.split("::")
        case = ET.Element("testcase", classname=".".join([module.removesuffix(".py").replace("/", "."), *classes]),
                          name=name or test.nodeid)
        props = entry_properties(test)
        if props:
            holder = ET.SubElement(case, "properties")
            for key, value in props:
                ET.SubElement(holder, "property", name=key, value=value)
        if test.outcome in skipping:
            skipped += 1
            ET.SubElement(case, "skipped", message=(test.error or "skipped")[:200])
        elif test.outcome != "passed":
            failures += 1
            first = (test.error or "").strip().splitlines()[:1]
            failure = ET.SubElement(case, "failure", message=first[0][:200] if first else test.outcome)
            failure.text = test.error or test.outcome
        cases.append(case)
    root = ET.Element("testsuites")
    top = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)), failures=str(failures), errors="0",
                        skipped=str(skipped), timestamp=results.started)
    holder = ET.SubElement(top, "properties")
    for key, value in session_properties(results.machine_factor, len(cases)):
        ET.SubElement(holder, "property", name=key, value=value)
    top.extend(cases)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
