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
#: active profile has them all, so `pytest suites/` on the cpu profile (no suffix, EAGLE, MTP, Medusa or MLP
#: speculator in its zoo) measures what it always did, and a GPU profile without room for a head skips its module.
PRESETS: dict[str, tuple[str, ...]] = {
    "test_gpu_methods.py": ("suffix", "eagle", "mtp", "medusa"),
    "test_mlp_speculator.py": ("mlp_speculator",),
}


#: Suite modules with synthetic prompts (`input_len`), made at collection with the target's tokenizer: collected where
#: it loads from local files. The cpu profile's zoo ships its own; a GPU box has its target's in the Hugging Face
#: cache once a server has downloaded it, so a dry run on a machine without it still lists the other suites.
TOKENIZER: tuple[str, ...] = ("test_load_shapes.py",)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.name in TOKENIZER:
        return not _target_tokenizer_here(config)
    needs = PRESETS.get(collection_path.name)
    if needs is None:
        return None
    from pytest_specdec.errors import SpecDecError
    from pytest_specdec.plugin import session_key

    try:
        methods = config.stash[session_key].profile.methods
    except SpecDecError:  # collected after all: the plugin names the profile's problem at collection
        return None
    return not set(needs) <= set(methods)


def _target_tokenizer_here(config: pytest.Config) -> bool:
    """Whether the active profile's target tokenizer loads here (a profile's problem: collected, so the plugin
    names it)."""
    from pytest_specdec.errors import SpecDecError
    from pytest_specdec.measure.tokens import load
    from pytest_specdec.plugin import session_key

    try:
        target = config.stash[session_key].profile.target
    except SpecDecError:
        return True
    return load(str(target)).hf is not None
