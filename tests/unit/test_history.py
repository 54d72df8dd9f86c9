"""`pytest-specdec history`: change points across nights (gate/trend.py) and the history built from results files
(app/history.py; output/history.py renders the CLI's table, JSON and HTML).

The nights are simulated from a recorded session (tests/data/report_results.json, recorded by real plugin
sessions against the simulated vLLM): each night scales the runs' throughput by a machine factor and the spec
arm's by the night's noise, with a step injected at night 4 into one test.
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from pytest_specdec.app.history import order, series
from pytest_specdec.cli import main
from pytest_specdec.formats import RESULTS_SCHEMA
from pytest_specdec.gate.trend import noise_sd, trend
from pytest_specdec.output.history import NightFile, render_html, table_lines, to_json
from pytest_specdec.output.schema import drift_entry, load

DATA = Path(__file__).resolve().parent.parent / "data" / "report_results.json"
STEPPED = "test_nightly.py::test_k[ngram-k3-t0.0-c2]"


# ---- change points on one series ------------------------------------------------------------------


def test_a_step_at_night_4_of_6_is_found() -> None:
    levels = [1.80, 1.74, 1.83, 1.21, 1.25, 1.18]  # ~3 % noise, a drop of a third at night 4
    tr = trend("speedup", levels)
    [c] = tr.change_points
    assert c.index == 3 and c.unit == "%"
    assert c.before == pytest.approx(math.exp(np.mean(np.log(levels[:3]))))
    assert c.change == pytest.approx(100 * (c.after / c.before - 1))


def test_a_flat_noisy_series_has_no_change_point() -> None:
    rng = np.random.default_rng(7)
    assert trend("speedup", np.exp(rng.normal(0, math.log1p(0.2), 12))).change_points == ()


@pytest.mark.slow
def test_false_alarms_on_flat_series_stay_near_the_level() -> None:
    """200 flat series of 6 to 30 nights with 10-30 % noise: a change point in at most 10 % of them (the
    confirming t-test is at 5 %; docs/validation.md has the figure per length)."""
    rng = np.random.default_rng(0)
    alarms = sum(bool(trend("speedup", np.exp(rng.normal(0, math.log1p(rng.uniform(0.1, 0.3)),
                                                         int(rng.integers(6, 31))))).change_points)
                 for _ in range(200))
    assert alarms <= 20, alarms


def test_exact_series_and_short_ones() -> None:
    # acceptance at temperature 0 repeats exactly: flat is flat, and a change of a few points is a change
    assert trend("acceptance_rate", [0.6] * 8).change_points == ()
    [c] = trend("acceptance_rate", [0.6] * 4 + [0.55] * 4).change_points
    assert c.index == 4 and c.unit == "pt" and c.change == pytest.approx(-5.0)
    short = trend("speedup", [1.5, 1.0, 1.0])
    assert short.change_points == () and "3 night(s): a change point needs 2 on each side" in short.note
    assert noise_sd([1.0]) == 0.0
    with pytest.raises(Exception, match="a rate level must be a finite number > 0"):
        trend("speedup", [1.0, 0.0, 1.0, 1.0])


# ---- nights from results files --------------------------------------------------------------------


def nights(tmp_path: Path, n: int = 6, step_at: int = 3, drop: float = 0.6, seed: int = 3) -> list[Path]:
    """`n` results files, one per night (file names in reverse order of the nights), the night
    noise 3 % on the spec arm and 10 % on the machine; from night ``step_at`` (0-based) STEPPED's spec arm
    runs at ``drop`` of its speed."""
    base = json.loads(DATA.read_text())
    rng = random.Random(seed)
    paths = []
    for k in range(n):
        d = copy.deepcopy(base)
        d["started"] = f"2026-11-{10 + k:02d}T03:00:00+00:00"
        for t in d["tests"]:
            machine = math.exp(rng.gauss(0, 0.10))
            spec = machine * math.exp(rng.gauss(0, 0.03)) * (drop if k >= step_at and t["nodeid"] == STEPPED else 1)
            for r in t.get("runs") or []:
                r["output_tok_s"] *= spec
            for r in t.get("reference_runs") or []:
                r["output_tok_s"] *= machine
            t["speedup_per_pair"] = [None if s is None else s * spec / machine for s in t.get("speedup_per_pair") or []]
        path = tmp_path / f"night-{n - k}.json"
        path.write_text(json.dumps(d))
        paths.append(path)
    return paths


def read(paths: list[Path]) -> list[NightFile]:
    return [NightFile(p, load(json.loads(p.read_text()), str(p))) for p in paths]


def test_history_finds_the_injected_step_and_nothing_else(tmp_path: Path) -> None:
    ordered, dupes = order(read(sorted(nights(tmp_path))))  # by name: night-1.json is the last night
    assert [n.started[:10] for n in ordered] == [f"2026-11-{d}" for d in range(10, 16)] and dupes == []
    rows = series(ordered)
    found = {(s.nodeid, s.metric): s.change_nights for s in rows if s.change_nights}
    assert found == {(STEPPED, "speedup"): [3]}
    stepped = next(s for s in rows if s.nodeid == STEPPED and s.metric == "speedup")
    [c] = stepped.trend.change_points
    assert c.change == pytest.approx(-40, abs=5)
    assert {s.metric for s in rows} == {"speedup", "acceptance_rate", "e2e_p95_ratio", "crossover"}
    # each line of the concurrency sweep has its crossover night by night (the recorded speedup crosses 1.0)
    crossing = {s.nodeid: s for s in rows if s.metric == "crossover"}
    assert set(crossing) == {"test_nightly.py::test_concurrency[ngram-k3-t0.0]",
                             "test_nightly.py::test_concurrency[draft_model-k3-t0.0]"}
    assert all(p.value is not None and 1 < p.value < 64 for s in crossing.values() for p in s.points)
    # the test without runs is a gap that says why, every night
    empty = next(s for s in rows if "test_eagle3" in s.nodeid and s.metric == "speedup")
    assert all(p.value is None and p.gap == "no valid run with this metric (test failed)" for p in empty.points)


def test_nights_of_two_machines_are_two_series_never_a_change_point(tmp_path: Path) -> None:
    """Four nights on one machine, then four on another whose speedups are 40 % lower by the hardware alone:
    one series per machine and test, the other machine's nights gaps that name it, and no change point."""
    paths = nights(tmp_path, n=8, step_at=4)  # from night 4 (0-based) STEPPED is slower: the other machine
    for k, path in enumerate(paths):
        data = json.loads(path.read_text())
        data["environment"]["hardware"] = "CPU A" if k < 4 else "CPU B"
        path.write_text(json.dumps(data))
    ordered, _ = order(read(paths))
    rows = series(ordered)
    assert [s.change_nights for s in rows if s.change_nights] == []
    a, b = (next(s for s in rows if s.nodeid == STEPPED and s.metric == "speedup" and s.hardware == hw)
            for hw in ("CPU A", "CPU B"))
    assert a.name == f"{STEPPED} on CPU A" and [p.value is not None for p in a.points] == [True] * 4 + [False] * 4
    assert b.points[0].gap == "measured on other hardware (CPU A)" and all(p.value for p in b.points[4:])
    out = to_json(ordered, rows)
    assert [n["hardware"] for n in out["nights"]] == ["CPU A"] * 4 + ["CPU B"] * 4
    assert {f"{STEPPED} on CPU A", f"{STEPPED} on CPU B"} <= set(out["tests"])
    assert "CPU B" in "\n".join(table_lines(ordered, rows))
    # one machine's nights alone are one series per test, named by its id
    assert all(s.hardware == "" and s.name == s.nodeid for s in series(ordered[:4]))


