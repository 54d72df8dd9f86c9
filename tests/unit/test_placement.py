"""Placement.check_possible: what the profile and the dataset make impossible, caught at collection."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.measure.types import Prompt
from pytest_specdec.profiles import load_profile
from pytest_specdec.profiles.placement import Placement

PROFILE = """
name = "small"
[target]
model = "m"
[server]
args = ["--max-model-len", "256"]
[methods.ngram]
speculative_config = { method = "ngram", prompt_lookup_max = 4 }
"""


def _placement(tmp_path: Path, endpoint: bool = False) -> Placement:
    path = tmp_path / "small.toml"
    path.write_text(PROFILE)
    return Placement(load_profile(str(path)), endpoint, 2, None, 3, "127.0.0.1")


def _prompt(id: str, max_tokens: int) -> Prompt:
    return Prompt(id=id, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens)


def test_a_records_own_max_tokens_must_leave_room_for_the_prompt(tmp_path: Path) -> None:
    """Without the marker's max_tokens each record asks for its own: one at or above --max-model-len is
    an error naming the dataset, the record and the two ways out, not a run of failed requests."""
    records = [_prompt("a", 100), _prompt("long", 256), _prompt("b", 200)]
    placement = _placement(tmp_path)
    with pytest.raises(ConfigError, match=r"dataset 'sg\.json': prompt 'long' asks for max_tokens=256, which leaves "
                                          r"no room for the prompt: profile 'small' serves with --max-model-len 256; "
                                          r"lower it below 256 in the file, or set max_tokens in the marker"):
        placement.check_possible("sg.json", 3, None, None, records)
    placement.check_possible("sg.json", 3, None, 64, records)  # the marker's max_tokens replaces the records'
    placement.check_possible("sg.json", 2, None, None, records[::2])
    _placement(tmp_path, endpoint=True).check_possible("sg.json", 3, None, None, records)  # its own limit


def test_synthetic_lengths_must_fit_the_model_length(tmp_path: Path) -> None:
    placement = _placement(tmp_path)  # --max-model-len 256
    placement.check_possible("random", 1, None, None, lengths=(200, 56, 0.0))
    with pytest.raises(ConfigError, match=r"input_len=200 \+ output_len=57 .* --max-model-len 256; lower input_len"):
        placement.check_possible("random", 1, None, None, lengths=(200, 57, 0.0))
    with pytest.raises(ConfigError, match=r"up to 240 \+ 60 with range_ratio 0.2"):
        placement.check_possible("random", 1, None, None, lengths=(200, 50, 0.2))  # the longest draw counts
    _placement(tmp_path, endpoint=True).check_possible("random", 1, None, None, lengths=(200, 57, 0.0))


def test_counted_input_tokens_and_max_tokens_must_fit_the_model_length(tmp_path: Path) -> None:
    """With the prompts' input tokens counted by the target's tokenizer, input + max_tokens above
    --max-model-len is an error naming the prompt, both numbers and the room left; uncounted (None), only
    max_tokens is judged, as before."""
    import dataclasses

    placement = _placement(tmp_path)
    fits = [dataclasses.replace(_prompt("a", 100), input_tokens=156), _prompt("b", 200)]
    placement.check_possible("builtin", 2, None, None, fits)  # 156 + 100 = 256: exactly the limit
    over = [*fits, dataclasses.replace(_prompt("long", 100), input_tokens=157)]
    with pytest.raises(ConfigError, match=r"dataset 'builtin': prompt 'long' has 157 input tokens \(counted by the "
                                          r"target's tokenizer\) and asks for max_tokens=100, 257 in all, above the "
                                          r"--max-model-len 256 profile 'small' serves with; lower its max_tokens in "
                                          r"the file, or set max_tokens in the marker to at most 99"):
        placement.check_possible("builtin", 3, None, None, over)
    with pytest.raises(ConfigError, match=r"prompt 'long' has 157 input tokens .* asks for max_tokens=120, 277 in "
                                          r"all, .*; lower max_tokens in the marker to at most 99"):
        placement.check_possible("builtin", 3, None, 120, over)  # the marker's max_tokens is what is asked
    placement.check_possible("builtin", 3, None, 99, over)
    uncounted = [dataclasses.replace(p, input_tokens=None) for p in over]
    placement.check_possible("builtin", 3, None, None, uncounted)
    _placement(tmp_path, endpoint=True).check_possible("builtin", 3, None, None, over)  # its own limit
