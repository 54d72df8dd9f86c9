"""A verdict's words typed and written once: `Verdict` refuses a word outside its vocabulary and a method that
carries its comparison unit; a results file's verdict reads the same whether it was written with `per` or with
the older combined `method` ("exact/pair"); an unknown decision in a file names the file and the field; and a
verdict and its JSON read back are worded alike by the terminal's, JUnit's, the report's and compare's
formatters."""

from __future__ import annotations

from typing import Any

import pytest
from factories import verdict

from pytest_specdec.formats import RESULTS_SCHEMA as SCHEMA
from pytest_specdec.gate.kinds import PAIR, RUN, SESSION, split_method
from pytest_specdec.gate.stats import DEFAULT_THRESHOLDS, Verdict, compare
from pytest_specdec.output.report import verdict_rows
from pytest_specdec.output.results import verdict_entry
from pytest_specdec.output.schema import ResultsError, VerdictEntry, load
from pytest_specdec.output.wording import format_ci, format_p, format_verdict, table


def test_a_verdict_refuses_words_outside_its_vocabulary_and_a_unit_inside_its_method() -> None:
    with pytest.raises(ValueError, match=r"Verdict\('speedup'\): verdict 'regresed' is not one of"):
        verdict(verdict="regresed")
    with pytest.raises(ValueError, match="family 'gate' is not one of gated, shown"):
        verdict(family="gate")
    with pytest.raises(ValueError, match="unit 'pt' is not one of %, points"):
        verdict(unit="pt")
    with pytest.raises(ValueError, match="method 'exact/pair' names its comparison unit; pass it as per="):
        verdict(method="exact/pair")
    assert verdict(method="exact", per=PAIR).exact and not verdict().exact


def test_the_combined_method_of_older_files_is_split_on_read() -> None:
    assert split_method("exact/pair") == ("exact", PAIR)
    assert split_method("moderated-session-t-log/session") == ("moderated-session-t-log", SESSION)
    assert split_method("machine state") == ("machine state", RUN) and split_method("none") == ("none", RUN)
    with pytest.raises(ValueError, match="comparison unit 'week' is not one of run, pair, session, night"):
        split_method("welch/week")
    v = compare("output_tok_s", [[100.0, 100.0, 100.0]], [90.0, 90.0, 90.0], thresholds=DEFAULT_THRESHOLDS)
    new = verdict_entry(v)
    assert (new["method"], new["per"]) == ("exact", RUN) and "unit" not in new
    old = {k: x for k, x in new.items() if k != "per"} | {"method": "exact/run", "unit": "run"}
    assert VerdictEntry.from_dict("output_tok_s", old) == VerdictEntry.from_dict("output_tok_s", new)
    assert VerdictEntry.from_dict("output_tok_s", new).exact


def results(verdicts: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "tests": [{"nodeid": "t.py::test_a", "outcome": "passed", "verdicts": verdicts}],
            **more}


def test_an_unknown_decision_in_a_results_file_names_the_file_and_the_field() -> None:
    good = verdict_entry(verdict())
    load(results({"speedup": good}), "reports/night.json")
    with pytest.raises(ResultsError, match=r"^reports/night\.json: tests\[0\]\.verdicts\.speedup\.verdict: "
                                           r"verdict 'regresed' is not one of improved, unchanged, regressed"):
        load(results({"speedup": {**good, "verdict": "regresed"}}), "reports/night.json")
    with pytest.raises(ResultsError, match=r"^reports/night\.json: tests\[0\]\.verdicts\.speedup\.family: "):
        load(results({"speedup": {**good, "family": "gate"}}), "reports/night.json")
    with pytest.raises(ResultsError, match=r"^r\.json: crossovers\[0\]\.verdict\.verdict: verdict 'worse'"):
        load(results({}, crossovers=[{"sweep": "s", "verdict": {**good, "verdict": "worse"}}]), "r.json")


