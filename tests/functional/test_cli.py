"""`pytest-specdec` (the console script) on results files that real plugin sessions wrote against simulated vLLM
servers (endpoint mode): compare exits 0 between two unchanged nights and 1 when the spec path got slower, with
the terminal's table, and reproduces the plugin's own verdicts of that night against the first night's baseline;
history over six such nights (the spec path slower from night 4) finds the step there; report re-renders the
session's HTML; bad input exits 2 naming the file and the field.

The CLI runs in the test's process (tests/command.py); one test runs the installed console script, as CI calls it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from command import specdec_cli as cli
from session import specdec_session

from fakes import DISTURBED_RULE_ON, FakeServer
from pytest_specdec.formats import RESULTS_SCHEMA

Servers = tuple[FakeServer, FakeServer]
SUITE = {"concurrency": 4, "num_prompts": 8, "max_tokens": 24, "body": "assert specdec.result.reference_runs"}
NODEID = "test_suite.py::test_ngram[ngram-k3-t0.0-c4]"
GOOD = {"step_s": 0.001, "acceptance": (0.8, 0.6, 0.4)}
BAD = {"step_s": 0.006, "acceptance": (0.5, 0.3, 0.1)}  # ~6x slower steps, acceptance 0.6 -> 0.3
# The sessions' and the comparison's thresholds: the fake server's timing shares 2 busy cores with everything
# else (tests/functional/test_baselines_e2e.py says why these are wide); the injected change is far beyond.
THRESHOLDS = ("rate=40", "latency=150", "acceptance=15")
SCRIPT = Path(sys.executable).with_name("pytest-specdec")
DATA = Path(__file__).resolve().parent.parent / "data" / "report_results.json"


def test_the_installed_console_script_runs(tmp_path: Path) -> None:
    """The console script (`pip install -e .` puts it beside the interpreter) runs `cli.main` with its arguments and
    exits with its status; the other tests call `cli.main` in this process (tests/command.py)."""
    assert SCRIPT.exists(), f"{SCRIPT} is missing: run `pip install --no-deps -e .`"
    r = subprocess.run([str(SCRIPT), "report", str(DATA), "-o", str(tmp_path / "r.html")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>"), r.stderr
    r = subprocess.run([str(SCRIPT), "history", str(tmp_path / "none")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no such file or directory" in r.stderr


@pytest.fixture
def fake_profile(make_profile: Callable[..., Path]) -> Path:
    """The simulated profile with the disturbed-run rule on: these steps are long enough to measure."""
    return make_profile(validity=DISTURBED_RULE_ON)


@pytest.fixture
def servers(fake_server: Callable[..., FakeServer]) -> Servers:
    return fake_server(k=3, output_tokens=24, **GOOD), fake_server(k=0, step_s=0.002, output_tokens=24)


def night(pytester: pytest.Pytester, profile: Path, servers: Servers, name: str, *extra: str) -> Path:
    """One plugin session; its results file copied to `<name>.json`."""
    return specdec_session(pytester, profile, servers, *extra, runs=3, thresholds=THRESHOLDS).keep(
        pytester.path / f"{name}.json")


def test_compare_and_report_on_real_sessions(
    pytester: pytest.Pytester, fake_profile: Path, servers: Servers, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    first = night(pytester, fake_profile, servers, "first", "--update-baselines")
    html_first = (pytester.path / "reports" / "latest.html").read_text()
    second = night(pytester, fake_profile, servers, "second")
    third = night(pytester, fake_profile, servers, "third")
    servers[0].reconfigure(**BAD)
    slower = night(pytester, fake_profile, servers, "slower")
    later = [night(pytester, fake_profile, servers, f"slower-{i}") for i in (2, 3)]
    th = [a for t in THRESHOLDS for a in ("--threshold", t)]

    # NEW recorded how its session judged (thresholds, alpha, BH): compare judges with them, no profile needed.
    r = cli("compare", first, second)
    assert r.returncode == 0, r.stdout + r.stderr
    # A file without them falls back on its profile, here "fake", no built-in: the thresholds' source must be named.
    bare = pytester.path / "bare.json"
    data = json.loads(second.read_text())
    del data["gate"]["settings"]
    bare.write_text(json.dumps(data))
    r = cli("compare", first, bare)
    assert r.returncode == 2, r.stdout
    assert "first" not in r.stderr and f"{bare}: `profile`: profile 'fake' not found" in r.stderr
    assert "pass --profile NAME or PATH" in r.stderr

    # Two unchanged nights: exit 0, the gated table per test.
    r = cli("compare", first, second, "--profile", fake_profile, *th)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith(f"{NODEID}: ") for line in lines), r.stdout
    header = next(line for line in lines if "metric" in line and "verdict" in line)
    assert header.split() == ["metric", "family", "baseline", "now", "Δ", "90%", "CI", "p", "verdict"]
    assert sum(1 for line in lines if line.split()[:2] in (["speedup", "gated"], ["acceptance", "gated"])) == 2
    assert not any("regressed" in line.split()[-1:] for line in lines if " gated " in line), r.stdout
    assert "specdec compare: 0 test(s) regressed" in r.stdout
    # the machine factor names the two files, not "this machine" and "the baseline nights"
    assert any(line.startswith(f"specdec compare: {second} ran ") and f" than {first} (reference tok/s" in line
               for line in lines), r.stdout

    # The spec path 6x slower: exit 1, speedup regressed in the table, the test named in the summary.
    r = cli("compare", first, slower, "--profile", fake_profile, *th)
    assert r.returncode == 1, r.stdout + r.stderr
    speedup = next(line for line in r.stdout.splitlines() if line.split()[:2] == ["speedup", "gated"])
    assert speedup.split()[-1] == "regressed" and "-" in speedup.split()[4]
    assert f"{NODEID}: regressed" in r.stdout
    assert f"1 test(s) regressed from {first} to {slower}: {NODEID}" in r.stdout

    # The same verdicts the plugin gave that night against the first night's baseline (one session, the
    # same prior and machine factor, BH over the same family): compare applies the plugin's functions.
    r = cli("compare", first, slower, "--profile", fake_profile, *th, "--json", "--all")
    assert r.returncode == 1
    ours = json.loads(r.stdout)["tests"][0]["verdicts"]
    plugin = json.loads(slower.read_text())["tests"][0]["verdicts"]
    assert set(ours) == set(plugin)
    for metric, v in plugin.items():
        assert ours[metric]["verdict"] == v["verdict"], metric
        for key in ("delta", "p"):
            if v[key] is not None:  # the baseline file rounds to 6 digits; the results keep every digit
                assert ours[metric][key] == pytest.approx(v[key], rel=1e-3, abs=1e-6), (metric, key)
        if v["ci"]:
            assert ours[metric]["ci"] == pytest.approx(v["ci"], rel=1e-3, abs=1e-6), metric

    # report: the session's HTML again from its JSON, the same page the session wrote.
    out = pytester.path / "again.html"
    r = cli("report", first, "-o", out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == html_first
    r = cli("report", first)
    assert r.returncode == 0 and first.with_suffix(".html").read_text() == html_first

    # history over the six real nights, given in reverse: ordered by session start, the step found at night 4.
    r = cli("history", *reversed([first, second, third, slower, *later]), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [n["file"] for n in doc["nights"]] == [str(p) for p in (first, second, third, slower, *later)]
    for metric in ("speedup", "acceptance_rate"):
        assert [c["night"] for c in doc["tests"][NODEID][metric]["change_points"]] == [4], (metric, doc)
    assert doc["tests"][NODEID]["speedup"]["change_points"][0]["change"] < -50

    # Tests in one file only are listed, never dropped; they decide nothing.
    data = json.loads(second.read_text())
    data["tests"][0]["nodeid"] = "test_suite.py::test_renamed"
    renamed = pytester.path / "renamed.json"
    renamed.write_text(json.dumps(data))
    r = cli("compare", first, renamed, "--profile", fake_profile, *th)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"test_suite.py::test_renamed: only in {renamed}" in r.stdout
    assert f"{NODEID}: only in {first}" in r.stdout

    # Another case under the same id (e.g. other sampling) is not comparable: listed with the field, exit 0
    # (a warning, as in the plugin), 1 with --strict.
    data = json.loads(second.read_text())
    data["tests"][0]["sampling"]["temperature"] = 0.7
    other = pytester.path / "other.json"
    other.write_text(json.dumps(data))
    r = cli("compare", first, other, "--profile", fake_profile, *th)
    assert r.returncode == 0 and f"{NODEID}: not-comparable" in r.stdout
    assert "  sampling.temperature: 0.0 → 0.7" in r.stdout
    assert cli("compare", first, other, "--profile", fake_profile, *th, "--strict").returncode == 1

    # The target as baselines compare it: a hub name by id and revision, a local model by its content hash, so
    # the same model in another checkout (another absolute path) is the same target and other weights are not.
    assert json.loads(second.read_text())["environment"]["target_identity"] == {"id": "fake-model", "revision": None}
    # and what tells two installs of one vLLM apart, here the client's (the endpoints' packages are theirs): this
    # environment's packages and torch (the cpu: no CUDA, no driver)
    from pytest_specdec.vllm.install import provenance, this_install

    prov = json.loads(second.read_text())["environment"]["client_provenance"]
    assert prov == provenance(this_install(), None) and prov["packages"] > 10 and prov["cuda"] is None, prov
    html = (pytester.path / "reports" / "latest.html").read_text()
    assert (f"<b>client's packages</b> {prov['packages']} (digest {prov['packages_digest']}) · torch {prov['torch']}<"
            in html)

    def with_target(path: Path, name: str, model: str, identity: dict | None) -> Path:
        data = json.loads(path.read_text())
        data["environment"]["target_model"] = model
        data["environment"].pop("target_identity")
        if identity is not None:
            data["environment"]["target_identity"] = identity
        out = pytester.path / name
        out.write_text(json.dumps(data))
        return out

    local = {"id": "target", "sha256": "a" * 64}
    here = with_target(first, "here.json", "/checkout-a/zoo/models/target", local)
    there = with_target(second, "there.json", "/checkout-b/zoo/models/target", local)
    r = cli("compare", here, there, "--profile", fake_profile, *th)
    assert r.returncode == 0 and f"{NODEID}: not-comparable" not in r.stdout, r.stdout
    other_weights = with_target(second, "weights.json", "/checkout-b/zoo/models/target", {**local, "sha256": "b" * 64})
    r = cli("compare", here, other_weights, "--profile", fake_profile, *th)
    assert f"{NODEID}: not-comparable" in r.stdout and "  target_model.sha256: " in r.stdout, r.stdout
    # Files written before the identity was recorded: the path's last part compares, not the checkout.
    old_here = with_target(first, "old-here.json", "/checkout-a/zoo/models/target", None)
    old_there = with_target(second, "old-there.json", "/checkout-b/zoo/models/target", None)
    for a, b in ((old_here, old_there), (old_here, there)):
        r = cli("compare", a, b, "--profile", fake_profile, *th)
        assert r.returncode == 0 and f"{NODEID}: not-comparable" not in r.stdout, (a, b, r.stdout)


def _results(tmp_path: Path, name: str, edit: Callable[[dict], object] | None = None) -> Path:
    """The recorded report results, edited."""
    data = json.loads(DATA.read_text())
    if edit is not None:
        edit(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["tests"][0]["runs"][1].pop("valid"), "{f}: tests[0].runs[1] has no `valid`"),
    (lambda d: d["tests"][0]["reference_runs"][0].update(output_tok_s="fast"),
     "{f}: tests[0].reference_runs[0].output_tok_s is 'fast', not int or float or NoneType"),
    (lambda d: d.update(schema=9),
     f"{{f}}: `schema` is 9; this plugin reads the results format of schema {RESULTS_SCHEMA}"),
    (lambda d: d["tests"][2].pop("outcome"), "{f}: not a pytest-specdec results file as this plugin writes them "
                                             "(tests[2] has no `outcome`)"),
    (lambda d: d.update(machine_state=[1]), "{f}: machine_state is list, not an object"),
    (lambda d: d.update(machine_state={"tonight": None}), "{f}: machine_state has no `stored`"),
], ids=["run-without-valid", "run-value-not-a-number", "unknown-schema", "test-without-outcome",
        "machine-state-not-an-object", "machine-state-without-stored"])
def test_compare_bad_input_names_the_file_and_field(tmp_path: Path, edit: Callable[[dict], object],
                                                    message: str) -> None:
    good = _results(tmp_path, "good.json")
    bad = _results(tmp_path, "bad.json", edit)
    r = cli("compare", good, bad, "--profile", "h100")
    assert r.returncode == 2, r.stdout
    assert r.stderr.startswith("pytest-specdec compare: error: " + message.format(f=bad)), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr  # one line, no traceback
    assert r.stdout == ""


def test_bad_files_and_options_exit_2(tmp_path: Path) -> None:
    good = _results(tmp_path, "good.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": 2, "tests": [')
    r = cli("compare", good, broken, "--profile", "h100")
    assert r.returncode == 2 and f"{broken}: not valid JSON (line 1" in r.stderr
    r = cli("compare", tmp_path / "nope.json", good)
    assert r.returncode == 2 and f"{tmp_path / 'nope.json'}: no such file" in r.stderr
    r = cli("compare", good, good, "--profile", "h100", "--alpha", "2")
    assert r.returncode == 2 and "--alpha" in r.stderr and "(0, 0.5)" in r.stderr
    r = cli("compare", good, good, "--profile", "h100", "--threshold", "speed=3")
    assert r.returncode == 2 and "unknown metric 'speed'" in r.stderr
    r = cli("report", broken)
    assert r.returncode == 2 and f"{broken}: not valid JSON" in r.stderr
    r = cli("history", tmp_path / "none")
    assert r.returncode == 2 and "no such file or directory" in r.stderr
    for args in ((), ("compare",), ("history",), ("report",)):
        assert cli(*args, "--help").returncode == 0
    assert cli().returncode == 2


def test_a_file_compared_with_itself_changes_nothing(tmp_path: Path) -> None:
    """The recorded session against itself: no gated verdict regressed or improved, the machine factor
    exactly 1, and the test whose servers did not start listed with both outcomes: it fails the comparison,
    as it failed the session."""
    path = _results(tmp_path, "night.json")
    r = cli("compare", path, path, "--profile", "h100", "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["machine_factor"]["factor"] == pytest.approx(1.0)
    verdicts = [v["verdict"] for t in out["tests"] for v in t["verdicts"].values() if v["family"] == "gated"]
    assert verdicts and not {"regressed", "improved"} & set(verdicts)
    [empty] = [t for t in out["tests"] if t["status"] == "no runs"]
    assert empty["nodeid"].endswith("test_eagle3[eagle3-k3-t0.0-c1]") and "OLD: failed; NEW: failed" in empty["reason"]
    assert out["regressed"] == [] and out["failed"] == [empty["nodeid"]]


DEAD = "test_nightly.py::test_eagle3[eagle3-k3-t0.0-c1]"  # the recorded session's test whose servers did not start
SLOWED = "test_nightly.py::test_concurrency[draft_model-k3-t0.0-c1]"


def _without_dead(d: dict) -> None:
    d["tests"] = [t for t in d["tests"] if t["nodeid"] != DEAD]


def _slowed(d: dict, checked: bool) -> None:
    """The recorded session without its dead test, SLOWED's spec arm at 0.3 of its speed, opted out or not."""
    _without_dead(d)
    [test] = [t for t in d["tests"] if t["nodeid"] == SLOWED]
    for run in test["runs"]:
        run["output_tok_s"] *= 0.3
    test["speedup_per_pair"] = [s * 0.3 for s in test["speedup_per_pair"]]
    test["baseline"]["checked"] = checked


