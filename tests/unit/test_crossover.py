"""The crossover concurrency (gate/crossover.py): interpolation on log concurrency, the sides of "not
crossed", the bootstrap CI and the verdict against a stored night."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate import crossover as X

GRID = (2, 4, 8, 16, 32)


def night(cstar: float, n: int = 4, sd: float = 0.02, seed: int = 0) -> list[tuple[float, list[float]]]:
    """Log speedup 0.5 · ln(c* / c) at each point of GRID, with per-pair noise ``sd``: 1.0 at ``cstar``."""
    rng = np.random.default_rng(seed)
    return [(c, list(np.exp(0.5 * math.log(cstar / c) + rng.normal(0.0, sd, n)))) for c in GRID]


def test_crossing_is_interpolated_on_log_concurrency() -> None:
    # 1.2 at c=8, 0.6 at c=32: log speedup crosses 0 at t = ln 1.2 / ln 2, log2 c = 3 + 2t.
    y = np.log([1.2, 0.6])
    x = float(X.crossing(y, np.log([8.0, 32.0])))
    assert math.exp(x) == pytest.approx(2 ** (3 + 2 * math.log(1.2) / math.log(2.0)))
    # the first fall below 1.0 counts, not a later one; censored at the ends
    assert math.exp(float(X.crossing(np.log([1.5, 0.8, 1.1, 0.5]), np.log([1.0, 2, 4, 8])))) < 2
    assert float(X.crossing(np.log([0.9, 0.5]), np.log([2.0, 4.0]))) == pytest.approx(math.log(2))
    assert float(X.crossing(np.log([1.9, 1.5]), np.log([2.0, 4.0]))) == pytest.approx(math.log(4))


def test_estimate_and_the_sides_of_not_crossed() -> None:
    est = X.estimate(night(16))
    assert est is not None and est.side == "crossed" and est.value == pytest.approx(16, rel=0.1)
    assert est.ci is not None and est.ci[0] < est.value < est.ci[1] and est.level == 90.0
    above, below = X.estimate(night(100)), X.estimate(night(1))
    assert above is not None and above.side == "above" and above.value is None
    assert above.text().startswith("c > 32 (speedup above 1.0 at every swept concurrency)")
    assert below is not None and below.side == "below" and below.text().startswith("c < 2 (speedup below 1.0")
    assert X.estimate(night(16)[:1]) is None  # one point: nothing to interpolate
    # a point with one valid pair is left out (a bootstrap needs two)
    est = X.estimate([(c, v if c != 4 else v[:1]) for c, v in night(16)])
    assert est is not None and [c for c, _ in est.pairs] == [2, 8, 16, 32]


def test_verdicts_on_a_move_by_four_none_and_out_of_range() -> None:
    base = night(16, seed=1)
    moved = X.compare(base, night(4, seed=2))
    assert moved.verdict == "regressed" and moved.delta == pytest.approx(-75, abs=5) and moved.ci_high < -100 / 3
    assert moved.metric == "crossover" and moved.family == "shown" and moved.p is not None and moved.p < 0.05
    assert X.compare(base, night(16, seed=3)).verdict == "unchanged"
    assert X.compare(base, night(64, seed=3), family="gated").verdict == "improved"
    gone = X.compare(base, night(1, seed=2))  # below 1.0 everywhere: at most c_min, a move of at least ÷8
    assert gone.verdict == "regressed" and gone.delta == pytest.approx(100 * (2 / 16 - 1), abs=8)
    assert X.compare(night(100), night(200)).verdict == "unchanged"  # above everywhere on both nights
    assert X.compare(base, night(16)[1:]).verdict == "not-comparable"
    few = X.compare(base[:1], night(16)[:1])
    assert few.verdict == "inconclusive" and "too little data" in few.note


def test_noisy_nights_stay_inconclusive_rather_than_unchanged() -> None:
    """Two pairs a point at a large per-pair sd: the CI is wide, no claim of no change."""
    v = X.compare(night(16, n=2, sd=0.4, seed=5), night(16, n=2, sd=0.4, seed=6))
    assert v.verdict == "inconclusive"


def test_bad_values_name_where() -> None:
    with pytest.raises(ConfigError, match=r"^tonight's crossover: speedup at concurrency 4 must be a positive"):
        X.compare(night(16), [(4, [1.0, -1.0]), (8, [1.0, 1.0])])
    with pytest.raises(ConfigError, match=r"^rec: points\[0\]\.speedups must be a list"):
        X.points_of({"points": [{"concurrency": 4, "speedups": 3}]}, "rec")
    with pytest.raises(ConfigError, match="factor must be a number above 1"):
        X.compare(night(16), night(16), factor=1.0)


def test_the_report_shows_each_sweep_lines_crossover_on_its_own_line() -> None:
    """From the recorded sessions (tests/data/report_results.json: an ngram and a draft_model concurrency sweep
    whose speedup crosses 1.0): each line's crossover judged against a copy of itself a quarter lower in
    concurrency, through the gate's `judge_sweep` and the results' entries as the session writes them, then the
    report's block."""
    import json

    from pytest_specdec.app.compare import sweep_point
    from pytest_specdec.gate.crossover_gate import SweepNight, group, judge_sweep
    from pytest_specdec.output.report import render_html
    from pytest_specdec.output.results import crossover_entry
    from pytest_specdec.output.schema import load

    data = json.loads((Path(__file__).resolve().parents[1] / "data" / "report_results.json").read_text())
    found, broken = group(sweep_point(t) for t in load(data).tests)
    assert broken == [] and [(x.sweep, x.line) for x in found] == [
        ("test_nightly.py::test_concurrency[draft_model-k3-t0.0]", "draft_model k=3"),
        ("test_nightly.py::test_concurrency[ngram-k3-t0.0]", "ngram k=3")]
    entries = []
    for x in found:
        stored = SweepNight("2026-11-10T03:00:00Z", x.grid(), "stored text")
        out = judge_sweep(x, stored, alpha=0.05, tolerance=None, gated=False)
        assert out.crossover is not None and out.crossover.side == "crossed" and not out.failed
        entries.append(crossover_entry(out))
    html = render_html({**data, "crossovers": entries})
    block = html.split('<h2 id="crossovers">Crossover concurrency</h2>', 1)[1].split("</table>", 1)[0]
    assert block.count("<tr title=") == 2 and block.count('class="badge b-unchanged shown">unchanged') == 2
    assert f"<td>{found[1].sweep}</td><td>ngram k=3</td><td>{entries[1]['crossover']['text']}</td>" in block
    assert '<h2 id="crossovers">' not in render_html(data)  # a session without the section shows no block