@pytest.mark.parametrize("v", [
    verdict(),
    verdict(method="exact", per=PAIR, p=None, delta=0.2, ci_low=-0.1, ci_high=0.4, verdict="unchanged"),
    verdict(delta=None, ci_low=None, ci_high=None, p=None, verdict="inconclusive", method="none"),
    verdict(unit="points", delta=-3.456, ci_low=-4.0, ci_high=-2.9, threshold=-2.0, metric="acceptance_rate"),
], ids=["welch", "exact", "no-data", "points"])
def test_a_verdict_and_its_json_read_back_are_worded_alike(v: Verdict) -> None:
    back = VerdictEntry.from_dict(v.metric, verdict_entry(v))
    assert (format_verdict(back), format_ci(back), format_p(back)) == (format_verdict(v), format_ci(v), format_p(v))
    row = verdict_rows([back])[0]
    assert (row["ci"], row["p"]) == (format_ci(v), format_p(v)) and format_ci(v) in table([v])


def test_the_exact_rule_says_range_and_the_others_ci() -> None:
    exact = verdict(method="exact", p=None, delta=0.2, ci_low=-0.1, ci_high=0.4, verdict="unchanged")
    assert format_verdict(exact) == "unchanged +0.2 % (range -0.1 % .. +0.4 %)"
    assert (format_ci(exact), format_p(exact)) == ("-0.1 % .. +0.4 % (range)", "exact")
    assert format_verdict(verdict()) == "regressed -25.0 % (CI -30.0 % .. -20.0 %)"
    assert (format_ci(verdict()), format_p(verdict())) == ("-30.0 % .. -20.0 %", "0.001")
    assert format_verdict(verdict(unit="points", delta=-3.456, ci_low=-4.0, ci_high=-2.9)) == (
        "regressed -3.46 pt (CI -4.00 pt .. -2.90 pt)")


def test_the_gate_points_a_regression_at_a_cause_and_the_wording_words_each() -> None:
    """What a test's verdicts point at is the gate's decision (`gate.attribution.attribute`, the first that holds);
    `wording.attribution` words every cause it can return."""
    from typing import get_args

    from pytest_specdec.gate.attribution import SPLIT_CAUSES, Cause, attribute
    from pytest_specdec.measure.explain import Split
    from pytest_specdec.output.wording import READINGS, SPLIT_READINGS, attribution

    def bad(*metrics: str) -> list[Verdict]:
        return [verdict(metric=m) for m in metrics]

    slower_step = Split(2.0, 1.6, 4.0, 4.0, 1.0, 1.25)
    assert attribute(bad("speedup"), slower_step) == "step time"
    assert attribute(bad("speedup"), Split(2.0, 1.6, 4.0, 3.2, 1.0, 1.0)) == "acceptance"
    assert attribute(bad("speedup"), Split(2.0, 1.6, 4.0, 3.6, 1.0, 1.11)) == "acceptance and step time"
    assert attribute(bad("speedup", "acceptance_rate")) == "draft"
    assert attribute(bad("speedup")) == "speculation cost"
    assert attribute(bad("reference_tok_s", "acceptance_rate")) == "non-speculative path"
    assert attribute(bad("per_position_acceptance[1]", "output_tok_s")) == "acceptance alone"
    assert attribute(bad("output_tok_s", "e2e_p95_ms")) == "spec throughput"
    assert attribute(bad("e2e_p95_ms")) == "latency"
    assert attribute([verdict(verdict="unchanged")], slower_step) is None
    assert set(SPLIT_READINGS) == SPLIT_CAUSES and set(READINGS) | SPLIT_CAUSES == set(get_args(Cause))
    held = attribution([verdict(verdict="unchanged")], slower_step)
    assert held.startswith("speedup unchanged") and held.endswith("mostly step time"), held  # the split beside it
    assert attribution(bad("speedup"), slower_step).endswith("mostly step time: " + SPLIT_READINGS["step time"])
