"""Alternation of the arms: interleaved pairs, or ABBA blocks when the servers cannot co-reside."""

from __future__ import annotations

from typing import Any

import pytest
from factories import measured_run

from fakes import FakeConfig, FakeServer
from pytest_specdec.measure.runner import extend_case, measure_case
from pytest_specdec.measure.schedule import schedule
from pytest_specdec.measure.types import Prompt, Sampling
from pytest_specdec.measure.validity import ValidityRules
from pytest_specdec.output.results import case_entry, run_entry
from pytest_specdec.servers.pool import Endpoint


def test_schedule_interleaves_pairs_by_default_abba() -> None:
    # Which arm leads swaps from pair to pair, so every other run follows its own server's run (no wait for
    # another server's busy loop), and a later look continues the parity from the pair index.
    assert schedule(0, 3, None) == [(0, "reference"), (0, "spec"), (1, "spec"), (1, "reference"),
                                    (2, "reference"), (2, "spec")]
    assert schedule(3, 5, None) == [(3, "spec"), (3, "reference"), (4, "reference"), (4, "spec")]


def test_schedule_blocks_are_abba_so_one_server_serves_two_blocks_in_a_row() -> None:
    assert schedule(0, 3, 2) == [(0, "reference"), (1, "reference"), (0, "spec"), (1, "spec"),
                                 (2, "spec"), (2, "reference")]
    # A later look continues the parity: block 2 starts with the reference again.
    assert schedule(3, 5, 2, block_index=2) == [(3, "reference"), (4, "reference"), (3, "spec"), (4, "spec")]
    with pytest.raises(ValueError, match="block must be >= 1"):
        schedule(0, 2, 0)


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=8) for i in range(n)]


class _Arm:
    """An endpoint source that records when the measurement asked for it (a stand-in for the pool)."""

    def __init__(self, name: str, url: str, calls: list[str]) -> None:
        self.name, self.url, self.calls = name, url, calls

    def __call__(self) -> Endpoint:
        # One server alive at a time, like the pool: asked right after the other arm, it is a new start.
        restarted = not self.calls or self.calls[-1] != self.name
        self.calls.append(self.name)
        self.starts = getattr(self, "starts", 0) + restarted
        return Endpoint(self.url, "fake-model", owned=True, instance=f"{self.name}-{self.starts}")


def test_blocks_run_each_arm_in_turn_with_a_warmup_per_block() -> None:
    spec_srv = FakeServer(FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4), output_tokens=8))
    ref_srv = FakeServer(FakeConfig(output_tokens=8))
    with spec_srv as spec_url, ref_srv as ref_url:
        calls: list[str] = []
        lines: list[str] = []
        # Steps of 0 s: a run's tok/s is a few ms of HTTP, so the disturbed-run rule is off here.
        result = measure_case(_Arm("reference", ref_url, calls), _Arm("spec", spec_url, calls), _prompts(4),
                              Sampling(temperature=0.0), concurrency=2, runs=3, block=2, progress=lines.append,
                              rules=ValidityRules(max_run_slowdown=0))
        assert calls == ["reference", "reference", "spec", "spec", "spec", "reference"]
        assert result.alternation == "blocks of 2" and case_entry(result)["alternation"] == "blocks of 2"
        assert [r.index for r in result.reference_runs] == [0, 1, 2]
        assert [r.index for r in result.runs] == [0, 1, 2]
        assert len(result.speedup_per_pair) == 3 and all(s for s in result.speedup_per_pair)
        assert result.summary is not None and result.summary.acceptance_rate is not None
        # 3 blocks (ref 0-1, spec 0-2, ref 2): each starts with a warm-up of 2 x concurrency requests.
        sent = spec_srv.requests + ref_srv.requests
        assert sum(":warmup" in r.get("cache_salt", "") for r in sent) == 3 * 4
        assert len(sent) == 3 * 4 + 2 * 3 * 4
        assert sum(r.metrics.n_requests for r in [*result.runs, *result.reference_runs]) == 2 * 3 * 4
        # A later look adds two more pairs and continues the ABBA order from where it stopped.
        calls.clear()
        extend_case(result, _Arm("reference", ref_url, calls), _Arm("spec", spec_url, calls), _prompts(4),
                    Sampling(temperature=0.0), concurrency=2, runs=5, block=2)
        assert calls == ["reference", "reference", "spec", "spec"]
        assert len(result.runs) == len(result.reference_runs) == 5


