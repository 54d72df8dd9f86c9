"""The lines the terminal shows while a specdec test runs: what it is about to measure and what it measured
(each run's own line is the runner's)."""

from __future__ import annotations

from typing import Any


def planned(nodeid: str, n_prompts: int, runs: int, block: int | None, fresh: bool) -> str:
    how = "interleaved" if block is None else f"in blocks of {block} (one server at a time)"
    new = ", fresh prompts every run (suffix decoding learns what it served)" if fresh else ""
    return f"specdec: {nodeid}: {n_prompts} prompts x {runs} runs {how}{new}"


def measured(nodeid: str, summary: dict[str, Any]) -> str:
    """What a test measured, and what its speedup is made of (`wording.explained_text`) when it has a spec arm."""
    from pytest_specdec.output.wording import explained_text

    s = summary
    why = explained_text(s.get("explain"))
    return (f"specdec: {nodeid}: {_f(s['output_tok_s'])} tok/s vs reference {_f(s['reference_tok_s'])}, "
            f"speedup {_f(s['speedup'], '.2f')}x, acceptance {_f(s['acceptance_rate'], '.3f')}"
            + (f"; {why}" if why else ""))


def distribution_planned(nodeid: str, n_prompts: int, samples_per_prompt: int) -> str:
    return (f"specdec: {nodeid}: distribution check, {n_prompts} prompts x {samples_per_prompt} samples from the "
            "spec server and twice from the reference, scored by the reference")


def distribution_measured(nodeid: str, out: dict[str, Any]) -> str:
    m = out["mean_logprob"]
    return (f"specdec: {nodeid}: distribution {out['verdict']}: mean log-prob per token spec "
            f"{_f(m['spec'], '.3f')} vs reference {_f(m['reference_a'], '.3f')}, p {_f(out['p'], '.2g')}")


def _f(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)
