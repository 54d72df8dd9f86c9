"""One session's runs of one test (`Night`), typed, read from its one stored shape (`from_entry`; the baseline
file's module writes it, `gate.baselines.night_entry`). Its runs are the one run record (`measure.record.ArmRun`,
below the gate). A baseline file's `sessions` are `Night` entries; a results file's runs are `ArmRun` entries with
more beside them, read by `Night.from_test`; tonight's runs come from `Night.from_result`, as the runner built them
(no dict between). All of them feed the one
definition of every verdict metric's per-run values (`Night.metric_values`), so a stored night and tonight can
never be measured by two rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import SpecDecError
from pytest_specdec.gate.registry import GOODPUT, METRICS, TAIL_RATIOS
from pytest_specdec.measure.probe import COMPONENTS, state_entry, state_problem
from pytest_specdec.measure.record import ArmRun, dead_arms, goodput_ratio, numbers_problem, pairs, runs_problem

if TYPE_CHECKING:
    from pytest_specdec.measure.runner import CaseResult

#: The absolute latency tails that get a verdict: each run's P95 (Harrell-Davis, `ArmRun.hd_p95_ms`) and P99
#: (as vllm bench serve computes it), in ms, read through `ArmRun.figure`.
LATENCY_TAILS: tuple[str, ...] = tuple(m.name for m in METRICS if m.absolute and m.kind == "latency")
#: Their latencies, by `ArmRun.hd_p95_ms` key.
LATENCIES: tuple[str, ...] = tuple(dict.fromkeys(n.rsplit("_", 2)[0] for n in LATENCY_TAILS))


class RecordError(SpecDecError):
    """A stored run or night that cannot be read; the message follows its path in the file."""


#: Every field of a stored night besides its runs.
NIGHT_FIELDS: dict[str, tuple[type, ...]] = {"started": (str,), "under_test": (dict,), "speedup_per_pair": (list,)}


def pairs_problem(speedups: Any) -> str:
    """What is wrong with a stored speedup per pair ("" when nothing)."""
    if not isinstance(speedups, list):
        return f".speedup_per_pair is {speedups!r}, not list"
    return numbers_problem((f".speedup_per_pair[{n}]", v) for n, v in enumerate(speedups))


def state_figures(state: Any) -> dict[str, float] | None:
    """The probe's figures of a checked stored state (None: not probed)."""
    return None if state is None else {name: float(state[name]) for name in COMPONENTS}


