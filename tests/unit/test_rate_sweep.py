"""A rate sweep: the marker's expansion and errors, the points' fractions of the saturation measured once per sweep,
the latency speedup per pair, and the crossover's statistic and gate on the rate axis (one gate for both axes)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import pytest
from factories import arm_run

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate import crossover as X
from pytest_specdec.gate import crossover_gate as G
from pytest_specdec.gate.baselines import crossover_value_entry
from pytest_specdec.gate.kinds import GATED, NOT_COMPARABLE, REGRESSED, UNCHANGED
from pytest_specdec.markers import expand
from pytest_specdec.measure.record import ArmRun
from pytest_specdec.measure.saturation import RatePoint, Saturation, Saturations, fractions
from pytest_specdec.output.schema import rate_point_entry
from pytest_specdec.profiles import Profile

PROFILE = Profile(name="test", path=Path("test.toml"), device="cpu", target="/m", tensor_parallel_size=1,
                  server_args=(), server_env=(), methods={"ngram": {"method": "ngram"}}, matrix={"k": [3]})
CASE = {"method": "ngram", "k": 3, "temperature": 0.0, "concurrency": 8, "rate_sweep": 4}


def test_the_marker_expands_a_sweep_into_fractions_of_the_saturation_up_to_one() -> None:
    cases = expand({"method": "ngram", "rate_sweep": 3, "concurrency": 8}, PROFILE, defaults={"request_rate": 5.0})
    assert [c.rate_fraction for c in cases] == [0.333333, 0.666667, 1.0] and {c.rate_sweep for c in cases} == {3}
    assert [c.id() for c in cases] == ["ngram-k3-t0.0-c8-sat33", "ngram-k3-t0.0-c8-sat67", "ngram-k3-t0.0-c8-sat100"]
    # the command line's default rate is not one of a sweep's: its rates are found at run time
    assert {c.request_rate for c in cases} == {None}
    assert cases[0].workload()["rate_fraction"] == 0.333333 and cases[0].workload()["rate"] is None
    assert "rate_fraction" not in expand({"method": "ngram"}, PROFILE)[0].workload()
    assert G.sweep_id("t.py::f[" + cases[1].id() + "]", G.id_part(cases[1].params())) == "t.py::f[ngram-k3-t0.0-c8]"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rate_sweep": 2}, "rate_sweep must be a whole number >= 3, got 2"),
    ({"rate_sweep": 101}, "rate_sweep=101 is above 100"),
    ({"rate_sweep": 3.0}, "rate_sweep must be a whole number >= 3"),
    ({"rate_sweep": 3, "request_rate": 2.0}, "rate_sweep=3 finds its request rates at run time"),
    ({"rate_sweep": [3, 5]}, "rate_sweep=[3, 5]: give one number of points"),
])
def test_bad_rate_sweeps_are_collection_errors_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        expand({"method": "ngram", **kwargs}, PROFILE)


def test_burstiness_shapes_a_rate_sweeps_arrivals() -> None:
    assert {c.burstiness for c in expand({"method": "ngram", "rate_sweep": 3, "burstiness": 0.5}, PROFILE)} == {0.5}


def test_the_saturation_is_measured_once_per_sweep_and_each_rate_is_a_fraction_of_it() -> None:
    assert fractions(4) == (0.25, 0.5, 0.75, 1.0)
    with pytest.raises(ValueError, match="3 to 100 points"):
        fractions(2)
    calls: list[str] = []

    def measure(name: str) -> Any:
        return lambda: calls.append(name) or Saturation(12.0, 300.0, 8, 0.67, 8, name)

    found = Saturations()
    points = [found.point("a", f, 4, measure(f"a{f}")) for f in fractions(4)] + [found.point("b", 1.0, 3, measure("b"))]
    assert calls == ["a0.25", "b"]  # the sweep's first test measures; its others read it
    assert [p.request_rate for p in points] == [3.0, 6.0, 9.0, 12.0, 12.0]
    d = rate_point_entry(RatePoint(0.5, 4, points[0].saturation))
    assert d["request_rate"] == 6.0 and d["saturation_req_s"] == 12.0 and d["saturation"]["measured_by"] == "a0.25"


def run(index: int, e2e_p50: float | None, valid: bool = True) -> ArmRun:
    """A run without spec-decode counters whose stream was coalesced, its E2E P50 ``e2e_p50``."""
    return arm_run(index, per_pos=None, invalid=None if valid else "x", latency_untrusted=["coalesced"],
                   total_output_tokens=40, e2e_ms=None if e2e_p50 is None else {"p50": e2e_p50}, hd_p95_ms={})


def test_a_pairs_load_speedup_is_the_reference_e2e_p50_over_the_specs() -> None:
    ref = [run(0, 200.0), run(1, 300.0), run(2, 100.0), run(3, None)]
    spec = [run(0, 100.0), run(1, 400.0), run(2, 50.0, valid=False), run(3, 10.0)]
    assert X.load_speedups(ref, spec) == [2.0, 0.75]  # a dropped pair and a run without E2E are left out


def pairs(fstar: float, f: float, n: int = 6) -> tuple[float, ...]:
    """n speedups around 2 / (1 + f / f*) (1.0 at f*), spread ±2 %."""
    mid = 2.0 / (1.0 + f / fstar)
    return tuple(mid * (1.0 + 0.02 * math.sin(i)) for i in range(n))


GRID = (0.25, 0.5, 0.75, 1.0)


def test_the_crossover_statistic_takes_the_rate_axis() -> None:
    est = X.estimate([(f, pairs(0.5, f)) for f in GRID], axis=X.RATE, resamples=200)
    assert est is not None and est.side == "crossed" and est.value == pytest.approx(0.5, rel=0.05)
    est = X.Crossover(**{**vars(est), "saturation": 40.0})
    assert est.text().startswith("rate ≈ 0.5 × saturation (≈ 20 req/s) (90% CI")
    d = crossover_value_entry(est)
    assert d["axis"] == "rate_fraction" and d["value_req_s"] == pytest.approx(40 * est.value)
    assert [p["rate_fraction"] for p in d["pairs"]] == list(GRID)
    above = X.estimate([(f, pairs(9.0, f)) for f in GRID], axis=X.RATE, resamples=0)
    assert above is not None and above.text() == "rate > 1 × saturation (speedup above 1.0 at every swept rate)"
    with pytest.raises(ConfigError, match="rec: rate must be a positive number, got 0"):
        X.points_of({"points": [{"rate_fraction": 0, "speedups": [1.0, 1.0]}]}, "rec", X.RATE)
    v = X.compare([(f, pairs(0.5, f)) for f in GRID], [(f, pairs(0.5, f)) for f in GRID[1:]], axis=X.RATE)
    assert v.verdict == NOT_COMPARABLE and "rates: [0.25, 0.5, 0.75, 1.0] -> [0.5, 0.75, 1.0]" in v.note


def point(f: float, fstar: float, **fields: Any) -> G.SweepPoint:
    params = {**CASE, "rate_fraction": f, "request_rate": None}
    return G.SweepPoint(f"t.py::test_load[ngram-k3-t0.0-c8-sat{round(100 * f)}]", params, {}, pairs(fstar, f),
                        **{"status": "compared", "saturation_req_s": 40.0, **fields})


def test_a_rate_sweep_is_judged_by_the_crossovers_gate_on_the_fraction_of_saturation() -> None:
    """Tonight stops paying at half the rate the stored night did: regressed, and gated it fails, as a concurrency
    sweep's crossover would; the rate and concurrency points of one function are two sweeps, never one."""
    found, broken = G.group([*(point(f, 0.25) for f in GRID),
                             *(G.SweepPoint(f"t.py::test_load[ngram-k3-t0.0-c{c}]", {**CASE, "concurrency": c,
                                            "rate_sweep": None, "rate_fraction": None}, {}, pairs(4.0, c))
                               for c in (1, 2))])
    assert broken == [] and [(s.sweep, s.axis) for s in found] == [("t.py::test_load[ngram-k3-t0.0-c8]", X.RATE),
                                                                   ("t.py::test_load[ngram-k3-t0.0]", X.CONCURRENCY)]
    sweep = found[0]
    stored = G.SweepNight("2026-11-01T00:00:00Z", [(f, list(pairs(0.5, f))) for f in GRID])
    out = G.judge_sweep(sweep, stored, alpha=0.05, tolerance=None, gated=True)
    assert out.verdict is not None and out.verdict.verdict == REGRESSED and out.family == GATED and out.failed
    assert out.crossover is not None and out.crossover.saturation == 40.0 and out.axis == X.RATE
    assert out.verdict.note.startswith("crossover rate ≈ 0.5 × saturation → rate ≈ 0.25 × saturation: -50.0 %")
    same = G.judge_sweep(G.Sweep(sweep.sweep, sweep.line, tuple(point(f, 0.5) for f in GRID)), stored, alpha=0.05,
                         tolerance=None, gated=True)
    assert same.verdict is not None and same.verdict.verdict == UNCHANGED and not same.failed


