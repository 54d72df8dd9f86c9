"""--specdec-dataset through the plugin, against simulated servers (the loaders: tests/unit/test_datasets.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

# Two tests: one on the session's dataset (--specdec-dataset), one naming its own in the marker.
SUITE = {"name": "test_default_dataset", "concurrency": 2,
         "body": 'assert specdec.summary["acceptance_rate"] is not None'}
MARKER_SUITE = {"name": "test_marker_dataset", "concurrency": 2, "dataset": "builtin", "num_prompts": 3,
                "max_tokens": 8, "body": 'assert specdec.params["dataset"] == "builtin"'}

SHAREGPT = [
    {"id": "s1", "conversations": [{"from": "human", "value": "Name a prime."}, {"from": "gpt", "value": "7" * 40}]},
    {"id": "s2", "conversations": [{"from": "human", "value": "Name a colour."}, {"from": "gpt", "value": "r" * 80}]},
    {"id": "s3", "conversations": [{"from": "human", "value": "Describe rain."}, {"from": "gpt", "value": "w" * 400}]},
    {"id": "s4", "conversations": [{"from": "human", "value": "Unanswered question"}]},
    {"id": "s5", "conversations": []},
]


def test_specdec_dataset_reaches_the_measurement(
    pytester: pytest.Pytester, fake_endpoints: tuple[str, str], fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE) + make_suite(**MARKER_SUITE))
    (pytester.path / "data").mkdir()
    (pytester.path / "data" / "sg.json").write_text(json.dumps(SHAREGPT))
    session = specdec_session(pytester, fake_profile, fake_endpoints, "--specdec-dataset=data/sg.json",
                              "--update-baselines=missing", "-v")
    result = session.result
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "*specdec: dataset sg.json: 4 prompts (sharegpt, sha256 *); skipped 1 empty conversations; "
        "1 without a length got max_tokens=256; 3 lengths estimated from reference answers, counted by "
        "characters / 4 (the tokenizer of fake-model could not be loaded: no such folder, *)",
        "*specdec: dataset builtin: 128 prompts (prompts, *",
    ])
    data = session.results
    tests = {t["nodeid"].split("::")[1]: t for t in data["tests"]}
    default, marker = tests["test_default_dataset[ngram-k3-t0.0-c2]"], tests["test_marker_dataset[ngram-k3-t0.0-c2]"]
    assert default["params"]["dataset"] == str(pytester.path / "data" / "sg.json")
    for run in default["runs"] + default["reference_runs"]:
        # the fake server streams min(24, max_tokens): 16 (40-char reply, floored) + 20 + 24 + 24 (default 256)
        assert (run["n_requests"], run["total_output_tokens"]) == (4, 84)
    for run in marker["runs"]:
        assert (run["n_requests"], run["total_output_tokens"]) == (3, 24)  # the marker's dataset wins
    sg = data["datasets"][default["params"]["dataset"]]
    assert sg["format"] == "sharegpt" and sg["prompts"] == 4
    assert sg["skipped"] == {"empty conversations": 1}
    assert sg["output_lengths"]["estimated"] == 3 and sg["output_lengths"]["default"] == 1
    assert sg["output_lengths"]["counted"].startswith("characters / 4 (the tokenizer of fake-model could not")
    # the prompts sent, counted without a tokenizer: ceil(characters / 4) of the user turns, and said so
    assert sg["input_tokens"]["counted"] == sg["output_lengths"]["counted"]
    assert sg["input_tokens"]["by_category"] == {"": {
        "prompts": 4, "input_tokens_mean": 4.2, "input_tokens_min": 4, "input_tokens_max": 5, "max_tokens_max": 256}}
    baseline = json.loads(Path(default["baseline"]["path"]).read_text())
    assert baseline["comparability"]["dataset"] == {"name": "sg.json", "format": "sharegpt",
                                                    "prompts_sha256": sg["prompts_sha256"],
                                                    "output_lengths_counted": "characters / 4"}


def test_other_dataset_content_makes_the_baseline_not_comparable(
    pytester: pytest.Pytester, fake_endpoints: tuple[str, str], fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    path = pytester.path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    first = specdec_session(pytester, fake_profile, fake_endpoints, f"--specdec-dataset={path}",
                            "--update-baselines=missing").result
    first.assert_outcomes(passed=1)
    changed = [dict(SHAREGPT[0], conversations=[{"from": "human", "value": "Name a large prime."},
                                                {"from": "gpt", "value": "7" * 40}]), *SHAREGPT[1:]]
    path.write_text(json.dumps(changed))  # same file name, other content
    session = specdec_session(pytester, fake_profile, fake_endpoints, f"--specdec-dataset={path}")
    second = session.result
    second.assert_outcomes(passed=1, warnings=1)
    second.stdout.fnmatch_lines(["*measured under different conditions (not-comparable)*",
                                    "*dataset.prompts_sha256: '*' → '*'"])
    test = session.results["tests"][0]
    assert test["baseline"]["status"] == "not-comparable"
    assert list(test["baseline"]["not_comparable_fields"]) == ["dataset.prompts_sha256"]


def test_specdec_dataset_errors_early(pytester: pytest.Pytester, fake_profile: Path,
                                      make_suite: Callable[..., str]) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE) + make_suite(**MARKER_SUITE))
    missing = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dataset=nope.json")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*--specdec-dataset 'nope.json': no such file (*nope.json)*"])
    bad = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dataset=x.json#")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--specdec-dataset*expected #CATEGORY*"])


def test_help_lists_the_dataset_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--specdec-dataset=[[]FORMAT:[]]PATH[[]#CATEGORY,...[]]*", "*Default: 'builtin'"])
