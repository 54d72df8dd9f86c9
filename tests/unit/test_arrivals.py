"""Open-loop arrivals as vllm bench serve schedules them: the gamma shape shows in the intervals' CV."""

from __future__ import annotations

import itertools
import math

import pytest

from pytest_specdec.measure.arrivals import arrival_times


def cv(times: list[float]) -> float:
    """Coefficient of variation of the inter-arrival times (the first from 0)."""
    gaps = [b - a for a, b in itertools.pairwise([0.0, *times])]
    mean = sum(gaps) / len(gaps)
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1))
    return sd / mean


def cv_se(shape: float, n: int) -> float:
    """The sample CV's standard error for gamma intervals (delta method over mean and variance, with the
    gamma's central moments mu3 = 2k, mu4 = 3k^2 + 6k at scale 1): sqrt((1 + 1/k) / (2 k n))."""
    return math.sqrt((1 + 1 / shape) / (2 * shape * n))


@pytest.mark.parametrize("shape", [0.5, 1.0, 4.0])
def test_interval_cv_is_one_over_sqrt_shape(shape: float) -> None:
    n = 20_000
    times = arrival_times(n, rate=10.0, burstiness=shape, seed=3)
    assert abs(cv(times) - 1 / math.sqrt(shape)) < 4 * cv_se(shape, n)


def test_rescaled_to_n_over_rate_and_seeded() -> None:
    times = arrival_times(50, rate=5.0, burstiness=0.5, seed=1)
    assert times[-1] == pytest.approx(50 / 5.0) and times == sorted(times) and times[0] > 0
    assert arrival_times(50, 5.0, 0.5, 1) == times != arrival_times(50, 5.0, 0.5, 2)
    assert arrival_times(4, 2.0, math.inf, 0) == pytest.approx([0.5, 1.0, 1.5, 2.0])  # constant 1/rate


@pytest.mark.parametrize(("n", "rate", "shape", "word"), [(0, 1.0, 1.0, "n >= 1"), (3, 0.0, 1.0, "rate"),
                                                         (3, math.inf, 1.0, "rate"), (3, 1.0, 0.0, "burstiness")])
def test_bad_input_named(n: int, rate: float, shape: float, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        arrival_times(n, rate, shape, 0)