def test_an_opted_out_regression_is_shown_and_does_not_fail(tmp_path: Path) -> None:
    """A test with `check=False` is judged and shown but never failed in the plugin; compare likewise."""
    old = _results(tmp_path, "old.json", _without_dead)
    checked = _results(tmp_path, "checked.json", lambda d: _slowed(d, True))
    r = cli("compare", old, checked, "--profile", "h100")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"1 test(s) regressed from {old} to {checked}: {SLOWED}" in r.stdout

    opted = _results(tmp_path, "opted.json", lambda d: _slowed(d, False))
    r = cli("compare", old, opted, "--profile", "h100")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{SLOWED}: regressed (check=False: shown, not failed)" in r.stdout
    speedup = next(line for line in r.stdout.splitlines() if line.split()[:2] == ["speedup", "gated"])
    assert speedup.split()[-1] == "regressed", r.stdout
    assert f"0 test(s) regressed from {old} to {opted}" in r.stdout
    assert f"1 test(s) regressed but opted out (check=False), shown and not failed: {SLOWED}" in r.stdout
    r = cli("compare", old, opted, "--profile", "h100", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["regressed"] == [SLOWED] and out["failed"] == []
    [test] = [t for t in out["tests"] if t["nodeid"] == SLOWED]
    assert test["checked"] is False and test["regressed"] is True and test["failed"] is False


def _dead(nodeid: str, arm: str = "spec", checked: bool = True, outcome: str = "failed") -> Callable[[dict], None]:
    """The recorded session without its dead test, ``nodeid``'s ``arm`` dead as the plugin records it: every
    run of that arm invalid, no speedup, the test ``outcome`` (failed at its set-up)."""
    def edit(d: dict) -> None:
        _without_dead(d)
        [test] = [t for t in d["tests"] if t["nodeid"] == nodeid]
        for run in test["runs" if arm == "spec" else "reference_runs"]:
            run["valid"], run["invalid_reasons"] = False, ["the server exited (code 1)"]
        test["speedup_per_pair"] = [None] * len(test["speedup_per_pair"])
        test["outcome"], test["when"], test["baseline"]["checked"] = outcome, "setup", checked
    return edit


@pytest.mark.parametrize(("arm", "checked", "outcome"), [
    ("spec", True, "failed"), ("spec", False, "failed"),
    ("reference", True, "passed"),  # a file whose plugin let a dead reference arm pass: it fails now
], ids=["spec-checked", "spec-opted-out", "reference"])
def test_a_dead_arm_in_new_is_listed_and_fails(tmp_path: Path, arm: str, checked: bool, outcome: str) -> None:
    """The plugin fails a test without a valid run on an arm whatever its `check` (an arm is never judged on
    the other arm's figures); compare lists it with both outcomes, judges it as the plugin does and exits 1. The same
    dead arm in OLD only is listed and fails nothing: NEW has nothing to answer for."""
    victim = "test_nightly.py::test_concurrency[draft_model-k3-t0.0-c2]"
    old = _results(tmp_path, "old.json", _without_dead)
    dead = _results(tmp_path, "dead.json", _dead(victim, arm, checked, outcome))
    r = cli("compare", old, dead, "--profile", "h100")
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"{victim}: no runs: no valid run on the {arm} arm in {dead} ({old}: passed; {dead}: {outcome}); it "
            f"fails, as the plugin fails a test without a valid {arm} run") in r.stdout, r.stdout
    assert f"{victim}: no verdicts" not in r.stdout
    assert f"1 test(s) without a valid run in {dead}, failed as the plugin fails them: {victim}" in r.stdout
    # Judged as the plugin judges it, in the family: its gated figures are inconclusive, and a dead spec arm's
    # reference runs still join the machine factor (a dead reference arm has no reference speed to give).
    assert f"{victim}: no runs: " in r.stdout and f"{victim}: inconclusive" not in r.stdout
    n = 18 if arm == "spec" else 17
    assert f"(reference tok/s, factor 1.000, 90% CI +0.0 % to +0.0 %, {n} test(s))" in r.stdout
    out = json.loads(cli("compare", old, dead, "--profile", "h100", "--json").stdout)
    assert out["failed"] == [victim] and out["regressed"] == []

    r = cli("compare", dead, old, "--profile", "h100")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{victim}: no runs: no valid run on the {arm} arm in {dead} ({dead}: {outcome}; {old}: passed)" in r.stdout


