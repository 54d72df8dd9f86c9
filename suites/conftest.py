"""Shared set-up of the nightly suites.

The plugin (pytest-specdec) provides the `specdec` fixture and marker; suites are plain pytest modules
that declare what to measure.  Fields a marker leaves out (k, temperature, concurrency, num_prompts,
max_tokens) take the active profile's `[matrix]`, so the same suites sweep what each hardware profile
can afford: `pytest suites/` on the CPU default, `pytest suites/ --gpu=h100` on an H100 box.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: The built-in prompt set's categories (pytest_specdec/measure/datasets/builtin.jsonl).
CATEGORIES = ("short_qa", "summarization", "code_generation", "code_editing", "creative_writing",
              "translation", "structured_output", "reasoning")


def enough_pairs(specdec: Any, minimum: int = 2) -> None:
    """Invalid runs are shown in the results and left out of the summary; a test needs valid pairs."""
    valid = [s for s in specdec.result.speedup_per_pair if s is not None]
    invalid = [(r.arm, r.index, r.invalid) for r in specdec.result.invalid_runs]
    assert len(valid) >= minimum, f"fewer than {minimum} valid reference/spec pairs; invalid runs: {invalid}"
    assert specdec.summary["acceptance_rate"] is not None, "no spec-decode counters: did the server speculate?"


#: Suite modules measuring presets only some profiles have, and those presets: a module is collected when the
#: active profile has them all, so `pytest suites/` on the cpu profile (no suffix, EAGLE, MTP, Medusa, MLP
#: speculator, DFlash, PARD or dynamic-k preset in its zoo) measures what it always did, and a GPU profile without
#: room for a head skips its module.
PRESETS: dict[str, tuple[str, ...]] = {
    "test_gpu_methods.py": ("suffix", "eagle", "mtp", "medusa"),
    "test_mlp_speculator.py": ("mlp_speculator",),
    "test_recent_methods.py": ("dflash", "pard", "eagle3_dynamic"),
}


#: Suite modules measuring the active profile's engine modes (`[engines.NAME]`): collected where it defines one.
ENGINE_SUITES = ("test_engines.py",)


#: Suite modules collected only when asked for: named on the command line (pytest never ignores a path it is given),
#: or by a `-m` expression naming their marker, so the CPU quickstart's `pytest suites/` does not grow.
OPT_IN: dict[str, str] = {"test_soak.py": "soak"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "soak: holds one server for many runs and gates its drift within the session "
                                       "(opt-in: pytest suites/ -m soak, or pytest suites/test_soak.py)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    marker = OPT_IN.get(collection_path.name)
    if marker is not None:
        import re

        return not re.search(rf"\b{marker}\b", config.option.markexpr or "") or None
    needs = PRESETS.get(collection_path.name)
    if needs is None and collection_path.name not in ENGINE_SUITES:
        return None
    from pytest_specdec.errors import SpecDecError
    from pytest_specdec.plugin import session_key

    try:
        profile = config.stash[session_key].profile
    except SpecDecError:  # collected after all: the plugin names the profile's problem at collection
        return None
    if needs is None:
        return not profile.engines
    return not set(needs) <= set(profile.methods)
