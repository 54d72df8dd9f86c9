"""The one protocol of a session's gate (start, look, test end, finish) and the loop of looks that drives it.

A session judges its tests against stored nights (`judge.Judge`, through `pipeline.Pipeline`) or, in an A/B
session, its candidates against the base measured beside them (`ab_session.ABGate`). Both are a `Gate`: the
session (wiring) drives whichever it runs through these four calls only, and hands the output layer what they
decided. So every option, ini key and marker field that shapes a verdict reaches both the same way (`TestOptions`,
`Planned`), and both take sequential looks, each consulting a `StopRule` after every look but the last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pytest_specdec.profiles.engines import DEFAULT_ENGINE, EngineMode

if TYPE_CHECKING:
    from pytest_specdec.gate.check import Look, TestEnd
    from pytest_specdec.gate.machine import MachineFactor, StateSummary
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.gate.store import BaselineWrites, Hardware
    from pytest_specdec.measure.runner import CaseResult
    from pytest_specdec.measure.types import Sampling
    from pytest_specdec.vllm.command import ServerSpec

#: A test's judgement, as one gate makes it (`check.Judgement`, `ab_session.ABJudgement`): frozen, a new one each step.
C = TypeVar("C")


@dataclass(frozen=True)
class GateOptions:
    """What the session's options say about judging, built once from its settings (`SpecDecSession.gate_options`):
    the stored nights' gate and the A/B's both take it, so an option reaches both the same way."""

    runs: int  # runs (pairs) per arm at the first look
    max_runs: int  # resolved: --specdec-max-runs, else the profile's [verdicts] max_runs, raised to an explicit runs
    alpha: float = 0.05
    multiplicity: str = "bh"  # "bh" | "holm"
    gate: tuple[str, ...] = ()  # ini specdec_gate: metrics added to the gated family
    ini_thresholds: tuple[str, ...] = ()
    cli_thresholds: tuple[str, ...] = ()
    strict: bool = False  # --specdec-strict: a missing or not-comparable baseline fails its test
    fail_inconclusive: bool = False  # --specdec-fail-inconclusive
    fail_machine: bool = False  # --specdec-fail-machine
    calibrate: bool = False  # --specdec-calibrate: the results say so, and the session's end calibrates


@dataclass(frozen=True)
class TestOptions:
    """What a test's `specdec_verdicts` marker says: whether its verdicts may fail it (``check``), its own
    thresholds (metric or kind -> magnitude, on top of the session's) and the metrics it adds to the gated
    family."""

    __test__ = False  # not a pytest test class

    check: bool = True
    thresholds: Mapping[str, float] = field(default_factory=dict)
    gate: tuple[str, ...] = ()


@dataclass(frozen=True)
class Planned:
    """A collected test before it runs: what its gate needs of the tests to come (how many verdicts each can
    add to a family, taken as p = 1 until it is measured) and what it refuses before anything starts."""

    nodeid: str
    method: str
    k: int | None
    speculative_config: Mapping[str, Any] | None
    options: TestOptions
    goodput: bool = False  # it has goodput SLOs: one more verdict (the goodput ratio)
    engine: str = DEFAULT_ENGINE  # its engine mode's name (`profiles.engines`)
    #: the drift metrics it gates (its marker's and the ini's, `gate.drift`): members of the gated family too
    drift: tuple[str, ...] = ()


@dataclass(frozen=True)
class TestStart:
    """A test as its gate meets it, after its first runs: its arms (arm -> server spec) and their servers'
    resolved engine configs, its marker's options, and what the stored nights must share with it."""

    __test__ = False  # not a pytest test class

    nodeid: str
    method: str
    arms: Mapping[str, ServerSpec]
    engines: Mapping[str, Mapping[str, Any]]
    options: TestOptions
    workload: Mapping[str, Any]
    dataset: Mapping[str, Any]
    sampling: Sampling
    endpoint: bool = False
    #: in endpoint mode, the versions each arm's endpoint told (None otherwise)
    endpoint_versions: Mapping[str, Mapping[str, str | None]] | None = None
    #: the engine mode both arms ran in (`profiles.engines`): a stored night of another mode is not comparable
    engine: EngineMode = field(default_factory=EngineMode)


@dataclass(frozen=True)
class Finished(Generic[C]):
    """A test at the session's end: its comparison, what it measured and pytest's word on it."""

    nodeid: str
    check: C
    result: CaseResult | None
    outcome: str  # passed, failed, skipped, pending


@dataclass(frozen=True)
class SessionEnd(Generic[C]):
    """What a gate decides once every test is in (`Gate.finish`); the wiring has it worded and turns it into a
    warning and the exit status. The A/B gate has no machine factor and writes no baseline."""

    machine: MachineFactor | None
    #: every test's judgement as the session's end leaves it (its final verdicts), in the session's order
    judged: tuple[tuple[str, C], ...] = ()
    machine_failed: bool = False  # beyond its threshold under --specdec-fail-machine
    machine_warns: bool = False  # beyond its threshold otherwise: for the wiring to warn
    #: tests that passed at their end but regress once the whole family is known, with their baseline
    late_regressions: tuple[tuple[str, TestEnd], ...] = ()
    written: tuple[str, ...] = ()  # what the baseline store says of its writes
    baselines: BaselineWrites | None = None  # what --update-baselines wrote; None without the flag
    baselines_failed: bool = False  # some of them could not be written (a read-only directory): the session fails
    #: this machine had no baselines of the profile (while another machine has, or they are being recorded):
    #: said once, for the whole session; (the machines, the tests it left without a verdict)
    no_own_baselines: tuple[Hardware, tuple[str, ...]] | None = None
    #: the session's machine state against its stored nights (`machine.state_summary`), said once
    state: StateSummary | None = None
    #: tests whose final verdicts could not be computed (nodeid, why): each fails the session, the rest is judged
    errors: tuple[tuple[str, str], ...] = ()

    @property
    def fails(self) -> bool:
        """Whether the gate's end fails the session, over every test's own outcome: a test that regressed only once
        the whole family was known, the machine factor beyond its threshold under --specdec-fail-machine, a baseline
        that could not be written, a test whose final verdicts could not be computed."""
        return bool(self.late_regressions or self.machine_failed or self.baselines_failed or self.errors)


class StopRule(Protocol):
    """Whether a test stops adding runs after a look that is not its last: the reason it stops, or None to take
    the next look. ``verdicts`` are its raw verdicts at this look, ``n_now`` its runs (pairs) per arm, ``n_max``
    the most it may take, ``alpha_look`` this look's one-sided level. The default continues while a gated
    verdict is inconclusive and more runs could settle it (`sequential.until_settled`); a rule that stops early
    on a conclusive `unchanged` plugs in here."""

    def __call__(self, verdicts: Sequence[Verdict], n_now: int, n_max: int, alpha_look: float) -> str | None: ...


class Gate(Protocol[C]):
    """A session's gate: each test started after its first runs, judged at each look, decided at its end
    against the family so far, and the whole session decided at its end."""

    def start(self, test: TestStart) -> C:
        """The test's judgement before any verdict: its plan (what it is compared with and how)."""
        ...

    def look(self, nodeid: str, judged: C, result: CaseResult, look: int) -> tuple[C, Look]:
        """The test's runs so far (``result``) judged at look ``look`` (1-based): its judgement with the look
        added, and the look (whether to take another)."""
        ...

    def test_end(self, nodeid: str, family: Sequence[tuple[str, C]], planned: Sequence[Planned]
                 ) -> tuple[C, TestEnd]:
        """The test's verdicts adjusted over the ``family`` judged so far, padded to what the ``planned`` tests
        can add, and what they decide: its judgement at its end, and the end."""
        ...

    def finish(self, tests: Sequence[Finished[C]]) -> SessionEnd[C]:
        """The session's end: the whole family adjusted (every test's final judgement), the tests that regress
        only now, and what follows from them (the machine factor, the baseline writes)."""
        ...


def look_loop(judged: C, judge: Callable[[C, int], tuple[C, Look]], extend: Callable[[int], None],
              progress: Callable[[str], None] | None = None) -> C:
    """The one loop of a test's looks: judge look 1, and while the look asks for another (`Look.next_runs`), take
    the runs up to that many per arm (``extend(n)``) and judge the next; the judgement after the last look. The
    session measures between looks (`drive`); the simulations take tonight's next runs from a simulated night
    (`pipeline.sequential`)."""
    look = 1
    while True:
        judged, step = judge(judged, look)
        if progress is not None and step.line:
            progress(step.line)
        if step.next_runs is None:
            return judged
        extend(step.next_runs)
        look += 1


def drive(gate: Gate[C], nodeid: str, judged: C, result: CaseResult, extend: Callable[[int], None],
          progress: Callable[[str], None]) -> C:
    """A test's looks through its gate: judge the runs measured, and while the gate asks for another look,
    measure up to its runs per arm (``extend(n)``) and judge again; the judgement after the last look."""
    return look_loop(judged, lambda c, look: gate.look(nodeid, c, result, look), extend, progress)
