"""The specdec marker: expansion, ids, validation errors that say what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.markers import expand, varying_fields
from pytest_specdec.profiles import Profile


@pytest.fixture
def profile() -> Profile:
    return Profile(
        name="test", path=Path("test.toml"), device="cpu", target="/m", tensor_parallel_size=1,
        server_args=(), server_env=(),
        methods={"ngram": {"method": "ngram", "prompt_lookup_max": 4}, "eagle3": {"method": "eagle3", "model": "/h"}},
        matrix={"k": [3]},
    )


def test_cross_product_ids_and_none_collapses(profile: Profile) -> None:
    cases = expand({"method": ["none", "eagle3"], "k": [2, 4], "temperature": 0.0, "concurrency": [1, 8]}, profile)
    ids = [c.id(varying_fields(cases)) for c in cases]
    assert ids == [
        "none-t0.0-c1", "none-t0.0-c8",
        "eagle3-k2-t0.0-c1", "eagle3-k2-t0.0-c8", "eagle3-k4-t0.0-c1", "eagle3-k4-t0.0-c8",
    ]


def test_varying_extra_fields_enter_the_id(profile: Profile) -> None:
    cases = expand({"method": "ngram", "max_tokens": [64, 128]}, profile)
    assert [c.id(varying_fields(cases)) for c in cases] == ["ngram-k3-t0.0-c1-m64", "ngram-k3-t0.0-c1-m128"]


def test_ignore_eos_is_a_field_and_enters_the_id(profile: Profile) -> None:
    cases = expand({"method": "ngram", "ignore_eos": [False, True]}, profile)
    assert [c.ignore_eos for c in cases] == [False, True]
    assert [c.id() for c in cases] == ["ngram-k3-t0.0-c1", "ngram-k3-t0.0-c1-noeos"]
    assert cases[1].params()["ignore_eos"] is True


def test_raw_speculative_config_passes_through(profile: Profile) -> None:
    (case,) = expand({"speculative_config": {"method": "suffix"}, "k": 5}, profile)
    assert case.method == "suffix" and case.k == 5
    assert case.speculative_config == {"method": "suffix", "num_speculative_tokens": 5}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "eagle3", "kk": 3}, "unknown key(s) kk; allowed: method, k, temperature"),
        ({"method": "medusa"}, "method 'medusa' is not a preset of profile 'test'; allowed: none, ngram, eagle3"),
        ({"method": "ngram", "k": 0}, "k must be a whole number >= 1, got 0"),
        ({"method": "ngram", "temperature": -0.5}, "temperature must be a number in [0, 2], got -0.5"),
        ({"method": "ngram", "concurrency": []}, "concurrency=[] is empty"),
        ({"temperature": 0.0}, "needs method= (one of none, ngram, eagle3) or speculative_config="),
        ({"speculative_config": {"k": 1}}, "must be a dict with a 'method' key"),
        ({"speculative_config": {"method": "eagle4"}},
         "speculative_config method 'eagle4' is not one vLLM knows; allowed: ngram, suffix, draft_model"),
        ({"method": "ngram", "ignore_eos": "yes"}, "ignore_eos must be True or False, got 'yes'"),
    ],
)
def test_bad_marker_values_name_what_is_allowed(profile: Profile, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        expand(kwargs, profile)
    assert message in str(info.value)


def test_profile_validity_defaults_to_the_rules_defaults(profile: Profile) -> None:
    assert profile.validity.max_loop_lag_mean_ms == 20.0
