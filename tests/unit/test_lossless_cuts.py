"""The evidence a failed lossless check keeps: each differing prompt once, both outputs cut around the
first difference so a long or runaway generation cannot bloat the results, and no more than a fixed
number of prompts."""

from __future__ import annotations

from factories import measured_run, run_metrics

from pytest_specdec.measure.outputs import differing_outputs, evidence_line, excerpt, first_difference
from pytest_specdec.measure.runner import CaseResult, RunRecord
from pytest_specdec.measure.schedule import Arm


def rec(arm: Arm, index: int, texts: dict[str, str]) -> RunRecord:
    return measured_run(arm, index, 1.0, metrics=run_metrics(1.0, n_requests=len(texts)), texts=texts)


def test_first_difference_and_excerpt() -> None:
    assert first_difference("abc", "abd") == 2 and first_difference("ab", "abc") == 2 and first_difference("", "x") == 0
    assert excerpt("short", 2) == "short"
    text = "a" * 1000 + "B" + "c" * 1000
    cut = excerpt(text, 1000, chars=90)
    assert cut.startswith("…") and cut.endswith("…") and "B" in cut and len(cut) == 92
    assert excerpt("x" * 500, 3, chars=90) == "x" * 90 + "…"


def test_each_differing_prompt_once_cut_and_capped() -> None:
    same = {f"p{i:02d}": "same answer" for i in range(30)}
    refs = [rec("reference", i, same) for i in range(2)]
    long = "word " * 400
    spec = [rec("spec", 0, {**same, "p01": long + "SPEC", "p02": "other"}),
            rec("spec", 1, {**{k: "diff" for k in same}, "p01": long + "SPEC"})]
    n, shown = differing_outputs(CaseResult(reference_runs=refs, runs=spec, summary=None, speedup_per_pair=[]),
                                 prompts=5, chars=60)
    assert n == 30 and len(shown) == 5
    first = {d["prompt_id"]: d for d in shown}
    assert first["p01"]["run"] == 0 and first["p02"]["run"] == 0 and first["p00"]["run"] == 1
    assert first["p01"]["first_difference"] == 0 and first["p01"]["spec_chars"] == len(long) + 4
    assert len(first["p01"]["spec"]) <= 61 and first["p01"]["reference"] == "same answer"


def test_a_failure_line_shows_where_the_outputs_differ_however_late() -> None:
    """The message cuts the stored excerpts again: around the difference, never just their first characters
    (which would print the same prefix twice when the outputs part after character 80)."""
    spec, ref = "same words " * 30 + "SPEC tail", "same words " * 30 + "REFERENCE tail"
    at = first_difference(spec, ref)
    d = {"prompt_id": "p7", "run": 0, "first_difference": at, "spec": excerpt(spec, at), "reference": excerpt(ref, at)}
    line = evidence_line(d)
    assert line.startswith(f"p7 (run 1, from character {at}): spec '…")
    assert "SPEC tail" in line and "REFERENCE tail" in line
    early = {"prompt_id": "p1", "run": 2, "first_difference": 3, "spec": "abcX", "reference": "abcY"}
    assert evidence_line(early) == "p1 (run 3, from character 3): spec 'abcX' vs reference 'abcY'"
