"""The temperature > 0 distribution check's statistic on synthetic data (tests/sims/distribution.py, the model
of scripts/distribution_simulation.py); its client against the simulated server is
tests/functional/test_distribution_client.py, and through the plugin tests/functional/test_distribution_session.py."""

from __future__ import annotations

import json
import random

import pytest
from sims.distribution import arms

from pytest_specdec.measure.lossless import (
    Collected,
    Sample,
    compare,
    min_prompts,
)


@pytest.mark.slow
@pytest.mark.parametrize("n_prompts", [8, 16])
def test_a_sound_sampler_is_rarely_called_shifted(n_prompts: int) -> None:
    # 200 simulated sessions with no shift at alpha 0.01: the signed-rank test over (prompt, sample) pairs
    # holds its level (measured: 2000 sessions at 8 prompts × 4 samples 1.2 % shifted, 1000 at 16 0.9 %).
    rng = random.Random(1)
    verdicts = [compare(*arms(rng, n_prompts, 0.0))["verdict"] for _ in range(200)]
    assert verdicts.count("shifted") <= 6  # P(more than 6 of 200 | a true rate of 1 %) < 0.5 %
    assert verdicts.count("inconclusive") <= 1


@pytest.mark.slow
def test_a_shifted_sampler_is_found() -> None:
    # A 0.3-nat shift (the fake server's sampler_bias=0.2 shifts its samples ~0.3 nats) at 16 prompts × 4
    # samples (measured: 397/400 shifted); at 8 prompts 329/400, at 8 prompts and 0.15 nats 86/400.
    rng = random.Random(1)
    found = [compare(*arms(rng, 16, 0.3))["verdict"] for _ in range(200)]
    assert found.count("shifted") >= 180
    d = compare(*arms(random.Random(3), 16, -0.5))
    assert d["verdict"] == "shifted" and d["diff"] < 0 and d["ci"][1] < 0 and d["p"] < 0.01
    assert d["n_prompts"] == 16 and d["n_samples"] == {"spec": 64, "reference_a": 64, "reference_b": 64}
    json.dumps(d)


def test_a_shift_within_the_tolerance_is_the_same() -> None:
    d = compare(*arms(random.Random(3), 32, 0.03, noise=0.01))
    assert d["p"] < 0.01 and abs(d["diff"]) < 0.05 and d["verdict"] == "same"


def test_too_few_prompts_or_a_drifting_control_is_inconclusive() -> None:
    assert min_prompts(0.01) == 8 and min_prompts(0.05) == 6  # the exact test's smallest p is 2 / 2^n
    spec, ref_a, ref_b = arms(random.Random(4), 7, 1.0, samples=1)
    d = compare(spec, ref_a, ref_b, alpha=0.01)
    assert d["verdict"] == "inconclusive" and d["p"] is None
    assert "7 (prompt, sample) pair(s)" in d["why"] and "at least 8" in d["why"]
    # A prompt without scored samples in one arm is left out of the pairing.
    spec, ref_a, ref_b = arms(random.Random(4), 9, 1.0)
    ref_b["p0"] = []
    assert compare(spec, ref_a, ref_b)["n_prompts"] == 8
    # The reference disagrees with itself as much as with the spec arm: nothing to blame on the sampler.
    spec, ref_a, ref_b = arms(random.Random(4), 16, 1.0)
    ref_b = {p: [x + 1.0 for x in v] for p, v in ref_b.items()}
    d = compare(spec, ref_a, ref_b)
    assert d["verdict"] == "inconclusive" and d["p"] < 0.01 and d["control_p"] < 0.01
    assert "not reproducible" in d["why"]
    # Identical arms: no evidence at all (scipy would divide by zero).
    same = {f"p{i}": [-2.0] for i in range(8)}
    assert compare(same, same, same, alpha=0.01)["p"] == 1.0


def test_empty_outputs_are_counted_not_averaged() -> None:
    def s(pid: str, out: list[int], lps: list[float]) -> Sample:
        return Sample(pid, [1, 2], out, lps)

    by_arm = {arm: [s(f"p{i}", [3, 4], [-1.0, -2.0]) for i in range(8)] + [s("p0", [], [])]
              for arm in ("spec", "reference_a", "reference_b")}
    d = Collected(by_arm, samples_per_prompt=2, prompts=8).summary(alpha=0.01)
    assert d["empty_samples"] == {"spec": 1, "reference_a": 1, "reference_b": 1}
    assert d["n_samples"]["spec"] == 8 and d["mean_logprob"]["spec"] == -1.5
    assert d["output_tokens"]["spec"] == 16