def test_interleaved_is_recorded() -> None:
    with FakeServer(FakeConfig(k=3, acceptance=(0.5, 0.4, 0.3), output_tokens=8)) as spec_url, \
            FakeServer(FakeConfig(output_tokens=8)) as ref_url:
        calls: list[str] = []
        result = measure_case(_Arm("reference", ref_url, calls), _Arm("spec", spec_url, calls), _prompts(2),
                              Sampling(temperature=0.0), concurrency=1, runs=2)
        assert calls == ["reference", "spec", "spec", "reference"]
        assert result.alternation == "interleaved"


def test_the_machine_probe_waits_for_every_server_the_next_runs_own_included() -> None:
    """A run after its own server's waits only for the others (its own spin is about to be work), but the
    machine's probe before the first and last run reads the whole machine: there every server must be idle."""
    from pytest_specdec.servers.quiet import Quiet

    asked: list[str | None] = []
    probes: list[int] = []

    def settle(own: str | None, ended: float | None) -> Quiet:
        asked.append(own)
        return Quiet(0.0, True, 0.0)

    with FakeServer(FakeConfig(k=3, acceptance=(0.5, 0.4, 0.3), output_tokens=8)) as spec_url, \
            FakeServer(FakeConfig(output_tokens=8)) as ref_url:
        ref = Endpoint(ref_url, "fake-model", owned=True, instance="ref")
        spec = Endpoint(spec_url, "fake-model", owned=True, instance="spec")
        result = measure_case(ref, spec, _prompts(2), Sampling(temperature=0.0), concurrency=1, runs=2,
                              settle=settle, probe=lambda: probes.append(len(asked)) or "state")
        # Order: reference, spec, spec, reference; the probe comes before the first and the last run.
        assert asked == [None, "spec", "spec", None]
        assert probes == [1, 4] and result.machine_states == ["state", "state"]
        asked.clear()
        extend_case(result, ref, spec, _prompts(2), Sampling(temperature=0.0), concurrency=1, runs=3,
                    settle=settle, probe=lambda: "state")
        # A later look starts with the reference after the reference's own run: probed, so all servers.
        assert asked == [None, None]


def test_a_run_beside_a_busy_server_is_invalid_and_names_it() -> None:
    """The cores each other server used during a run are read around it (`neighbours`); above the limit the run
    is invalid, naming the server by its arm. Here the base's server spins for half a second (vLLM's busy-wait)
    whenever it has just served a run, so the run after each base run shares the CPU with it."""
    import os

    hz = os.sysconf("SC_CLK_TCK")
    calls: list[str] = []
    ticks = {"reference": 0, "base": 0, "spec": 0}

    def neighbours() -> dict[str, tuple[str, int]]:
        if len(calls) >= 2 and calls[-2] == "base" and calls[-1] != "base":
            ticks["base"] += hz // 2  # read before and after the run: half a second of CPU in between
        return {name: (f"{name}-server", t) for name, t in ticks.items()}

    def arm(name: str, url: str) -> Any:
        return lambda: calls.append(name) or Endpoint(url, "fake-model", owned=True, instance=name)

    with FakeServer(FakeConfig(k=3, acceptance=(0.5, 0.4, 0.3), output_tokens=8)) as spec_url, \
            FakeServer(FakeConfig(output_tokens=8)) as ref_url:
        rules = ValidityRules(max_run_slowdown=0, max_neighbour_cores=0.25)
        lines: list[str] = []
        result = measure_case(arm("reference", ref_url), arm("spec", spec_url), _prompts(2), Sampling(temperature=0.0),
                              concurrency=1, runs=4, rules=rules, base=arm("base", spec_url), neighbours=neighbours,
                              progress=lines.append)
    shared = sorted((r.arm, r.index) for r in result.invalid_runs)
    # Pairs alternate reference, base, candidate / reference, candidate, base: the candidate follows the base in
    # even pairs, the next pair's reference in odd ones.
    assert shared == [("reference", 2), ("spec", 0), ("spec", 2)], shared
    (reason,) = result.runs[0].invalid
    assert reason.startswith("shared the CPU: the base arm's server (base-server) used ") and reason.endswith(
        " cores during the run (limit 0.25, [validity] max_neighbour_cores)"), reason
    assert result.runs[1].neighbours == {"reference arm's server (reference-server)": 0.0,
                                         "base arm's server (base-server)": 0.0}, result.runs[1].neighbours
    assert any("INVALID: shared the CPU" in line for line in lines)
    # each invalid run drops its own pair, said and counted (`record.pairs`)
    assert lines[-1] == ("specdec:   2 of 4 pair(s) left out of the speedup and the paired verdicts: run 1: the spec "
                         "run is invalid; run 3: the reference run is invalid and the spec run is invalid"), lines[-1]
    assert result.summary is not None and result.summary.pairs == 2
    assert [i for i, _ in result.summary.pairs_dropped or ()] == [0, 2]
    assert [s is None for s in result.speedup_per_pair] == [True, False, True, False]
    # The limit at 0 (the default) turns the rule off; the cores are still recorded.
    calls.clear()
    with FakeServer(FakeConfig(k=3, acceptance=(0.5, 0.4, 0.3), output_tokens=8)) as spec_url, \
            FakeServer(FakeConfig(output_tokens=8)) as ref_url:
        result = measure_case(arm("reference", ref_url), arm("spec", spec_url), _prompts(2), Sampling(temperature=0.0),
                              concurrency=1, runs=2, rules=ValidityRules(max_run_slowdown=0),
                              base=arm("base", spec_url), neighbours=neighbours)
    assert not result.invalid_runs and run_entry(result.runs[0])["neighbour_cores"]