def test_compare_and_history_on_the_stored_cpu_nights(tmp_path: Path) -> None:
    """Real CPU measurements: the nights kept in baselines/cpu written back as results files
    (scripts/baseline_nights.py), with test_methods[eagle3]'s spec arm at 0.4 of its speed from night 3. One results
    file against another is one night against one, judged with the cpu profile's night prior: a drop must be
    large to be called (0.6x reads -44 % but `inconclusive` after BH; docs/cli.md)."""
    root = Path(__file__).resolve().parent.parent.parent
    victim = "suites/test_methods.py::test_methods[eagle3-k3-t0.0-c1]"
    made = subprocess.run([sys.executable, "-m", "scripts.baseline_nights", str(root / "baselines" / "cpu"),
                           str(tmp_path), "--slow", victim.split("::")[1], "--factor", "0.4", "--from", "3"],
                          capture_output=True, text=True, timeout=120, cwd=root)  # a tool runs from the root
    assert made.returncode == 0, made.stderr
    files = sorted(tmp_path.glob("night-*.json"))
    assert len(files) >= 3, f"baselines/cpu keeps {len(files)} nights; this needs 3"
    r = cli("compare", files[1], files[2], "--json")  # the profile the files recorded: cpu, its thresholds
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert victim in out["regressed"]
    [test] = [t for t in out["tests"] if t["nodeid"] == victim]
    assert test["verdicts"]["speedup"]["verdict"] == "regressed" and test["verdicts"]["speedup"]["delta"] < -25
    assert test["verdicts"]["acceptance_rate"]["verdict"] == "unchanged"  # the injected change is speed only
    r = cli("history", tmp_path, "--per-series", "--json")
    assert r.returncode == 0, r.stderr
    series = json.loads(r.stdout)["tests"][victim]["speedup"]
    # A change point needs nights on both sides of it (tests/unit/test_history.py): with 3 stored nights the drop at
    # the last one is compare's to catch, above; history may name it once more nights follow, never one before it.
    assert all(c["night"] == 3 for c in series["change_points"]), series["change_points"]
