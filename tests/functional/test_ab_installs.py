"""An upgrade A/B (`--specdec-base-python`): the base's reference and spec arms served by another install's vLLM,
interleaved with the candidate install's two, and each install's change told apart.

The other install is a stand-in interpreter (a shell script): it answers the plugin's probe as a vLLM 0.0.9 with
this project installed, and serves `python -m pytest_specdec.vllm.cli serve ...` with the `vllm serve` stand-in
under its own config (FAKE_BASE_CONFIG). A candidate install whose every step is 30 % slower, reference and spec
alike, regresses spec tok/s with the speedup held: the non-speculative path, not speculation. The probe's
refusals are usage errors before anything starts.
"""

from __future__ import annotations

import json
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from session import latest, specdec_session

from fakes import DISTURBED_RULE_ON, LAUNCHER, FakeVllm

PROMPTS, CONCURRENCY, PAIRS = 4, 2, 6
REF_STEP_S, SPEC_STEP_S = 0.005, 0.01
BASE: dict[str, Any] = {"*": {"acceptance": [1.0, 1.0, 1.0], "step_s": SPEC_STEP_S, "output_tokens": 16},
                        "none": {"step_s": REF_STEP_S, "output_tokens": 16}}
SUITE = {"name": "test_head", "method": "eagle3", "num_prompts": PROMPTS, "concurrency": CONCURRENCY,
         "max_tokens": 16, "body": "assert specdec.result.base_runs"}
PROBE_ANSWER = {"distribution": "vllm", "vllm": "0.0.9", "torch": "2.0.0", "python": "3.11.7", "shim": True,
                "packages": [["vllm", "0.0.9"], ["torch", "2.0.0"], ["numpy", "0.0.1"], ["Only_Base", "1.0"]]}


def base_python(where: Path, answer: dict[str, Any]) -> Path:
    """A stand-in interpreter of another install: the probe's answer, else the `vllm serve` stand-in."""
    script = where / "base-python"
    script.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then echo '{json.dumps(answer)}'; exit 0; fi\n"
                      "[ \"$1 $2\" = '-m pytest_specdec.vllm.cli' ] || exit 9\nshift 2\n"
                      f"FAKE_VLLM_CONFIG=\"$FAKE_BASE_CONFIG\" exec {' '.join(LAUNCHER)} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.fixture
def project(pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
            make_profile: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    monkeypatch.setenv("FAKE_BASE_CONFIG", json.dumps(BASE))
    return make_profile("fakeab", methods=("eagle3",), validity=DISTURBED_RULE_ON)


def session(pytester: pytest.Pytester, profile: Path, *extra: str) -> pytest.RunResult:
    return specdec_session(pytester, profile, None, "--specdec-settle-timeout=0", *extra, runs=PAIRS,
                           max_runs=PAIRS).result


def test_a_slower_install_is_told_apart_from_speculation(pytester: pytest.Pytester, project: Path,
                                                          fake_vllm: FakeVllm) -> None:
    slower = {arm: {**cfg, "step_s": cfg["step_s"] * 1.3} for arm, cfg in BASE.items()}
    fake_vllm.configure(slower)  # the candidate install: every step 30 % slower, acceptance the same
    python = base_python(pytester.path, PROBE_ANSWER)
    r = session(pytester, project, f"--specdec-base-python={python}")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines([
        "specdec A/B: *test_head*: candidate vllm* (torch *) with /nonexistent/head vs base vllm 0.0.9 (torch 2.0.0) "
        "with /nonexistent/head (6 of 6 pairs, max reached)"])
    # Four arms a pair: the two references back to back, then the two spec arms, which side leads alternating.
    r.stdout.fnmatch_lines([f"specdec:   run {i}/6 {arm} *" for i, arms in
                            ((1, ("base ref", "reference", "base", "candidate")),
                             (2, ("reference", "base ref", "candidate", "base"))) for arm in arms])
    r.stdout.fnmatch_lines(["specdec A/B: 1 test(s) judged candidate vs base, 1 regressed (*); verdicts: * regressed*; "
                            "shown, never failing (the references' tok/s, the speedups): *regressed*"])
    r.stdout.fnmatch_lines(["*attribution: the non-speculative path (the candidate install's reference slowed too; "
                            "its speedup did not regress)*"])
    (test,) = latest(pytester)["tests"]
    ab = test["ab"]
    verdicts = {m: v["verdict"] for m, v in ab["verdicts"].items()}
    assert verdicts["output_tok_s"] == "regressed" and verdicts["reference_tok_s"] == "regressed", verdicts
    assert verdicts["speedup"] != "regressed" and ab["attribution"] == "non-speculative path", verdicts
    assert "reference_tok_s" not in ab["regressed"]  # shown: it explains, never fails
    assert {v["family"] for m, v in ab["verdicts"].items() if m in ("reference_tok_s", "speedup")} == {"shown"}
    assert ab["base"]["install"]["vllm"] == "0.0.9" and ab["candidate"]["install"]["python"] == sys.executable
    assert ab["changed"]["vllm"][0] == "0.0.9"
    assert ab["changed"]["torch"] == ["2.0.0", ab["candidate"]["install"]["torch"]]
    # every package whose version differs, by name, besides the versions named above (vllm, torch)
    packages = {k.split(".", 1)[1]: v for k, v in ab["changed"].items() if k.startswith("packages.")}
    assert packages["numpy"][0] == "0.0.1" and packages["only-base"] == ["1.0", None], packages
    assert "vllm" not in packages and "torch" not in packages and packages["pytest"][0] is None, packages
    assert ab["base"]["install"]["packages"] == 4 and ab["changed"]["packages_digest"][0] != \
        ab["changed"]["packages_digest"][1]
    r.stdout.fnmatch_lines(["  differs: *", "  differs: * more, in the JSON's ab.changed"])
    # the session's own servers: this environment's packages are the candidate install's
    assert latest(pytester)["environment"]["provenance"]["packages_digest"] == \
        ab["candidate"]["install"]["packages_digest"]
    arms = sorted((run["arm"], run["index"]) for run in ab["runs"])
    assert arms == sorted((a, i) for a in ("reference", "base_reference", "base", "candidate") for i in range(PAIRS))
    assert all(set(run["neighbour_cores"]) and all(c >= 0 for c in run["neighbour_cores"].values())
               for run in ab["runs"]), [run.get("neighbour_cores") for run in ab["runs"]]
    servers = {(s["method"], s["pid"]) for s in fake_vllm.records()}
    assert len(servers) == 4, servers  # each install's reference and spec server, alive together
    report = (pytester.path / "reports" / "latest.html").read_text()
    assert "vs base vllm 0.0.9 with /nonexistent/head" in report, report
    assert re.search(r"runs: reference \d valid of 6; base_reference \d valid of 6; base \d valid of 6", report)


@pytest.mark.parametrize(("answer", "message"), [
    ({**PROBE_ANSWER, "distribution": None, "vllm": None},
     "ERROR: --specdec-base-python *: that interpreter has no vLLM installed; install the base's there*"),
    ({**PROBE_ANSWER, "shim": False}, "ERROR: --specdec-base-python *: pytest-specdec is not installed there*"),
    (None, "ERROR: --specdec-base-python *: not an executable file*"),
])
def test_a_base_interpreter_that_cannot_serve_is_a_usage_error(
        pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm, answer: dict[str, Any] | None,
        message: str) -> None:
    python = base_python(pytester.path, answer) if answer is not None else pytester.path / "no-such-python"
    r = session(pytester, project, f"--specdec-base-python={python}")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([message])
    assert fake_vllm.records() == []  # nothing started