def test_the_sweep_record_keeps_its_last_nights_beside_the_tests_files(tmp_path: Path) -> None:
    from pytest_specdec.gate.baselines import BaselineError, baseline_path, load_sweep, sweep_path
    from pytest_specdec.gate.store import write_sweep

    sweep = "suites/test_concurrency.py::test_concurrency[eagle3-k3-t0.0]"
    path = sweep_path(tmp_path, "cpu", "amd-epyc-2cpu", sweep)
    assert path.parent == baseline_path(tmp_path, "cpu", "amd-epyc-2cpu", sweep.replace("t0.0]", "t0.0-c4]")).parent
    assert path.name == "test_concurrency[eagle3-k3-t0.0].crossover"
    assert load_sweep(path) is None
    record = {"sweep": sweep, "profile": "cpu", "tests": []}
    nights = [{"started": f"2026-01-0{i}T00:00:00Z", "points": [{"concurrency": 4, "speedups": [1.5, 1.4]}]}
              for i in (1, 2, 3)]
    assert write_sweep(tmp_path, path, record, nights[0], keep=2, missing_only=False).startswith("created")
    assert write_sweep(tmp_path, path, record, nights[1], keep=2, missing_only=True).startswith("unchanged")
    write_sweep(tmp_path, path, record, nights[1], keep=2, missing_only=False)
    assert write_sweep(tmp_path, path, record, nights[2], keep=2, missing_only=False) == "updated: 2 night(s) kept"
    data = load_sweep(path)
    assert data is not None and [n["started"][:10] for n in data["nights"]] == ["2026-01-02", "2026-01-03"]
    path.write_text('{"schema": 1, "nights": 3}')
    with pytest.raises(BaselineError, match=r"^crossover record .*\.crossover: 'nights' is missing or not a list"):
        load_sweep(path)


def test_crossover_can_be_moved_into_the_gate() -> None:
    from pytest_specdec.gate.thresholds import check_gate

    assert check_gate(["output_tok_s", "crossover"], "ini specdec_gate") == ["output_tok_s", "crossover"]
    with pytest.raises(ConfigError, match="unknown metric 'crossovers'"):
        check_gate(["crossovers"], "ini specdec_gate")


def test_one_tests_report_entry_that_cannot_be_made_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report of the recorded sessions with one test's view and the temperature sweep's charts broken on purpose:
    the report renders, its errors section names both, and every other test and chart is there."""
    import json

    from pytest_specdec.output import report
    from pytest_specdec.output.report import render_html

    data = json.loads((Path(__file__).resolve().parents[1] / "data" / "report_results.json").read_text())
    first, *rest = [t["nodeid"] for t in data["tests"]]
    view = report.test_view

    def broken(t: Any, servers: Any) -> Any:
        if t.nodeid == first:
            raise RuntimeError("broken on purpose")
        return view(t, servers)

    from pytest_specdec.output import sweeps

    charts = sweeps.sweep_chart_groups

    def no_temperature(sweep: Any, servers: Any) -> Any:
        if sweep.axis == "temperature":
            raise RuntimeError("no chart")
        return charts(sweep, servers)

    monkeypatch.setattr(report, "test_view", broken)
    monkeypatch.setattr(sweeps, "sweep_chart_groups", no_temperature)
    html = render_html(data)
    errors = html.split('<h2 id="errors">', 1)[1].split("</table>", 1)[0]
    assert f"<td class=\"l\">{first}</td>" in errors and "(RuntimeError: broken on purpose)" in errors
    assert "temperature sweep (" in errors and "RuntimeError: no chart" in errors and "speedup vs concurrency" in html
    assert rest and html.count('<details class="test ') == len(rest)  # every other test's entry
