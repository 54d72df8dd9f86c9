"""Shared set-up of the nightly suites.

The plugin (pytest-specdec) provides the `specdec` fixture and marker; suites are plain pytest modules
that declare what to measure.  Fields a marker leaves out (k, temperature, concurrency, num_prompts,
max_tokens) take the active profile's `[matrix]`, so the same suites sweep what each hardware profile
can afford: `pytest suites/` on the CPU default, `pytest suites/ --gpu=h100` on an H100 box.
"""

from __future__ import annotations

from typing import Any

#: The built-in prompt set's categories (pytest_specdec/measure/datasets/builtin.jsonl).
CATEGORIES = ("short_qa", "summarization", "code_generation", "code_editing", "creative_writing",
              "translation", "structured_output", "reasoning")


def enough_pairs(specdec: Any, minimum: int = 2) -> None:
    """Invalid runs are shown in the results and left out of the summary; a test needs valid pairs."""
    valid = [s for s in specdec.result.speedup_per_pair if s is not None]
    invalid = [(r.arm, r.index, r.invalid) for r in specdec.result.invalid_runs]
    assert len(valid) >= minimum, f"fewer than {minimum} valid reference/spec pairs; invalid runs: {invalid}"
    assert specdec.summary["acceptance_rate"] is not None, "no spec-decode counters: did the server speculate?"
