"""Why a speedup is what it is: tokens per verification step (τ), the step times, the speedup they predict, the
verification efficiency, and a speedup change split into "the draft accepts less" and "a step costs more".

Defined once here, as pure functions over a test's runs as the one run record (`record.ArmRun`: tonight's, a
results file's, a stored baseline night's), so the results JSON, the terminal, the report, `compare`,
`history` and the failure messages all read the same figures; τ and the geometric mean are `figures.py`'s,
the pairs `record.pairs`'.

* τ (chain): vLLM accepts a draft's tokens in order and stops at the first rejection, so the expected tokens per
  verification step are 1 + the sum of the per-position acceptance rates, which is vLLM's acceptance length.
* τ (i.i.d.): the seed studies' ``(1 - α^(k+1)) / (1 - α)``, α the chance that a drafted token is accepted given
  the ones before it were, fitted to the per-position counters (accepted ÷ tried at every position). Beside the
  chain τ it shows whether acceptance is uniform across positions: where they differ, it is not. (vLLM's
  ``acceptance_rate``, accepted ÷ drafted, is not this α: it counts the positions never tried.)
* Step times, per sequence: a reference step makes one token, so its time is the median TPOT; a spec step makes
  τ tokens, so its time is τ × the spec arm's median TPOT. Predicted speedup = τ × reference step ÷ spec step.
* Verification efficiency = measured speedup ÷ τ: the share of τ the speedup keeps, which is the reference step
  time ÷ the spec step time as throughput sees it. Its inverse is the spec step in reference steps, and
  (that − 1) ÷ k the implied draft overhead per draft token in target steps (verifying k + 1 tokens counted as
  one target step: any extra verification cost is in this figure too).
* The split: speedup = τ × efficiency exactly, so log(speedup ratio) = log(τ ratio) − log(spec step ratio), with
  the spec step measured in reference steps. Nothing is left over.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_specdec.measure.figures import geomean, tau
from pytest_specdec.measure.record import ArmRun, pair_speedups

#: Below this share of a speedup change, a part (acceptance or step time) is called unchanged.
MINOR_SHARE = 0.1
#: From this share on, a part is what the change points at.
MAIN_SHARE = 2 / 3

Cause = Literal["acceptance", "step time"]


def chain_tau(drafts: float, accepted_per_pos: Sequence[float]) -> float | None:
    """Expected tokens per verification step under chain acceptance: 1 + Σ accepted at position i ÷ drafts
    (`figures.tau` of the positions' accepted tokens)."""
    return tau(drafts, sum(accepted_per_pos))


def iid_alpha(drafts: float, accepted_per_pos: Sequence[float]) -> float | None:
    """α fitted to the per-position counters if every position accepts with the same chance given the ones
    before it did: accepted ÷ tried over all positions (position i is tried as often as position i − 1 was
    accepted; the first on every draft). The maximum-likelihood estimate of that model; None without drafts."""
    tried = drafts + sum(accepted_per_pos[:-1])
    return sum(accepted_per_pos) / tried if drafts > 0 and tried > 0 else None


def iid_tau(alpha: float, k: int) -> float:
    """The seed studies' τ = (1 − α^(k+1)) ÷ (1 − α): expected tokens per step, k drafted, each accepted with
    chance α given the ones before it were."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"iid_tau needs 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def cost_per_million(tok_s: float | None, usd_per_hour: float | None) -> float | None:
    """US dollars per 1M output tokens at ``tok_s`` on hardware at ``usd_per_hour``; None without either."""
    if not tok_s or not usd_per_hour or tok_s <= 0:
        return None
    return usd_per_hour / (tok_s * 3600.0) * 1e6


def _tpot(run: ArmRun) -> float | None:
    """The run's median TPOT (ms): the time a sequence waits per output token."""
    return (run.latencies_ms.get("tpot_ms") or {}).get("p50")


@dataclass(frozen=True)
class Explained:
    """One spec arm against its reference: τ both ways, step times, predicted speedup and efficiency."""

    speedup: float | None  # geometric mean over the valid pairs
    tau: float  # chain: 1 + Σ per-position rates = vLLM's acceptance length
    tau_iid: float | None  # (1 − α^(k+1)) ÷ (1 − α)
    alpha: float | None  # i.i.d. per-position acceptance fitted to the counters
    k: int  # draft positions the counters report
    ref_step_ms: float | None  # median reference TPOT: one token per step
    spec_step_ms: float | None  # τ × the spec arm's median TPOT
    predicted_speedup: float | None  # τ × reference step ÷ spec step
    efficiency: float | None  # measured speedup ÷ τ
    spec_step_rel: float | None  # 1 ÷ efficiency: a spec step in reference steps, as throughput sees it
    draft_overhead: float | None  # (spec_step_rel − 1) ÷ k: per draft token, in target steps
    pairs: int


def explain(reference: Sequence[ArmRun], spec: Sequence[ArmRun], speedups: Sequence[float] | None = None
            ) -> Explained | None:
    """The figures of a spec arm over its valid runs (counters pooled, TPOT and speedups by geometric mean;
    ``speedups``: the pairs' when the runs are several nights' pooled, whose run indices repeat, else those of
    `record.pair_speedups`); None when no valid spec run drafted (no spec arm, or the counters were not read)."""
    runs = [r for r in spec if r.valid and r.drafts]
    drafts = sum(r.drafts or 0 for r in runs)
    if not drafts:
        return None
    counts = [r.accepted_per_pos or () for r in runs]
    k = max(map(len, counts), default=0)
    per_pos = [float(sum(c[i] for c in counts if i < len(c))) for i in range(k)]
    t = tau(drafts, sum(per_pos) if k else sum(r.accepted_tokens or 0 for r in runs))
    assert t is not None
    alpha = iid_alpha(drafts, per_pos) if k else None
    ref_tpot = geomean(_tpot(r) for r in reference if r.valid)
    spec_tpot = geomean(_tpot(r) for r in runs)
    spec_step = None if spec_tpot is None else t * spec_tpot
    pairs = pair_speedups(reference, spec) if speedups is None else speedups
    speedup = geomean(pairs)
    eff = None if speedup is None else speedup / t
    rel = None if eff is None else 1.0 / eff
    return Explained(
        speedup=speedup, tau=t, tau_iid=None if alpha is None else iid_tau(alpha, k), alpha=alpha, k=k,
        ref_step_ms=ref_tpot, spec_step_ms=spec_step,
        predicted_speedup=None if ref_tpot is None or not spec_step else t * ref_tpot / spec_step,
        efficiency=eff, spec_step_rel=rel, draft_overhead=None if rel is None or not k else (rel - 1.0) / k,
        pairs=len(pairs))


@dataclass(frozen=True)
class Split:
    """A speedup change from ``before`` to ``after``, split exactly on the log scale: log speedup ratio =
    log τ ratio − log spec-step ratio (the spec step in reference steps)."""

    speedup_before: float
    speedup_after: float
    tau_before: float
    tau_after: float
    step_before: float  # spec step in reference steps (1 ÷ efficiency)
    step_after: float

    @property
    def speedup_log(self) -> float:
        return math.log(self.speedup_after / self.speedup_before)

    @property
    def acceptance_log(self) -> float:
        return math.log(self.tau_after / self.tau_before)

    @property
    def step_log(self) -> float:
        """The step time's part of the speedup's log change (a slower step is negative)."""
        return -math.log(self.step_after / self.step_before)

    @property
    def acceptance_share(self) -> float:
        """|acceptance part| ÷ (|acceptance part| + |step part|): 0 when nothing moved."""
        total = abs(self.acceptance_log) + abs(self.step_log)
        return abs(self.acceptance_log) / total if total else 0.0

    @property
    def speedup_change_pct(self) -> float:
        return 100.0 * math.expm1(self.speedup_log)

    @property
    def tau_change_pct(self) -> float:
        return 100.0 * math.expm1(self.acceptance_log)

    @property
    def step_change_pct(self) -> float:
        """The spec step's own change (a slower step is positive)."""
        return 100.0 * math.expm1(-self.step_log)

    def cause(self) -> Cause | None:
        """What the change points at: the part with at least `MAIN_SHARE` of it; None when both share it."""
        share = self.acceptance_share
        return "acceptance" if share >= MAIN_SHARE else "step time" if share <= 1 - MAIN_SHARE else None


def split(before: Explained | None, after: Explained | None) -> Split | None:
    """The split of the speedup change from ``before`` to ``after``; None where either lacks a speedup."""
    if before is None or after is None or not before.speedup or not after.speedup:
        return None
    assert before.spec_step_rel is not None and after.spec_step_rel is not None
    return Split(before.speedup, after.speedup, before.tau, after.tau, before.spec_step_rel, after.spec_step_rel)