@dataclass(frozen=True)
class Night:
    """One session's runs of one test: both arms, the speedup of each interleaved pair, when it started and
    what was under test (a results file keeps the latter per session, not per test: empty there)."""

    reference: tuple[ArmRun, ...]
    spec: tuple[ArmRun, ...]
    speedup_per_pair: tuple[float | None, ...]
    started: str = ""
    under_test: Mapping[str, Any] = field(default_factory=dict)
    #: The machine probe's figures while the test ran (`measure/probe.py`): what the ratio metrics are
    #: conditioned on (`gate/machine.py`); None where it was not probed (an external endpoint, an older file).
    machine_state: Mapping[str, float] | None = None

    @classmethod
    def from_result(cls, result: CaseResult, started: str = "", under_test: Mapping[str, Any] | None = None
                    ) -> Night:
        """Tonight's runs, the runner's records as they are."""
        state = result.machine_state
        return cls(tuple(r.record for r in result.reference_runs), tuple(r.record for r in result.runs),
                   tuple(result.speedup_per_pair), started, dict(under_test or {}),
                   None if state is None else state_entry(state))

    @classmethod
    def base_from_result(cls, result: CaseResult, started: str = "") -> Night:
        """An A/B test's base arm tonight: its spec runs against its own reference (the base install's, or the
        shared one), each pair's speedup by the one pairing rule, as `from_result` holds the candidate's."""
        from pytest_specdec.measure.record import speedup_per_pair

        refs = tuple(r.record for r in (result.base_reference_runs or result.reference_runs))
        base = tuple(r.record for r in result.base_runs)
        state = result.machine_state
        return cls(refs, base, tuple(speedup_per_pair(refs, base)), started, {},
                   None if state is None else state_entry(state))

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> Night:
        """A baseline file's session: ``{"started", "under_test", "runs": {"reference": [...], "spec": [...]},
        "speedup_per_pair"}`` (the reader has checked it)."""
        runs = entry["runs"]
        return cls(tuple(map(ArmRun.from_entry, runs["reference"])), tuple(map(ArmRun.from_entry, runs["spec"])),
                   tuple(entry.get("speedup_per_pair") or ()), entry.get("started") or "",
                   dict(entry.get("under_test") or {}), state_figures(entry.get("machine_state")))

    @classmethod
    def from_test(cls, test: Mapping[str, Any], started: str = "", where: str = "test") -> Night:
        """A results file's test, as its JSON holds it: its `reference_runs`, `runs` and `speedup_per_pair`
        (a test that never measured has none: no runs). A field the record cannot read is a RecordError
        naming ``where`` and the field's path."""
        lists: dict[str, Any] = {}
        for key in ("reference_runs", "runs", "speedup_per_pair"):
            lists[key] = test.get(key, [])
            if not isinstance(lists[key], list):
                raise RecordError(f"{where}.{key} is {lists[key]!r}, not list")
        problem = pairs_problem(lists["speedup_per_pair"])
        if problem:
            raise RecordError(f"{where}{problem}")
        for key in ("reference_runs", "runs"):
            problem = runs_problem(lists[key])
            if problem:
                raise RecordError(f"{where}.{key}{problem}")
        problem = state_problem(test.get("machine_state"))
        if problem:
            raise RecordError(f"{where}.machine_state{problem}")
        return cls(tuple(map(ArmRun.from_entry, lists["reference_runs"])), tuple(map(ArmRun.from_entry, lists["runs"])),
                   tuple(lists["speedup_per_pair"]), started, machine_state=state_figures(test.get("machine_state")))

    def arms_without_valid_run(self, *, spec: bool) -> list[str]:
        """The arms with no valid run (`dead_arms`); ``spec``: the test serves a spec arm."""
        return dead_arms(self.reference, self.spec if spec else None)

    def metric_values(self, *, untimed_too: bool = False) -> dict[str, list[float]]:
        """Per-run values of every verdict metric (valid runs only, None left out).

        The reference arm gives ``reference_tok_s``; the spec arm everything else; latencies come from the
        spec arm, or from the reference when the test has no spec arm (method ``none``), and only from runs
        whose stream was not coalesced (``untimed_too``: from those too, to tell a metric left out for
        coalesced streams from one no valid run or pair gives). A spec arm whose runs are all invalid gives
        nothing: never the other arm's figures in its place.
        """
        ref = [r for r in self.reference if r.valid]
        spec = [r for r in self.spec if r.valid]
        out: dict[str, list[float]] = {}

        def put(name: str, values: Sequence[float | None]) -> None:
            vals = [float(v) for v in values if v is not None]
            if vals:
                out[name] = vals

        put("speedup", self.speedup_per_pair)
        put("output_tok_s", [r.figure("output_tok_s") for r in spec])
        put("reference_tok_s", [r.figure("output_tok_s") for r in ref])
        put("acceptance_rate", [r.figure("acceptance_rate") for r in spec])
        width = max((len(r.accepted_per_pos or ()) for r in spec), default=0)
        for i in range(width):
            put(f"per_position_acceptance[{i}]", [
                r.accepted_per_pos[i] / r.drafts for r in spec
                if r.drafts and r.accepted_per_pos and i < len(r.accepted_per_pos)
            ])
        put("draft_coverage", [r.figure("draft_coverage") for r in spec])
        put("acceptance_length", [r.figure("acceptance_length") for r in spec])
        # Goodput spec/ref of the same interleaved pair, as the speedup is: a test without SLOs has none, and a
        # pair where an arm met no SLO has no ratio (`record.goodput_undefined` words it for the line).
        put(GOODPUT, [goodput_ratio(p) for p in pairs(self.reference, self.spec)])
        for name in LATENCY_TAILS:
            put(name, [r.figure(name, untimed_too=untimed_too) for r in (spec if self.spec else ref)])
        # The tail ratios: spec ÷ reference of the same interleaved pair (`record.pairs`), so the machine's speed
        # that night cancels as it does in the speedup. The gated one is E2E's, not TPOT's or TTFT's: a stream
        # whose chunks arrive merged still ends when the request ends (a coalesced run has no TTFT figure).
        for m in TAIL_RATIOS:
            put(m.name, [s / r for p in pairs(self.reference, self.spec)
                         if p.kept and p.first is not None and p.second is not None
                         and (s := p.second.figure(m.ratio_of, untimed_too=untimed_too))
                         and (r := p.first.figure(m.ratio_of, untimed_too=untimed_too))])
        return out
