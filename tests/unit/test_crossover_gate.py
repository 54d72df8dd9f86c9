"""The crossover as a gated metric (gate/crossover_gate.py): what makes a sweep (every parameter but concurrency),
a sweep defined wrongly as its own error, the one not-comparable rule, and one sweep's fault never another's."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.gate import crossover_gate as G
from pytest_specdec.gate.kinds import GATED, NOT_COMPARABLE, REGRESSED, UNCHANGED

CASE = {"method": "ngram", "k": 3, "temperature": 0.0, "max_tokens": 16}


def pairs(cstar: float, c: float, n: int = 6) -> tuple[float, ...]:
    """n speedups around 2 / (1 + c / c*) (1.0 at c*), spread ±2 %."""
    mid = 2.0 / (1.0 + c / cstar)
    return tuple(mid * (1.0 + 0.02 * math.sin(i)) for i in range(n))


def point(c: int, cstar: float = 8.0, *, fn: str = "test_sweep", ids: str = "", callspec: dict[str, Any] | None = None,
          **fields: Any) -> G.SweepPoint:
    nodeid = f"t.py::{fn}[ngram-k3-t0.0-c{c}{ids}]"
    return G.SweepPoint(nodeid, {**CASE, "concurrency": c}, callspec or {}, pairs(cstar, c),
                        **{"status": "compared", **fields})


def test_each_other_parameter_makes_its_own_sweep() -> None:
    """The issue's sweep with one more parametrize (a tag): one sweep per tag, named by its tests' id."""
    pts = [point(c, ids=f"-{tag}", callspec={"tag": tag}) for tag in ("plain", "other") for c in (1, 2, 4)]
    pts.append(point(1, fn="test_once"))  # one concurrency: no sweep
    found, broken = G.group(pts)
    assert broken == [] and [s.sweep for s in found] == ["t.py::test_sweep[ngram-k3-t0.0-plain]",
                                                         "t.py::test_sweep[ngram-k3-t0.0-other]"]
    assert [[p.concurrency for p in s.points] for s in found] == [[1, 2, 4], [1, 2, 4]]
    # grouped by the marker's fields only (as before), the tags would be one sweep with two points a concurrency
    assert len(G.group([G.SweepPoint(p.nodeid, p.params, {}, p.speedups) for p in pts])[1]) == 1


def test_two_tests_at_one_concurrency_are_that_sweeps_error_naming_what_it_groups_by() -> None:
    same = [point(c, ids=f"-{x}", callspec={"obj": "Same()"}) for x in "ab" for c in (1, 2)]
    found, broken = G.group([*same, *(point(c, fn="test_fine") for c in (1, 2))])
    assert [s.sweep for s in found] == ["t.py::test_fine[ngram-k3-t0.0]"]
    (err,) = broken
    assert err.failed and err.sweep == "t.py::test_sweep" and err.crossover is None and err.verdict is None
    assert err.error is not None and err.error.startswith(
        "2 tests at concurrency 1 (t.py::test_sweep[ngram-k3-t0.0-c1-a], t.py::test_sweep[ngram-k3-t0.0-c1-b]): ")
    assert "method='ngram', k=3, temperature=0.0, max_tokens=16, obj='Same()'" in err.error


def test_one_rule_decides_not_comparable_and_what_fails() -> None:
    """`judge_sweep`, which the session and `compare` both call: a member not comparable with its baseline, or a
    machine state beyond the tolerance, makes the sweep `not-comparable`; a gated regression fails, except while
    every baseline is being replaced."""
    (sweep,), _ = G.group(point(c, 4.0) for c in (1, 2, 4, 8, 16))
    stored = G.SweepNight("2026-11-01T00:00:00Z", [(float(c), list(pairs(16.0, c))) for c in (1, 2, 4, 8, 16)])
    kw: dict[str, Any] = {"alpha": 0.05, "tolerance": 15.0}
    moved = G.judge_sweep(sweep, stored, gated=True, **kw)
    assert moved.verdict is not None and moved.verdict.verdict == REGRESSED and moved.family == GATED and moved.failed
    assert not G.judge_sweep(sweep, stored, gated=False, **kw).failed  # shown: never fails
    assert not G.judge_sweep(sweep, stored, gated=True, updating_all=True, **kw).failed
    odd = G.Sweep(sweep.sweep, sweep.line, (G.SweepPoint(**{**vars(sweep.points[0]), "status": NOT_COMPARABLE}),
                                            *sweep.points[1:]))
    v = G.judge_sweep(odd, stored, gated=True, **kw).verdict
    assert v is not None and v.verdict == NOT_COMPARABLE and v.note.startswith("1 test(s) of the sweep are not")
    busy = G.SweepNight(stored.started, stored.points, machine_state={"cores": 4.0, "hash": 4.0})
    state = {"cores": 2.0, "hash": 2.0}
    probed = G.Sweep(sweep.sweep, sweep.line, tuple(G.SweepPoint(**{**vars(p), "machine_state": state})
                                                    for p in sweep.points))
    out = G.judge_sweep(probed, busy, gated=True, **kw)
    assert out.verdict is not None and out.verdict.verdict == NOT_COMPARABLE and not out.failed
    assert G.judge_sweep(probed, busy, gated=True, alpha=0.05, tolerance=None).failed  # not conditioned: judged


def test_one_sweeps_fault_is_its_error_and_the_others_are_judged_and_written(tmp_path: Path) -> None:
    from pytest_specdec.gate.store import write_sweep

    gate = G.CrossoverGate(alpha=0.05, tolerance=15.0, started=0.0, profile="fake", update="all", rel=lambda p: p.name,
                           record_path=lambda s: tmp_path / f"{s.split('::')[1]}.crossover")
    points = [point(c, fn=fn) for fn in ("test_a", "test_b", "test_c") for c in (1, 2, 4)]
    grid = [{"concurrency": c, "speedups": list(pairs(8.0, c))} for c in (1, 2, 4)]
    write_sweep(tmp_path, tmp_path / "test_b[ngram-k3-t0.0].crossover", {}, {"started": "x", "points": grid}, keep=3,
                missing_only=False)
    (tmp_path / "test_c[ngram-k3-t0.0].crossover").write_text("{ not json")  # unreadable
    end = dataclasses.replace(gate, update=None).finish(points)
    a, b, c = end.sweeps
    assert a.error is None and a.verdict is None and a.note.startswith("no stored night")
    assert b.error is None and b.verdict is not None and b.verdict.verdict == UNCHANGED
    assert c.failed and c.error is not None and "is not a JSON object" in c.error and end.failed
    end = gate.finish(points)  # --update-baselines: every sweep's night is written, the unreadable record replaced
    assert not end.failed and [w.sweep for w in end.writes] == [x.sweep for x in end.sweeps]
    assert [what.split(":")[0] for _, what in gate.write(end, tmp_path, keep=3)] == ["created", "updated", "created"]


def test_a_fault_in_judging_is_named_with_its_type() -> None:
    (sweep,), _ = G.group(point(c) for c in (1, 2))

    def broken() -> G.SweepOutcome:
        raise ZeroDivisionError("division by zero")

    out = G.judged(sweep, broken)
    assert out.failed and out.error == "could not be judged (ZeroDivisionError: division by zero)"
    assert out.tests == tuple(p.nodeid for p in sweep.points)


@pytest.mark.parametrize(("value", "kept"), [("a", "a"), (3, 3), (None, None), ((1, 2), "(1, 2)")])
def test_a_parametrize_value_is_recorded_as_json_or_its_repr(value: Any, kept: Any) -> None:
    assert G.recorded(value) == kept
