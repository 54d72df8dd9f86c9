"""The temperature > 0 distribution check end to end through pytester, against simulated servers whose toy model
scores every sample (the statistic: tests/unit/test_distribution.py; the client:
tests/functional/test_distribution_client.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import FakeServer

# One test at temperature 1.0 that runs the check and wants `same`; verdicts off (no baseline needed).
SUITE = {"name": "test_sampler", "temperature": 1.0, "concurrency": 2, "num_prompts": 12, "max_tokens": 16,
         "verdicts": "check=False", "body": 'd = specdec.assert_same_distribution()\nassert d["verdict"] == "same"'}


@pytest.fixture
def endpoints(request: pytest.FixtureRequest, fake_server: Callable[..., FakeServer]) -> tuple[str, str]:
    """(spec URL, reference URL) with the spec server's sampler biased by the test's parameter."""
    bias = getattr(request, "param", 0.0)
    spec = fake_server(k=3, acceptance=(0.8, 0.6, 0.4), output_tokens=16, sampler_bias=bias)
    return spec.base_url, fake_server(output_tokens=16).base_url


def test_a_sound_sampler_passes_and_the_check_is_in_the_json(
    pytester: pytest.Pytester, endpoints: tuple[str, str], fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    session = specdec_session(pytester, fake_profile, endpoints, "-v")
    result = session.result
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*distribution same: mean log-prob per token spec -* vs reference -*, p *"])
    d = session.test["distribution"]
    assert d["verdict"] == "same" and d["n_prompts"] == 12 and d["samples_per_prompt"] == 4
    assert d["n_samples"] == {"spec": 48, "reference_a": 48, "reference_b": 48}
    assert d["empty_samples"] == {"spec": 0, "reference_a": 0, "reference_b": 0}


@pytest.mark.parametrize("endpoints", [0.4], indirect=True)
def test_a_biased_sampler_fails_with_the_statistic(
    pytester: pytest.Pytester, endpoints: tuple[str, str], fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    session = specdec_session(pytester, fake_profile, endpoints)
    result = session.result
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*specdec distribution check failed for *test_sampler?ngram-k3-t1.0-c2?: at temperature 1.0 the target's "
        "mean log-prob per token is -* nats for the spec server's samples and -* for the reference server's "
        "(12 prompts, 48 and 48 scored samples, all scored by the reference server): difference +0.* nats, 90% CI "
        "+0.* .. +0.*, Wilcoxon p=* < 0.001 and beyond ±0.05; two reference samples differ by * nats (p=*). The spec "
        "server does not sample from the target's distribution: the rejection sampler is likely broken*",
    ])
    test = session.test
    assert test["outcome"] == "failed" and test["distribution"]["verdict"] == "shifted"


def test_temperature_0_points_at_assert_lossless(
    pytester: pytest.Pytester, endpoints: tuple[str, str], fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**{**SUITE, "temperature": 0.0}))
    result = specdec_session(pytester, fake_profile, endpoints).result
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ConfigError: specdec.distribution_check() compares sampling distributions at "
                                 "temperature > 0, but *test_sampler?ngram-k3-t0.0-c2? runs at temperature 0, *"
                                 "use specdec.assert_lossless()*"])
