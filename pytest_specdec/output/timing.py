"""Where a session's wall time went: its measured runs, its server starts, its waits for idle servers, and the
efficiency figure ``time in runs / wall``.

Why: a session spends most of its time outside the runs it measures (server starts, the wait before each run
for the other servers to go idle); this figure tells how much, so that a change to the waits or the starts is
seen in every results file, not only in a profile someone thought to take.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_specdec.measure.runner import CaseResult, RunRecord


@dataclass(frozen=True)
class SessionTime:
    """The session's wall time and the seconds spent in runs, server starts and waits (each summed over xdist
    workers, so with several workers they can add up to more than the wall)."""

    wall_s: float
    runs_s: float
    starts_s: float
    waits_s: float
    runs: int

    @property
    def efficiency(self) -> float | None:
        """Time in runs / wall (None for a session of no wall time)."""
        return self.runs_s / self.wall_s if self.wall_s > 0 else None

    def line(self) -> str:
        """The terminal's one line: where the wall time went."""
        eff = self.efficiency
        rest = self.wall_s - self.runs_s - self.starts_s - self.waits_s
        return (f"specdec: wall {self.wall_s:.0f} s: runs {self.runs_s:.0f} s ({self.runs} runs), server starts "
                f"{self.starts_s:.0f} s, waits for idle servers {self.waits_s:.0f} s, other {rest:.0f} s; "
                f"efficiency (runs / wall) {'n/a' if eff is None else f'{eff:.0%}'}")


def all_runs(result: CaseResult) -> list[RunRecord]:
    """Every measured run of a test, all arms (an A/B session's base arms included)."""
    return [*result.reference_runs, *result.runs, *result.base_runs, *result.base_reference_runs]


def session_time(wall_s: float, results: Iterable[CaseResult | None], startup_s: Iterable[float]) -> SessionTime:
    """The split of `wall_s` over the tests' `results` (None: a test that measured nothing) and the server
    starts' seconds: a run's time is its measured load (`duration_s`, warm-up not included), a wait is what the
    run's settle recorded (`waited_s`)."""
    runs = [r for res in results if res is not None for r in all_runs(res)]
    return SessionTime(wall_s=wall_s, runs_s=sum(r.metrics.duration_s for r in runs), starts_s=sum(startup_s),
                       waits_s=sum(r.settle.waited_s for r in runs if r.settle), runs=len(runs))