def test_a_rate_sweeps_record_is_written_and_read_back_on_its_axis(tmp_path: Path) -> None:
    gate = G.CrossoverGate(alpha=0.05, tolerance=15.0, started=0.0, profile="fake", update="all", rel=lambda p: p.name,
                           record_path=lambda s: tmp_path / "load.crossover")
    points = [point(f, 0.5) for f in GRID]
    end = gate.finish(points)
    (w,) = end.writes
    assert w.record["axis"] == X.RATE and w.night["saturation_req_s"] == 40.0
    assert [p["rate_fraction"] for p in w.night["points"]] == list(GRID)
    gate.write(end, tmp_path, keep=3)
    (again,) = dataclasses.replace(gate, update=None).finish(points).sweeps
    assert again.verdict is not None and again.verdict.verdict == UNCHANGED and again.stored is not None


def test_the_dry_runs_estimate_spreads_a_points_runs_over_one_over_its_fraction_and_adds_the_saturation_run() -> None:
    from pytest_specdec.output.estimate import PlannedTest, Timings, estimate

    timings = Timings(server_start_s=0.0, stream_tok_s=100.0, max_tok_s=400.0, run_overhead_s=1.0)

    def seconds(fraction: float | None, saturation: bool = False) -> float:
        t = PlannedTest("t.py::f", ("ref", "spec"), 800, 8, 8, 0, 0, fraction, saturation)
        (m,) = estimate([t], timings, runs=2, max_runs=2, max_servers=2)
        return m.seconds

    assert seconds(None) == 4 * (800 / 400 + 1.0)  # 2 runs x 2 arms of a closed pass
    assert seconds(0.5) == 4 * (800 / 400 / 0.5 + 1.0)  # the arrivals of a pass spread over twice its time
    assert seconds(0.5, saturation=True) == seconds(0.5) + 800 / 400 + 1.0  # one closed pass on the reference