def test_duplicates_and_missing_tests_are_listed(tmp_path: Path) -> None:
    paths = nights(tmp_path)
    latest = tmp_path / "latest.json"
    latest.write_text(paths[-1].read_text())
    data = json.loads(paths[2].read_text())
    data["tests"] = [t for t in data["tests"] if t["nodeid"] != STEPPED]
    paths[2].write_text(json.dumps(data))
    ordered, dupes = order(read([latest, *paths]))
    assert [(d.path.name, k.path.name) for d, k in dupes] == [("latest.json", paths[-1].name)]
    stepped = next(s for s in series(ordered) if s.nodeid == STEPPED and s.metric == "speedup")
    assert stepped.points[2].value is None and stepped.points[2].gap == "not in this night's results"
    assert len([p for p in stepped.points if p.value is not None]) == 5


def test_cli_history_table_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nights(tmp_path)
    html = tmp_path / "out" / "history.html"
    assert main(["history", str(tmp_path), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "nights (6, by session start):" in out
    assert f"{STEPPED}\n  speedup " in out
    assert "    change point at night 4 (2026-11-13T03:00:00+00:00): " in out
    assert out.rstrip().endswith(f"6 night(s), 21 test(s); 1 with a change point: {STEPPED}")  # 2: sweeps

    assert main(["history", *map(str, sorted(tmp_path.glob("night-*.json"))), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [n["night"] for n in doc["nights"]] == [1, 2, 3, 4, 5, 6]
    [cp] = doc["tests"][STEPPED]["speedup"]["change_points"]
    assert cp["night"] == 4 and cp["unit"] == "%" and cp["change"] < -30
    # its p is the confirming t-test's, the figure the kept change points were adjusted on
    ordered, _ = order(read(sorted(tmp_path.glob("night-*.json"))))
    stepped = next(s for s in series(ordered) if s.nodeid == STEPPED and s.metric == "speedup")
    assert cp["p"] == stepped.trend.change_points[0].p and 0 < cp["p"] < 0.05
    assert all(not m["change_points"] for t, ms in doc["tests"].items() for m in ms.values() if t != STEPPED)

    page = html.read_text()
    # one chart per test and gated metric (the test without runs has none), and per concurrency sweep line
    assert page.count("<svg") == 19 * 3 - 3 + 2
    assert "change point at night 4 (2026-11-13)" in page
    assert "&lt;script&gt;alert(" in page and "<script>" not in page  # a test id is text
    # the test with a change point comes first
    assert page.index(STEPPED) < page.index("test_concurrency[draft_model-k3-t0.0-c1]")


def test_cli_history_bad_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nights(tmp_path)
    (tmp_path / "night-2.json").write_text(json.dumps({"schema": RESULTS_SCHEMA, "tests": [{"nodeid": "x"}]}))
    assert main(["history", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (f"{tmp_path / 'night-2.json'}: not a pytest-specdec results file" in err
            and "tests[0] has no `outcome`" in err)


def test_cli_history_of_a_reports_folder_skips_its_other_json(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A session's reports/ holds its --specdec-save-outputs side file and may hold a --specdec-benchmark-json
    file: a folder's history skips and counts them, while either named on the command line is an error."""
    from pytest_specdec.output.benchmark import benchmark_json

    paths = nights(tmp_path)
    outputs = tmp_path / "specdec-20261115T030000Z.outputs.json"  # what the plugin writes: a schema of its own
    outputs.write_text(json.dumps({"schema": 1, "tests": [{"nodeid": STEPPED, "runs": [
        {"arm": "spec", "index": 0, "valid": True, "outputs": {"p0": "text"}, "output_tokens": {"p0": 1}}]}]}))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(benchmark_json(json.loads(paths[0].read_text()), machine_info={},
                                               commit_info={})))
    assert main(["history", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert len(doc["nights"]) == 6
    assert [s["file"] for s in doc["skipped"]] == [str(bench), str(outputs)]
    assert f"specdec history: {outputs} skipped: a --specdec-save-outputs side file" in captured.err
    assert f"specdec history: {bench} skipped: no top-level `schema`" in captured.err
    assert "specdec history: 2 JSON file(s) skipped, not results files" in captured.err

    for named in (outputs, bench):
        assert main(["history", str(paths[0]), str(named)]) == 2
        assert f"{named}: not a pytest-specdec results file: " in capsys.readouterr().err
    assert main(["compare", str(paths[0]), str(outputs)]) == 2
    assert "the session's results are the specdec-20261115T030000Z.json beside it" in capsys.readouterr().err

    only = tmp_path / "only"
    only.mkdir()
    bench.rename(only / bench.name)
    assert main(["history", str(only)]) == 2
    assert (f"{only}: a directory without results files (*.json; 1 other JSON file(s) skipped)"
            in capsys.readouterr().err)


def test_render_html_of_no_change(tmp_path: Path) -> None:
    ordered, _ = order(read(nights(tmp_path, drop=1.0)))
    page = render_html(ordered, series(ordered))
    assert "None: every gated metric" in page and "no change point (noise sd" in page


def test_many_series_hold_the_false_discovery_rate() -> None:
    """60 flat series (20 tests x 3 metrics) of 6 nights: judged one by one about 3 of them show a change
    point; over all of them (Benjamini-Hochberg) none in most histories, while a step that stands out is kept."""
    from pytest_specdec.gate.trend import trends

    rng = np.random.default_rng(3)  # 3 of its series alone show a change point (seeds 0-9: 0 to 4)
    flat = {i: ("speedup", np.exp(rng.normal(0, math.log1p(rng.uniform(0.1, 0.3)), 6))) for i in range(60)}
    alone = sum(bool(trend(m, v).change_points) for m, v in flat.values())
    together = trends(flat)
    assert alone >= 1 and not any(t.change_points for t in together.values()), alone
    stepped = {**flat, "step": ("speedup", [1.80, 1.78, 1.82, 0.9, 0.91, 0.89])}
    found = {k: [c.index for c in t.change_points] for k, t in trends(stepped).items() if t.change_points}
    assert found == {"step": [3]}


def test_history_shows_each_nights_drift_per_test(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each night's drift verdicts as its session recorded them (the results' `drift`, read as `compare` reads it),
    per test and drift metric night by night in the table and the JSON; a night without the test's drift is a gap."""
    from pytest_specdec.gate.drift import Drift, DriftVerdict

    def step(verdict: str, delta: float) -> DriftVerdict:
        return DriftVerdict("step_time_drift", verdict, "gated", "%", 10.0, 1.0, 1.0 + delta / 100, delta,
                            (delta - 3, delta + 3), 0.001, (0, 1), (2, 3), ())

    accept = DriftVerdict("acceptance_drift", "unchanged", "shown", "points", -5.0, 0.6, 0.6, 0.0, (0.0, 0.0), None,
                          (0, 1), (2, 3), (), "exact: |0| <= tolerance 1e-06")
    paths = nights(tmp_path, n=3)
    for k, path in enumerate(paths):
        data = json.loads(path.read_text())
        test = next(t for t in data["tests"] if t["nodeid"] == STEPPED)
        if k:  # night 1 from before drift: a gap
            test["drift"] = drift_entry(Drift((accept, step("unchanged", 1.0) if k == 1 else step("regressed", 57.0)),
                                              0.05))
        path.write_text(json.dumps(data))
    html = tmp_path / "out" / "history.html"
    assert main(["history", *map(str, paths), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("drift within each night's session"):]
    assert (f"{STEPPED}\n  acceptance        —  unchanged +0.00 pt  unchanged +0.00 pt\n"
            f"  step time         —  unchanged +1.00 % (gated)  regressed +57.00 % (gated)\n") in table, table
    # the page: the same table, in the text's words, a column per night
    page = html.read_text()
    drift = page[page.index("<h2>Drift within each night&#39;s session (early vs late half of one server&#39;s runs"):]
    assert ("<th>night 1</th><th>night 2</th><th>night 3</th></tr>" in drift
            and f'<td class="file" rowspan="2">{STEPPED}</td><td>acceptance</td><td>—</td><td>unchanged +0.00 pt</td>'
            "<td>unchanged +0.00 pt</td></tr>" in drift
            and "<td>step time</td><td>—</td><td>unchanged +1.00 % (gated)</td>"
            '<td class="changed">regressed +57.00 % (gated)</td></tr>' in drift), drift
    assert main(["history", *map(str, paths), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["drift"]
    assert list(doc) == [STEPPED]
    assert [None if v is None else (v["verdict"], v["delta"]) for v in doc[STEPPED]["step_time_drift"]] == [
        None, ("unchanged", 1.0), ("regressed", 57.0)]