def _rec(arm: str, index: int, texts: dict[str, str], valid: bool = True) -> Any:
    return measured_run(arm, index, None, texts=texts, invalid=() if valid else ("test",))


def test_output_match_judges_spec_against_the_reference_control() -> None:
    from pytest_specdec.measure.outputs import greedy_output_match
    from pytest_specdec.measure.runner import CaseResult

    same = {f"p{i}": f"out{i}" for i in range(20)}
    refs = [_rec("reference", i, same) for i in range(3)]
    ok = CaseResult(reference_runs=refs, runs=[_rec("spec", i, same) for i in range(3)], summary=None,
                    speedup_per_pair=[])
    m = greedy_output_match(ok)
    assert m["spec_match"] == m["control_match"] == 1.0 and m["spec_n"] == 60 and m["control_n"] == 40
    assert m["p"] == 1.0
    # A spec server that changes half the answers is far below the control: a lossless failure.
    broken = {k: (v if int(k[1:]) % 2 else "x") for k, v in same.items()}
    bad = CaseResult(reference_runs=refs, runs=[_rec("spec", i, broken) for i in range(3)], summary=None,
                     speedup_per_pair=[])
    m = greedy_output_match(bad)
    assert m["spec_match"] == 0.5 and m["p"] < 1e-6
    # Near-ties flipping in the reference too: the same flips in spec are not a failure.
    flaky = [_rec("reference", 0, same), _rec("reference", 1, {**same, "p0": "y", "p1": "y"}),
             _rec("reference", 2, same)]
    spec = [_rec("spec", i, {**same, "p2": "z", "p3": "z"}) for i in range(3)]
    m = greedy_output_match(CaseResult(reference_runs=flaky, runs=spec, summary=None, speedup_per_pair=[]))
    assert m["control_match"] == 0.9 and m["p"] > 0.05
    # Invalid runs are left out; too few valid runs says why instead of judging.
    m = greedy_output_match(CaseResult(reference_runs=[refs[0], _rec("reference", 1, same, valid=False)],
                                runs=[_rec("spec", 0, same)], summary=None, speedup_per_pair=[]))
    assert m["p"] is None and "two valid reference runs" in m["why"]


def test_collapsed_positions_flags_the_vllm_cpu_sampler_bug_not_a_small_real_rate() -> None:
    from pytest_specdec.measure.outputs import collapsed_positions

    assert collapsed_positions([0.21, 0.0, 0.0], drafts=4000) == [2, 3]  # vllm-cpu 0.32.0 at T=1, no fix
    assert collapsed_positions([0.13, 0.02, 0.01], drafts=4000) == []  # with the fix
    assert collapsed_positions([0.21, 0.0, 0.0], drafts=10) == []  # too few drafts to tell
    assert collapsed_positions([0.0, 0.0, 0.0], drafts=4000) == []  # nothing accepted at all: not this bug
    assert collapsed_positions(None, drafts=4000) == []
