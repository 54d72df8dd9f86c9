"""The lines the terminal shows while a specdec test runs: what it is about to measure and what it measured
(each run's own line is the runner's); and at the end, the session's server starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_specdec.servers.pool import StartRecord


def planned(nodeid: str, n_prompts: int, runs: int, block: int | None, fresh: bool) -> str:
    how = "interleaved" if block is None else f"in blocks of {block} (one server at a time)"
    new = ", fresh prompts every run (suffix decoding learns what it served)" if fresh else ""
    return f"specdec: {nodeid}: {n_prompts} prompts x {runs} runs {how}{new}"


def measured(nodeid: str, summary: dict[str, Any]) -> str:
    """What a test measured, and what its speedup is made of (`wording.explained_text`) when it has a spec arm."""
    from pytest_specdec.output.wording import explained_text

    s = summary
    why = explained_text(s.get("explain"))
    goodput = goodput_text(s)
    return (f"specdec: {nodeid}: {_f(s['output_tok_s'])} tok/s vs reference {_f(s['reference_tok_s'])}, "
            f"speedup {_f(s['speedup'], '.2f')}x, acceptance {_f(s['acceptance_rate'], '.3f')}"
            + (f", {goodput}" if goodput else "") + (f"; {why}" if why else ""))


def goodput_text(s: Mapping[str, Any]) -> str:
    """A test with goodput SLOs (`summary.goodput_summary`): its goodput ratio and each arm's, and every pair whose
    ratio is undefined because an arm met no SLO (never dropped unsaid); "" for a test without SLOs. The terminal
    line and the report's test section read it."""
    if "goodput_req_s" not in s:
        return ""
    undefined = s.get("goodput_undefined") or []
    left = (f" (undefined at {len(undefined)} pair(s), left out of its verdict: "
            + "; ".join(f"run {u['index'] + 1}: {u['why']}" for u in undefined) + ")") if undefined else ""
    return (f"goodput {_f(s['goodput'], '.2f')}x ({_f(s['goodput_req_s'], '.2f')} vs reference "
            f"{_f(s['reference_goodput_req_s'], '.2f')} req/s meeting the SLOs){left}")


def distribution_planned(nodeid: str, n_prompts: int, samples_per_prompt: int) -> str:
    return (f"specdec: {nodeid}: distribution check, {n_prompts} prompts x {samples_per_prompt} samples from the "
            "spec server and twice from the reference, scored by the reference")


def distribution_measured(nodeid: str, out: dict[str, Any]) -> str:
    m = out["mean_logprob"]
    return (f"specdec: {nodeid}: distribution {out['verdict']}: mean log-prob per token spec "
            f"{_f(m['spec'], '.3f')} vs reference {_f(m['reference_a'], '.3f')}, p {_f(out['p'], '.2g')}")


def _f(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def server_start_lines(starts: Sequence[StartRecord]) -> list[str]:
    """The summary's server table: each start, the group it started together with, and what the overlap saved
    (the group's start-ups added up against its wall time: what one after another would have cost at least)."""
    lines: list[str] = []
    groups: dict[str, tuple[float, list[float]]] = {}
    for start in starts:
        gpus = f"  GPU {start.gpus}" if start.gpus else ""
        together = f"  together [{start.group}]" if start.group else ""
        lines.append(f"  {start.method:16s} {start.spec_key}  ready in {start.startup_s:.0f} s{gpus}{together}")
        if start.group is not None and start.group_wall_s is not None:
            groups.setdefault(start.group, (start.group_wall_s, []))[1].append(start.startup_s)
    if groups:
        wall = sum(w for w, _ in groups.values())
        summed = sum(sum(each) for _, each in groups.values())
        n = sum(len(each) for _, each in groups.values())
        lines.append(f"  {n} start(s) in {len(groups)} group(s) started together: {wall:.1f} s of wall time for "
                     f"{summed:.1f} s of start-ups ({summed - wall:.1f} s saved)")
    return lines
